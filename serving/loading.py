"""Engine choice: load the best engine a version ships for this host, verified and warmed.

Preference: a TensorRT plan built for this host's GPU when tensorrt and CUDA are present (plans
are filed beside the version, not in its manifest: serving/tensorrt_engine.py, tried first by
`load_model`); otherwise ONNX Runtime on the optimised fp32 graph (`ort-fp32`, the CUDA
provider first when ONNX Runtime has it), then `ort-int8`. This module is the policy; the
engines themselves are in serving/engine.py (ONNX Runtime) and serving/tensorrt_engine.py, and
it imports both so that neither imports the other's chooser.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from model_store import ModelStore
from relay.errors import ServingError
from relay.types import EngineRecord, VersionManifest
from serving.engine import Engine, LoadedModel, OrtEngine, fetch_engine_file, warmed
from serving.tensorrt_engine import load_local_plan

ORT_PREFERENCE = ("ort-fp32", "ort-int8")


@dataclass(frozen=True)
class HostCapabilities:
    """What ONNX Runtime can use on this host."""

    ort_providers: tuple[str, ...]

    @property
    def ort_cuda(self) -> bool:
        return "CUDAExecutionProvider" in self.ort_providers


def detect_capabilities() -> HostCapabilities:
    return HostCapabilities(tuple(ort.get_available_providers()))


def choose_engine(manifest: VersionManifest, host: HostCapabilities) -> EngineRecord:
    """The ONNX Runtime engine this host should run. Raises ServingError if there is none."""
    by_name = {e.name: e for e in manifest.engines}
    for name in ORT_PREFERENCE:
        if name in by_name:
            return by_name[name]
    raise ServingError(
        f"version {manifest.version} has no engine this host can run: it ships "
        f"{[e.name for e in manifest.engines] or 'none'}, this host runs "
        f"{', '.join(ORT_PREFERENCE)} ({', '.join(host.ort_providers)})"
    )


def load_model(
    store: ModelStore,
    manifest: VersionManifest,
    ref: str,
    cache_dir: Path,
    *,
    threads: int,
    max_batch_rows: int,
) -> LoadedModel:
    """Load the version's best engine for this host and warm it. Raises ServingError/StoreError."""
    # A plan built for this host's GPU, filed beside the version after it was published, wins
    # when there is one (None on hosts without tensorrt + CUDA, without a plan, or when the plan
    # fails to load: then ONNX Runtime below).
    planned = load_local_plan(store, manifest, ref, cache_dir, max_batch_rows=max_batch_rows)
    if planned is not None:
        return planned
    host = detect_capabilities()
    record = choose_engine(manifest, host)
    path = fetch_engine_file(store, record, cache_dir)
    providers = ["CUDAExecutionProvider"] if host.ort_cuda else []
    engine: Engine = OrtEngine(record.name, path, threads, [*providers, "CPUExecutionProvider"])
    return warmed(engine, manifest, record, ref, max_batch_rows)

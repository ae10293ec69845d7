"""Engines: pick the best engine a version ships for this host, fetch it verified, warm it, run it.

Preference: a TensorRT plan (`trt-*`) when tensorrt imports and CUDA is present; otherwise
ONNX Runtime on the optimised fp32 graph (`ort-fp32`, the CUDA provider first when ONNX Runtime
has it), then `ort-int8`. Every engine file comes from the content-addressed store and is
hashed again when reused from the local cache, so a worker never runs bytes the manifest did
not name.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from model_store import ModelStore
from model_store.hashing import sha256_file
from relay.errors import ServingError
from relay.features import CATEGORICAL, DENSE
from relay.types import EngineRecord, VersionManifest
from serving.schema import RAW_INDEX, RAW_ORDER, model_input

log = logging.getLogger("serving.engine")

ORT_PREFERENCE = ("ort-fp32", "ort-int8")
WARMUP_ROWS = (1, 20, 256)


class Engine(Protocol):
    """Scores float32 (n, 27) model input; one call at a time (the batcher's thread)."""

    name: str

    def run(self, x: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HostCapabilities:
    """What this host can run."""

    ort_providers: tuple[str, ...]
    tensorrt: bool  # tensorrt importable and a CUDA device present

    @property
    def ort_cuda(self) -> bool:
        return "CUDAExecutionProvider" in self.ort_providers


def detect_capabilities(*, want_tensorrt: bool) -> HostCapabilities:
    """Probe the host; TensorRT (and the torch import it needs) only when a plan is on offer."""
    tensorrt = False
    if want_tensorrt and importlib.util.find_spec("tensorrt") is not None:
        try:
            import torch

            tensorrt = bool(torch.cuda.is_available())
        except ImportError:
            tensorrt = False
    return HostCapabilities(tuple(ort.get_available_providers()), tensorrt)


def choose_engine(manifest: VersionManifest, host: HostCapabilities) -> EngineRecord:
    """The engine record this host should run. Raises ServingError if there is none it can run."""
    by_name = {e.name: e for e in manifest.engines}
    if host.tensorrt:
        for engine in manifest.engines:
            if engine.name.startswith("trt-"):
                return engine
    for name in ORT_PREFERENCE:
        if name in by_name:
            return by_name[name]
    raise ServingError(
        f"version {manifest.version} has no engine this host can run: it ships "
        f"{[e.name for e in manifest.engines] or 'none'}, this host runs "
        f"{'TensorRT, ' if host.tensorrt else ''}{', '.join(ORT_PREFERENCE)}"
    )


def ort_session_options(threads: int) -> ort.SessionOptions:
    """Serving options for ONNX Runtime, each chosen on purpose (see comments)."""
    opts = ort.SessionOptions()
    # Batches are small (tens to a few thousand rows of 27 floats): one thread per engine is
    # faster than a pool's hand-offs, and leaves the other cores to the event loop.
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # the graph is a chain
    # The fp32 engine was optimised offline at a portable level; ENABLE_ALL adds the layout
    # passes specific to this host's CPU, once, at load.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The arena reuses buffers across runs; memory patterns are planned per input shape, and
    # batch shapes change with load, so a plan would rarely be reused.
    opts.enable_cpu_mem_arena = True
    opts.enable_mem_pattern = False
    # Spinning pool threads would burn the core the event loop needs between batches.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


class OrtEngine:
    """ONNX Runtime session over one engine file."""

    def __init__(self, name: str, path: Path, threads: int, providers: list[str]) -> None:
        self.name = name
        self.providers = providers
        self._session: ort.InferenceSession | None = ort.InferenceSession(
            str(path), ort_session_options(threads), providers=providers
        )
        self._input = self._session.get_inputs()[0].name
        self._outputs = [self._session.get_outputs()[0].name]

    def run(self, x: np.ndarray) -> np.ndarray:
        if self._session is None:
            raise ServingError(f"engine {self.name} was unloaded")
        return self._session.run(self._outputs, {self._input: x})[0]

    def close(self) -> None:
        self._session = None  # the session's memory goes with its last reference


class TensorRtEngine:
    """A TensorRT plan (built on this GPU model) run through torch CUDA buffers on one stream."""

    def __init__(self, name: str, path: Path) -> None:
        import tensorrt as trt
        import torch

        self.name = name
        self._torch = torch
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self._engine is None:
            raise ServingError(f"TensorRT could not deserialise {path}: built for another GPU?")
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        if len(inputs) != 1 or len(outputs) != 1:
            raise ServingError(f"TensorRT plan {path} has inputs {inputs} and outputs {outputs}")
        self._input, self._output = inputs[0], outputs[0]
        self._context = self._engine.create_execution_context()
        self._stream = torch.cuda.Stream()

    def run(self, x: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.cuda.stream(self._stream):  # copies and the plan share one ordered stream
            device_in = torch.from_numpy(x).to("cuda", non_blocking=True)
            device_out = torch.empty((x.shape[0],), dtype=torch.float32, device="cuda")
            self._context.set_input_shape(self._input, tuple(x.shape))
            self._context.set_tensor_address(self._input, device_in.data_ptr())
            self._context.set_tensor_address(self._output, device_out.data_ptr())
            if not self._context.execute_async_v3(self._stream.cuda_stream):
                raise ServingError(f"TensorRT engine {self.name} failed on a batch of {len(x)}")
            host_out = device_out.to("cpu")
        self._stream.synchronize()
        return host_out.numpy()

    def close(self) -> None:
        self._context = None
        self._engine = None


@dataclass
class LoadedModel:
    """A version whose engine is loaded, verified and warmed: ready to take traffic."""

    version: str
    lineage_id: str
    engine: Engine
    engine_record: EngineRecord
    ref: str  # what the operator asked for: a version or an alias
    warmup_ms: float
    loaded_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "lineage_id": self.lineage_id,
            "engine": self.engine.name,
            "engine_sha256": self.engine_record.blob.sha256,
            "ref": self.ref,
            "warmup_ms": round(self.warmup_ms, 3),
            "loaded_at": self.loaded_at.isoformat(),
        }


def fetch_engine_file(store: ModelStore, record: EngineRecord, cache_dir: Path) -> Path:
    """The engine's bytes on local disk, hash-verified whether fetched now or found cached."""
    dest = cache_dir / f"{record.blob.sha256}.{record.name}"
    if dest.exists():
        digest, _ = sha256_file(dest)
        if digest == record.blob.sha256:
            return dest
        log.warning("cached engine %s is corrupt (sha256 %s); fetching it again", dest, digest)
        dest.unlink()
    return store.fetch_blob(record.blob, dest)


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
    # TensorRT hook: a plan built for this host's GPU, filed beside the version after it was
    # published, wins when there is one (serving/tensorrt_engine.py; None on hosts without
    # tensorrt + CUDA, without a plan, or when the plan fails to load: then ONNX Runtime below).
    from serving.tensorrt_engine import load_local_plan  # here: that module imports this one

    planned = load_local_plan(store, manifest, ref, cache_dir, max_batch_rows=max_batch_rows)
    if planned is not None:
        return planned
    host = detect_capabilities(
        want_tensorrt=any(e.name.startswith("trt-") for e in manifest.engines)
    )
    record = choose_engine(manifest, host)
    path = fetch_engine_file(store, record, cache_dir)
    engine: Engine
    if record.name.startswith("trt-"):
        engine = TensorRtEngine(record.name, path)
    else:
        providers = (
            ["CUDAExecutionProvider", "CPUExecutionProvider"]
            if host.ort_cuda
            else ["CPUExecutionProvider"]
        )
        engine = OrtEngine(record.name, path, threads, providers)
    started = time.perf_counter()
    try:
        warm_up(engine, max_batch_rows)
    except Exception:
        engine.close()
        raise
    return LoadedModel(
        version=manifest.version,
        lineage_id=manifest.lineage_id,
        engine=engine,
        engine_record=record,
        ref=ref,
        warmup_ms=(time.perf_counter() - started) * 1000,
    )


def warm_up(engine: Engine, max_batch_rows: int) -> None:
    """Run the engine at the batch sizes traffic brings; refuse one whose output is unusable."""
    for rows in sorted({*(r for r in WARMUP_ROWS if r < max_batch_rows), max_batch_rows}):
        x = model_input(synthetic_rows(rows))
        scores = engine.run(x)
        if scores.shape != (rows,) or not np.isfinite(scores).all():
            raise ServingError(
                f"engine {engine.name} failed warm-up on {rows} rows: output shape "
                f"{scores.shape}, finite={bool(np.isfinite(scores).all())}"
            )


def synthetic_rows(n: int, seed: int = 0) -> np.ndarray:
    """Plausible raw rows (float64, columns in RAW_ORDER) for warm-up and benchmarks."""
    rng = np.random.default_rng(seed)
    raw = np.empty((n, len(RAW_ORDER)), dtype=np.float64)
    for spec in CATEGORICAL:
        raw[:, RAW_INDEX[spec.name]] = rng.integers(0, spec.buckets, n)
    for dspec in DENSE:
        raw[:, RAW_INDEX[dspec.name]] = rng.uniform(
            dspec.low, min(dspec.high, dspec.low + 100.0), n
        )
    return raw

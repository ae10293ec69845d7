"""Engines: the ONNX Runtime engine, fetching an engine file verified, warming an engine up.

Every engine file comes from the content-addressed store and is hashed again when reused from
the local cache, so a worker never runs bytes the manifest did not name. Which engine a host
runs is decided in serving/loading.py; the TensorRT plan engine is serving/tensorrt_engine.py.
"""

from __future__ import annotations

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

WARMUP_ROWS = (1, 20, 256)


class Engine(Protocol):
    """Scores float32 (n, 27) model input; one call at a time (the batcher's thread)."""

    name: str

    def run(self, x: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


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


def warmed(
    engine: Engine,
    manifest: VersionManifest,
    record: EngineRecord,
    ref: str,
    max_batch_rows: int,
) -> LoadedModel:
    """Warm an engine up and wrap it as a loaded model; closes it and re-raises if warm-up fails."""
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

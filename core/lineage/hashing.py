"""The four-part lineage id: what the model is, what it learned from, where, and how it was built.

model  sha256 of the exported ONNX bytes
data   training-window content + feature-pipeline code + events schema
env    Python + key package versions (+ CUDA and GPU compute capability when present)
build  compiled engine bytes + compile options

Pure hashing over files and frames; the Prefect shell is `tasks.lineage.compute_lineage`.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from logstore.events import EVENT_COLUMNS
from logstore.schema import MIGRATIONS
from model_store.hashing import sha256_files
from relay.features import pipeline_source
from relay.types import LineageId


class EngineFile(Protocol):
    """A compiled engine as hashing sees it (tasks.compilation.CompiledEngine is one)."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def options(self) -> dict[str, Any]: ...


ENV_PACKAGES = ("torch", "onnx", "onnxruntime", "numpy", "pandas", "tensorrt")


def _json_digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def hash_frame(frame: pd.DataFrame, columns: tuple[str, ...] = EVENT_COLUMNS) -> str:
    """sha256 of a window's content, column by column in a fixed order (no whole-frame copy)."""
    digest = hashlib.sha256()
    digest.update(f"rows={len(frame)}".encode())
    for name in columns:
        digest.update(name.encode())
        values = frame[name].to_numpy()
        if values.dtype == object or values.dtype.kind in "OUT":
            digest.update("\x1f".join(map(str, values)).encode())
        else:
            digest.update(np.ascontiguousarray(values).view(np.uint8).data)
    return digest.hexdigest()


def schema_fingerprint() -> str:
    """The events schema as the migrations define it."""
    return _json_digest([[m.version, m.name, list(m.statements)] for m in MIGRATIONS])


def data_hash(frame_digest: str, pipeline_digest: str, schema_digest: str) -> str:
    return _json_digest(
        {"window": frame_digest, "pipeline": pipeline_digest, "schema": schema_digest}
    )


def environment() -> dict[str, Any]:
    """Python, platform, key package versions, and the GPU when one is visible."""
    packages: dict[str, str | None] = {}
    for name in ENV_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "packages": packages,
    }
    try:
        import torch

        if torch.cuda.is_available():
            env["cuda"] = torch.version.cuda
            env["gpu"] = torch.cuda.get_device_name(0)
            env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    except ImportError:
        pass
    return env


def build_hash(engine_digests: dict[str, str], options: dict[str, Any]) -> str:
    return _json_digest({"engines": engine_digests, "options": options})


@dataclass(frozen=True)
class LineageRecord:
    """The id and where each part came from (kept in the manifest)."""

    lineage: LineageId
    sources: dict[str, Any]


def compute_lineage_record(
    model_path: Path, frame: pd.DataFrame, engines: Sequence[EngineFile], window: str
) -> LineageRecord:
    """Hash every part; files stream in parallel threads, never read whole."""
    files = [model_path, pipeline_source(), *(e.path for e in engines)]
    digests = sha256_files(files)
    frame_digest = hash_frame(frame)
    pipeline_digest = digests[pipeline_source()][0]
    schema_digest = schema_fingerprint()
    env = environment()
    engine_digests = {e.name: digests[e.path][0] for e in engines}
    options = {e.name: e.options for e in engines}
    lineage = LineageId(
        model=digests[model_path][0],
        data=data_hash(frame_digest, pipeline_digest, schema_digest),
        env=_json_digest(env),
        build=build_hash(engine_digests, options),
    )
    sources = {
        "model": {"onnx_sha256": digests[model_path][0]},
        "data": {
            "window": window,
            "rows": len(frame),
            "window_sha256": frame_digest,
            "feature_pipeline_sha256": pipeline_digest,
            "schema_sha256": schema_digest,
        },
        "env": env,
        "build": {"engines": engine_digests, "options": options},
    }
    return LineageRecord(lineage=lineage, sources=sources)

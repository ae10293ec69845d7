"""Engines: which one a host runs, verified fetches, warm-up, and scores equal to the compile step's."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relay.errors import IntegrityError, ServingError
from relay.types import BlobRef, EngineRecord, LineageId, VersionManifest
from serving.engine import (
    HostCapabilities,
    choose_engine,
    fetch_engine_file,
    load_model,
    ort_session_options,
    warm_up,
)

CPU = HostCapabilities(("CPUExecutionProvider",), tensorrt=False)
GPU = HostCapabilities(("CUDAExecutionProvider", "CPUExecutionProvider"), tensorrt=True)


def manifest_with(*names: str) -> VersionManifest:
    lineage = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)
    return VersionManifest(
        version="v1",
        created_at=datetime.now(UTC),
        lineage=lineage,
        lineage_id=str(lineage),
        engines=[EngineRecord(name=n, blob=BlobRef(sha256=n * 8, size=1)) for n in names],
    )


def test_tensorrt_plan_wins_only_where_tensorrt_and_cuda_exist() -> None:
    both = manifest_with("ort-int8", "trt-fp16", "ort-fp32")
    assert choose_engine(both, GPU).name == "trt-fp16"
    assert choose_engine(both, CPU).name == "ort-fp32"


def test_fp32_is_preferred_to_int8_and_int8_serves_when_alone() -> None:
    assert choose_engine(manifest_with("ort-int8", "ort-fp32"), CPU).name == "ort-fp32"
    assert choose_engine(manifest_with("ort-int8"), CPU).name == "ort-int8"


def test_a_version_with_nothing_this_host_runs_is_refused_with_what_it_ships() -> None:
    with pytest.raises(ServingError, match=r"trt-fp16"):
        choose_engine(manifest_with("trt-fp16"), CPU)


def test_session_options_are_set_deliberately() -> None:
    import onnxruntime as ort

    opts = ort_session_options(2)
    assert opts.intra_op_num_threads == 2 and opts.inter_op_num_threads == 1
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert opts.enable_cpu_mem_arena and not opts.enable_mem_pattern
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_loaded_engine_scores_like_the_compile_steps_reference(
    published_version: Any, tmp_path: Path
) -> None:
    from tasks.compilation import run_engine

    manifest = published_version.manifest
    model = load_model(
        published_version.store, manifest, "ref", tmp_path, threads=1, max_batch_rows=256
    )
    assert model.version == manifest.version and model.lineage_id == manifest.lineage_id
    assert model.engine.name == "ort-fp32" and model.warmup_ms > 0
    x = published_version.holdout_x[:500]
    expected = run_engine(published_version.workdir / "ort-fp32.onnx", x)
    np.testing.assert_array_equal(model.engine.run(x), expected)
    model.engine.close()
    with pytest.raises(ServingError, match="unloaded"):
        model.engine.run(x)


def test_a_corrupted_cached_engine_is_fetched_again(published_version: Any, tmp_path: Path) -> None:
    record = next(e for e in published_version.manifest.engines if e.name == "ort-fp32")
    path = fetch_engine_file(published_version.store, record, tmp_path)
    good = path.read_bytes()
    path.write_bytes(b"not an onnx model")
    again = fetch_engine_file(published_version.store, record, tmp_path)
    assert again.read_bytes() == good


def test_a_blob_whose_bytes_do_not_match_its_hash_is_never_loaded(
    published_version: Any, tmp_path: Path
) -> None:
    from model_store import ModelStore
    from model_store.local import LocalBackend
    from model_store.store import blob_key

    root = tmp_path / "store"
    shutil.copytree(published_version.store.backend.root, root)
    record = next(e for e in published_version.manifest.engines if e.name == "ort-fp32")
    blob = root / blob_key(record.blob.sha256)
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError):
        fetch_engine_file(ModelStore(LocalBackend(root)), record, cache)
    assert not [p for p in cache.iterdir() if not p.name.startswith(".")]


class NanEngine:
    name = "nan"

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.full(len(x), np.nan, dtype=np.float32)

    def close(self) -> None:
        pass


def test_warm_up_refuses_an_engine_whose_output_is_not_finite() -> None:
    with pytest.raises(ServingError, match="warm-up"):
        warm_up(NanEngine(), 64)

"""Engines on a real published version: scores equal the compile step's, fetches are verified."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relay.errors import IntegrityError, ServingError
from serving.engine import fetch_engine_file
from serving.loading import load_model


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

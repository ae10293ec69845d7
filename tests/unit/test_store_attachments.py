"""Attachments on the local backend: where they live, and the blessing records filed through them.

The API's rules on both backends are in tests/integration/test_store_attachments.py.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from core.calibration.assessment import CalibrationThresholds, assess_calibration
from model_store import ModelStore
from model_store.attachments import attachment_key, is_attachment_key
from model_store.calibration import (
    CalibrationReport,
    current_calibration_set,
    fix_calibration_set,
    load_report,
    save_report,
)
from model_store.local import LocalBackend
from relay.errors import StoreError
from relay.types import BlobRef, LineageId, VersionManifest
from tasks.tensorrt import calibration_ref


def _store(tmp_path: Path, *versions: str) -> ModelStore:
    store = ModelStore(LocalBackend(tmp_path / "store"))
    lineage = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)
    for version in versions:
        store.publish(
            VersionManifest(
                version=version,
                created_at=datetime.now(UTC),
                lineage=lineage,
                lineage_id=str(lineage),
            )
        )
    return store


def _blob(store: ModelStore, tmp_path: Path, name: str) -> BlobRef:
    path = tmp_path / name
    path.write_bytes(f"bytes of {name}".encode() * 100)
    return store.put_blob(path)


def _report(version: str, calibration_set: BlobRef, seed: int) -> CalibrationReport:
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.2, 2_000)
    labels = (rng.random(2_000) < scores).astype(int)
    return assess_calibration(
        version, labels, scores, None, None, calibration_set, CalibrationThresholds()
    )


def test_attachments_live_beside_their_version_or_the_store():
    assert attachment_key("v1", "calibration", "report") == (
        "versions/v1/attachments/calibration/report.json"
    )
    assert attachment_key(None, "calibration-set", "current") == (
        "attachments/calibration-set/current.json"
    )
    assert is_attachment_key("versions/v1/attachments/tensorrt-plan/l4-sm89-trt10.13.json")
    assert is_attachment_key("attachments/impact-report/r1.json")
    assert not is_attachment_key("versions/v1/manifest.json")
    assert not is_attachment_key("versions/v1/calibration.json")  # the layout before attachments


def test_an_attachment_named_manifest_is_not_a_version(tmp_path):
    store = _store(tmp_path, "v1")
    store.put_attachment("v1", "notes", "manifest", b"not a manifest")
    assert store.list_versions() == ["v1"]
    assert store.gc(now=datetime.now(UTC) + timedelta(hours=2)).deleted == []


def test_a_blessing_is_stored_once_and_the_first_assessment_stands(tmp_path):
    store = _store(tmp_path, "v1")
    calibration_set = _blob(store, tmp_path, "calibration.parquet")
    assert load_report(store, "v1") is None  # never assessed
    first = save_report(store, _report("v1", calibration_set, seed=1))
    assert load_report(store, "v1") == first
    assert save_report(store, first) == first  # a retried save is a no-op
    rival = _report("v1", calibration_set, seed=2)  # a concurrent run, other figures
    assert rival != first
    assert save_report(store, rival) == first
    assert load_report(store, "v1") == first


def test_a_broken_candidates_report_with_nan_and_inf_reads_back(tmp_path):
    # The report worth reading most is the one of a candidate that scores NaN or inf: it must
    # load again (JSON has no NaN, and null reads back as no float at all).
    store = _store(tmp_path, "v1")
    calibration_set = _blob(store, tmp_path, "calibration.parquet")
    labels = np.array([0, 1] * 500)
    scores = np.full(1_000, np.nan)
    broken = assess_calibration(
        "v1", labels, scores, None, None, calibration_set, CalibrationThresholds()
    )
    assert not broken.blessed and not broken.candidate.finite
    broken = broken.model_copy(
        update={
            "checks": [
                *broken.checks,
                broken.checks[0].model_copy(
                    update={"measurements": {"ratio": float("inf"), "low": float("-inf")}}
                ),
            ]
        }
    )
    save_report(store, broken)
    again = load_report(store, "v1")
    assert again is not None and not again.blessed
    assert math.isnan(again.candidate.auc) and math.isnan(again.candidate.mean_score)
    assert again.checks[-1].measurements == {"ratio": float("inf"), "low": float("-inf")}


def test_gc_keeps_the_calibration_set_a_blessing_names(tmp_path):
    store = _store(tmp_path, "v1")
    calibration_set = _blob(store, tmp_path, "calibration.parquet")
    save_report(store, _report("v1", calibration_set, seed=1))
    assert store.gc(now=datetime.now(UTC) + timedelta(hours=2)).deleted == []
    store.fetch_blob(calibration_set, tmp_path / "check.parquet")


def test_the_first_calibration_set_fixed_is_the_one_every_release_uses(tmp_path):
    store = _store(tmp_path)
    assert current_calibration_set(store) is None
    first = _blob(store, tmp_path, "first.parquet")
    second = _blob(store, tmp_path, "second.parquet")
    assert fix_calibration_set(store, first) == first
    assert fix_calibration_set(store, second) == first  # a concurrent first release lost
    assert current_calibration_set(store) == first
    deleted = store.gc(now=datetime.now(UTC) + timedelta(hours=2)).deleted
    assert second.sha256 in deleted and first.sha256 not in deleted  # and the loser's record


def test_a_plan_is_scored_on_the_set_its_version_was_blessed_on_else_the_current_one(tmp_path):
    store = _store(tmp_path, "v1", "v2")
    with pytest.raises(StoreError, match="no calibration set for v1"):
        calibration_ref(store, "v1")
    blessed_on = _blob(store, tmp_path, "old.parquet")
    current = _blob(store, tmp_path, "current.parquet")
    save_report(store, _report("v1", blessed_on, seed=1))
    fix_calibration_set(store, current)
    assert calibration_ref(store, "v1") == blessed_on
    assert calibration_ref(store, "v2") == current


def test_a_record_filed_before_attachments_is_named_not_misread(tmp_path):
    store = _store(tmp_path, "v1")
    key = attachment_key("v1", "impact-report", "r0")
    store.backend.put_bytes(key, json.dumps({"report_id": "r0", "blobs": {}}).encode())
    with pytest.raises(StoreError, match=f"{key} is not an attachment envelope"):
        store.list_attachments("v1", "impact-report")

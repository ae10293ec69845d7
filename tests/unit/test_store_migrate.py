"""`migrate_records`: a store written before attachments existed gets its blessings back, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from core.calibration.assessment import CalibrationThresholds, assess_calibration
from core.impact.storage import list_impact_reports
from model_store import ModelStore
from model_store.attachments import attachment_key
from model_store.calibration import CalibrationReport, current_calibration_set, load_report
from model_store.impact_records import REPORT_KIND as IMPACT_KIND
from model_store.impact_records import ImpactFinding, ImpactWindow, StoredImpactReport
from model_store.local import LocalBackend
from model_store.migrate import migrate_records
from model_store.plans import PLAN_KIND, PlanRecord, list_plan_records, load_plan_record
from relay.gpu import GpuTarget
from relay.types import BlobRef, EngineRecord, LineageId, VersionManifest

ROOT = Path(__file__).resolve().parents[2]
GPU = GpuTarget(name="NVIDIA L4", compute_capability="8.9", tensorrt="10.13.3.9")


def _store(root: Path, *versions: str) -> ModelStore:
    store = ModelStore(LocalBackend(root))
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


def _report(version: str, calibration_set: BlobRef) -> CalibrationReport:
    rng = np.random.default_rng(1)
    scores = rng.uniform(0.01, 0.2, 2_000)
    labels = (rng.random(2_000) < scores).astype(int)
    return assess_calibration(
        version, labels, scores, None, None, calibration_set, CalibrationThresholds()
    )


def _impact(store: ModelStore, tmp_path: Path, report_id: str, version: str | None, key: str):
    blobs = {
        "report.html": _blob(store, tmp_path, f"{report_id}.html"),
        "report.json": _blob(store, tmp_path, f"{report_id}.json"),
    }
    now = datetime(2026, 11, 8, tzinfo=UTC)
    return StoredImpactReport(
        report_id=report_id,
        created_at=now,
        attached_to=version,
        record_key=key,
        window=ImpactWindow(start=now - timedelta(days=1), end=now),
        versions=["v1"],
        finding=ImpactFinding.no_detectable_effect,
        headline="nothing to see",
        blobs=blobs,
        html_url=store.locate_blob(blobs["report.html"]),
        json_url=store.locate_blob(blobs["report.json"]),
    )


def _old_layout_store(root: Path, tmp_path: Path) -> tuple[ModelStore, dict[str, object]]:
    """Every kind of record at the key the code before attachments wrote it, with its bytes."""
    store = _store(root, "v1")
    put = store.backend.put_bytes
    calibration_set = _blob(store, tmp_path, "calibration.parquet")
    report = _report("v1", calibration_set)
    put("versions/v1/calibration.json", report.model_dump_json(indent=2).encode())
    put("calibration/current.json", calibration_set.model_dump_json().encode())
    plan = PlanRecord(
        version="v1",
        gpu=GPU,
        accepted=True,
        reason="within tolerance",
        engine=EngineRecord(name="trt-fp16", blob=_blob(store, tmp_path, "plan.engine")),
        parity=None,
        build_hash="e" * 64,
    )
    put(f"versions/v1/tensorrt/{GPU.key}.json", plan.model_dump_json(indent=2).encode())
    same_key = attachment_key("v1", IMPACT_KIND, "r1")  # the old key is the new envelope's
    of_version = _impact(store, tmp_path, "r1", "v1", same_key)
    put(same_key, of_version.model_dump_json(indent=2).encode())
    of_store = _impact(store, tmp_path, "r2", None, "reports/impact/r2.json")
    put("reports/impact/r2.json", of_store.model_dump_json(indent=2).encode())
    return store, {
        "report": report,
        "set": calibration_set,
        "plan": plan,
        "r1": of_version,
        "r2": of_store,
    }


def test_an_old_store_is_migrated_once_and_everything_is_found(tmp_path):
    store, old = _old_layout_store(tmp_path / "store", tmp_path)
    assert load_report(store, "v1") is None  # before: the blessing is lost

    first = migrate_records(store)
    assert {k: (c.migrated, c.already_done) for k, c in first.kinds.items()} == {
        "calibration": (1, 0),
        "calibration-set": (1, 0),
        PLAN_KIND: (1, 0),
        IMPACT_KIND: (2, 0),
    }
    assert first.unreadable == []
    assert first.converted_in_place == [attachment_key("v1", IMPACT_KIND, "r1")]

    second = migrate_records(store)
    assert {k: (c.migrated, c.already_done) for k, c in second.kinds.items()} == {
        "calibration": (0, 1),
        "calibration-set": (0, 1),
        PLAN_KIND: (0, 1),
        IMPACT_KIND: (0, 2),
    }
    assert second.unreadable == []

    assert load_report(store, "v1") == old["report"]
    assert current_calibration_set(store) == old["set"]
    assert load_plan_record(store, "v1", GPU.key) == old["plan"]
    assert list_plan_records(store, "v1") == [old["plan"]]
    assert list_impact_reports(store, "v1") == [old["r1"]]
    r2 = old["r2"]
    assert isinstance(r2, StoredImpactReport)
    new_key = attachment_key(None, IMPACT_KIND, "r2")
    assert list_impact_reports(store) == [r2.model_copy(update={"record_key": new_key})]

    # The bytes are what the new writers store, and the old objects are all still there.
    assert store.get_attachment("v1", "calibration", "report") == store.backend.get_bytes(
        "versions/v1/calibration.json"
    )
    for key in (
        "versions/v1/calibration.json",
        "calibration/current.json",
        "reports/impact/r2.json",
    ):
        assert store.backend.exists(key)
    assert store.backend.exists(f"versions/v1/tensorrt/{GPU.key}.json")
    # gc keeps every blob the records name.
    assert store.gc(now=datetime.now(UTC) + timedelta(hours=2)).deleted == []


def test_an_unreadable_old_record_is_named_and_the_rest_migrated(tmp_path):
    store, _ = _old_layout_store(tmp_path / "store", tmp_path)
    store.backend.put_bytes("versions/v1/tensorrt/broken.json", b"{not json")
    report = migrate_records(store)
    assert [item.split(":")[0] for item in report.unreadable] == [
        "versions/v1/tensorrt/broken.json"
    ]
    assert report.kinds[PLAN_KIND].migrated == 1
    assert load_report(store, "v1") is not None


# One process for all three runs: the command imports Prefect when it runs (seconds, once).
PROBE = """
import json, sys
from model_store import open_store
from relay.settings import get_settings
from relay_cli.main import main
codes = [main(["store", "migrate"]), main(["store", "migrate"])]
print("--- corrupted ---", flush=True)
store = open_store(get_settings())
store.backend.put_bytes("calibration/current.json", b'{"no": "ref"}')
store.backend.delete("attachments/calibration-set/current.json")
codes.append(main(["store", "migrate"]))
print(json.dumps(codes))
"""


def test_relay_store_migrate_prints_counts_and_exits_2_on_unreadable_records(tmp_path):
    _old_layout_store(tmp_path / "store", tmp_path)
    env = {
        **os.environ,
        "RELAY_HOME": str(tmp_path),
        "RELAY_MODEL_STORE_URL": f"file://{tmp_path / 'store'}",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [0, 0, 2], done.stderr
    first, second = done.stdout.split("--- corrupted ---")[0].split("migrate of ")[1:]
    assert "calibration: 1 migrated, 0 already done, 0 unreadable" in first
    assert "impact-report: 2 migrated" in first
    assert "tensorrt-plan: 0 migrated, 1 already done" in second
    assert "unreadable: calibration/current.json" in done.stderr
    assert "relay: store migrate: 1 records could not be migrated" in done.stderr

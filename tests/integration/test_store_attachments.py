"""The attachments API's rules, run against both backends (local directory and S3 on a real
server): named records beside a version or the store, write-once, hash-checked, kept by gc."""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from model_store import ModelStore
from model_store.attachments import AttachmentExists, attachment_key
from model_store.store import blob_key
from relay.errors import BlobMissing, IntegrityError, StoreError, VersionNotFound
from relay.types import BlobRef
from tests.integration.store_testbed import publishable, write_random

pytest_plugins = ("tests.integration.store_fixtures",)

LATER = {"now": datetime.now(UTC) + timedelta(hours=2)}  # every fresh blob is an old one then


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def v1(store: ModelStore, tmp_path: Path) -> str:
    return store.publish(publishable(store, tmp_path, "v1")).version


def test_an_attachment_comes_back_verified_and_lists_by_name(store: ModelStore, v1: str):
    for gpu in ("l4", "h200"):
        store.put_attachment(v1, "tensorrt-plan", gpu, f"plan record for {gpu}".encode())
    store.put_attachment(v1, "calibration", "report", b"the blessing")

    assert store.get_attachment(v1, "tensorrt-plan", "h200") == b"plan record for h200"
    listed = store.list_attachments(v1, "tensorrt-plan")
    assert [a.name for a in listed] == ["h200", "l4"]  # by name, one kind only
    assert [store.read_attachment(a) for a in listed] == [
        b"plan record for h200",
        b"plan record for l4",
    ]
    assert listed[0].key == attachment_key(v1, "tensorrt-plan", "h200")
    assert listed[0].content == BlobRef(sha256=_sha(b"plan record for h200"), size=20)
    assert store.list_versions() == [v1]  # attachments do not read as versions


def test_nothing_filed_reads_as_none_and_lists_empty(store: ModelStore, v1: str):
    assert store.get_attachment(v1, "calibration", "report") is None
    assert store.find_attachment("never-published", "calibration", "report") is None
    assert store.list_attachments(v1, "impact-report") == []
    assert store.list_attachments(None, "impact-report") == []


def test_store_attachments_and_version_attachments_are_apart(store: ModelStore, v1: str):
    store.put_attachment(None, "impact-report", "r1", b"unattached")
    store.put_attachment(v1, "impact-report", "r2", b"of v1")
    assert [a.name for a in store.list_attachments(None, "impact-report")] == ["r1"]
    assert [a.name for a in store.list_attachments(v1, "impact-report")] == ["r2"]
    assert store.get_attachment(None, "impact-report", "r2") is None


def test_filing_the_same_content_again_is_a_no_op(store: ModelStore, v1: str, tmp_path: Path):
    plan = store.put_blob(write_random(tmp_path / "h200.plan", 3_000))
    first = store.put_attachment(v1, "tensorrt-plan", "h200", b"record", blobs={"plan": plan})
    again = store.put_attachment(v1, "tensorrt-plan", "h200", b"record", blobs={"plan": plan})
    assert again == first
    assert store.get_attachment(v1, "tensorrt-plan", "h200") == b"record"


def test_other_content_under_a_filed_name_is_refused_naming_both_hashes(store: ModelStore, v1: str):
    store.put_attachment(v1, "calibration", "report", b"first assessment")
    with pytest.raises(AttachmentExists) as caught:
        store.put_attachment(v1, "calibration", "report", b"second assessment")
    message = str(caught.value)
    assert "calibration/report of version v1" in message
    assert _sha(b"first assessment") in message and _sha(b"second assessment") in message
    assert isinstance(caught.value, StoreError)
    assert store.read_attachment(caught.value.existing) == b"first assessment"  # first one stands
    assert store.get_attachment(v1, "calibration", "report") == b"first assessment"


def test_the_same_content_with_other_blobs_is_refused_too(
    store: ModelStore, v1: str, tmp_path: Path
):
    one = store.put_blob(write_random(tmp_path / "one.bin", 1_000))
    two = store.put_blob(write_random(tmp_path / "two.bin", 1_000))
    store.put_attachment(v1, "tensorrt-plan", "l4", b"record", blobs={"plan": one})
    with pytest.raises(AttachmentExists, match=f"plan={one.sha256}.*plan={two.sha256}"):
        store.put_attachment(v1, "tensorrt-plan", "l4", b"record", blobs={"plan": two})


def test_racing_writers_of_one_name_leave_exactly_one_winner(store: ModelStore, v1: str):
    outcomes: list[bytes | str] = []

    def write(n: int) -> None:
        try:
            store.put_attachment(v1, "calibration", "report", f"writer {n}".encode())
            outcomes.append(f"writer {n}".encode())
        except AttachmentExists:
            outcomes.append("refused")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o != "refused"]
    assert len(outcomes) == 6 and len(winners) == 1
    assert store.get_attachment(v1, "calibration", "report") == winners[0]


def test_tampered_content_is_an_error_naming_the_attachment_and_both_hashes(
    store: ModelStore, v1: str
):
    filed = store.put_attachment(v1, "calibration", "report", b"blessed: true")
    store.backend.put_bytes(blob_key(filed.content.sha256), b"blessed: TRUE")
    with pytest.raises(IntegrityError) as caught:
        store.get_attachment(v1, "calibration", "report")
    message = str(caught.value)
    assert "calibration/report of version v1" in message
    assert blob_key(filed.content.sha256) in message  # the object, where it lives
    assert filed.content.sha256 in message and _sha(b"blessed: TRUE") in message


def test_a_missing_content_blob_is_blob_missing(store: ModelStore, v1: str):
    filed = store.put_attachment(None, "calibration-set", "current", b"pointer")
    store.backend.delete(blob_key(filed.content.sha256))
    with pytest.raises(BlobMissing, match="calibration-set/current of the store"):
        store.get_attachment(None, "calibration-set", "current")


def test_never_filed_beside_a_missing_version_or_naming_a_missing_blob(store: ModelStore, v1: str):
    with pytest.raises(VersionNotFound, match="no-such"):
        store.put_attachment("no-such", "calibration", "report", b"x")
    ghost = BlobRef(sha256="0" * 64, size=10)
    with pytest.raises(BlobMissing, match="0" * 64):
        store.put_attachment(v1, "tensorrt-plan", "l4", b"x", blobs={"plan": ghost})
    assert store.find_attachment(v1, "tensorrt-plan", "l4") is None
    with pytest.raises(ValueError, match="invalid attachment name"):
        store.put_attachment(v1, "tensorrt-plan", "../manifest", b"x")


def test_gc_keeps_the_blobs_an_attachment_references_and_its_content(
    store: ModelStore, v1: str, tmp_path: Path
):
    plan = store.put_blob(write_random(tmp_path / "h200.plan", 4_000))
    calibration_set = store.put_blob(write_random(tmp_path / "calibration.parquet", 5_000))
    orphan = store.put_blob(write_random(tmp_path / "orphan.bin", 6_000))
    on_version = store.put_attachment(v1, "tensorrt-plan", "h200", b"plan", blobs={"plan": plan})
    on_store = store.put_attachment(
        None, "calibration-set", "current", b"set", blobs={"calibration-set": calibration_set}
    )

    report = store.gc(**LATER)
    assert report.deleted == [orphan.sha256]
    for ref in (plan, calibration_set):
        store.fetch_blob(ref, tmp_path / "check" / ref.sha256)  # still there, still valid
    assert store.read_attachment(on_version) == b"plan"
    assert store.read_attachment(on_store) == b"set"


def test_gc_refuses_to_run_when_an_attachment_is_unreadable(store: ModelStore, v1: str):
    store.backend.put_bytes(attachment_key(v1, "calibration", "report"), b"{not json")
    with pytest.raises(StoreError, match="record .*calibration/report.json.* unreadable"):
        store.gc(**LATER)

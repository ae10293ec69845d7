"""The model-store contract, run against both backends (local directory and S3 on a real server)
so they cannot drift apart."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from model_store import ModelStore
from model_store.store import blob_key, lease_key, manifest_key
from relay.errors import BlobMissing, IntegrityError, StoreError, VersionExists, VersionNotFound
from relay.types import BlobRef
from tests.integration.store_testbed import (
    fresh_bucket,
    lineage_for,
    publishable,
    s3_settings,
    write_random,
)

pytest_plugins = ("tests.integration.store_fixtures",)

MIB = 1024 * 1024


def test_fresh_store_has_no_versions_or_aliases(store: ModelStore):
    assert store.list_versions() == []
    assert store.alias_history("champion") == []
    assert store.get_alias("champion") is None
    with pytest.raises(VersionNotFound, match="no version 'nope'"):
        store.get_manifest("nope")


def test_blob_is_stored_once_under_its_hash_and_comes_back_verified(
    store: ModelStore, tmp_path: Path
):
    path = write_random(tmp_path / "model.onnx", 300_000)
    first = store.put_blob(path)
    again = store.put_blob(path)
    assert (
        first
        == again
        == BlobRef(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), size=300_000)
    )
    assert store.backend.list_keys("blobs/") == [blob_key(first.sha256)]
    out = store.fetch_blob(first, tmp_path / "out" / "model.onnx")
    assert out.read_bytes() == path.read_bytes()


# Runs in a child process: the test S3 server lives in this one, and its memory would count.
_MEASURE_STREAMING = """
import json, sys, tracemalloc
from pathlib import Path
from model_store import open_store
from relay.settings import get_settings
store = open_store(get_settings())
path = Path(sys.argv[1])
tracemalloc.start()
ref = store.put_blob(path)
put_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.reset_peak()
store.fetch_blob(ref, path.with_suffix(".back"))
get_peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"size": ref.size, "put_peak": put_peak, "get_peak": get_peak}))
"""


@pytest.mark.slow  # 64 MiB through a child process per backend
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_large_blob_streams_in_parts_without_holding_it_in_memory(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
):
    size = 64 * MIB  # S3 parts are 5 MiB in these settings: thirteen parts
    path = write_random(tmp_path / "big.onnx", size)
    if backend == "local":
        env = {"RELAY_MODEL_STORE_URL": f"file://{tmp_path / 'store'}"}
    else:
        settings = s3_settings(request.getfixturevalue("moto_endpoint"), fresh_bucket())
        env = {
            "RELAY_MODEL_STORE_URL": settings.model_store_url,
            "RELAY_S3_ENDPOINT": settings.s3_endpoint,
            "RELAY_S3_ACCESS_KEY": settings.s3_access_key.get_secret_value(),
            "RELAY_S3_SECRET_KEY": settings.s3_secret_key.get_secret_value(),
            "RELAY_S3_PART_SIZE_MB": str(settings.s3_part_size_mb),
        }
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE_STREAMING, str(path)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["size"] == size
    assert path.with_suffix(".back").read_bytes() == path.read_bytes()
    # Bounded by parts in flight (S3: ~5 x 5 MiB up, ~5 x 4 MiB down), never the whole file.
    assert figures["put_peak"] < size / 2, f"put held {figures['put_peak'] / MIB:.0f} MiB"
    assert figures["get_peak"] < size / 2, f"get held {figures['get_peak'] / MIB:.0f} MiB"


def test_corrupted_blob_is_refused_naming_object_expected_and_actual_hash(
    store: ModelStore, tmp_path: Path
):
    ref = store.put_blob(write_random(tmp_path / "model.onnx", 50_000))
    store.backend.put_bytes(blob_key(ref.sha256), b"tampered bytes")
    actual = hashlib.sha256(b"tampered bytes").hexdigest()
    with pytest.raises(IntegrityError) as caught:
        store.fetch_blob(ref, tmp_path / "out" / "model.onnx")
    message = str(caught.value)
    assert blob_key(ref.sha256) in message
    assert f"expected sha256 {ref.sha256}" in message
    assert f"got {actual}" in message
    assert not (tmp_path / "out" / "model.onnx").exists()
    assert list((tmp_path / "out").iterdir()) == []  # no temp file left behind


def test_missing_blob_is_blob_missing(store: ModelStore, tmp_path: Path):
    ref = BlobRef(sha256="ab" * 32, size=3)
    with pytest.raises(BlobMissing, match=ref.sha256):
        store.fetch_blob(ref, tmp_path / "x")


def test_manifest_is_refused_until_every_blob_is_stored(store: ModelStore, tmp_path: Path):
    manifest = publishable(store, tmp_path)
    manifest.blobs["engine.plan"] = BlobRef(sha256="cd" * 32, size=10)
    with pytest.raises(BlobMissing, match="cannot publish"):
        store.publish(manifest)
    assert store.list_versions() == []


def test_blob_with_the_wrong_size_is_not_confirmed(store: ModelStore, tmp_path: Path):
    manifest = publishable(store, tmp_path)
    ref = manifest.blobs["model.onnx"]
    store.backend.put_bytes(blob_key(ref.sha256), b"short")
    with pytest.raises(IntegrityError, match=f"holds 5 bytes, expected {ref.size}"):
        store.publish(manifest)
    assert store.list_versions() == []
    # Putting the real file again repairs the damaged object (same address, right size).
    store.put_blob(tmp_path / "v1-model.onnx")
    assert store.publish(manifest).version == manifest.version


def test_version_is_write_once_and_same_lineage_republishes(store: ModelStore, tmp_path: Path):
    manifest = publishable(store, tmp_path, "v1")
    assert store.publish(manifest) == manifest
    assert store.publish(manifest.model_copy(update={"metrics": {"x": 1.0}})) == manifest
    different = publishable(store, tmp_path, "v1", seed="other")
    with pytest.raises(VersionExists, match="already exists with lineage"):
        store.publish(different)
    assert store.get_manifest("v1") == manifest
    assert store.list_versions() == ["v1"]


def test_racing_publishers_one_wins_the_rest_are_told_it_exists(store: ModelStore, tmp_path: Path):
    writers = 6
    manifests = [publishable(store, tmp_path / f"w{i}", "v1", seed=f"w{i}") for i in range(writers)]
    barrier = threading.Barrier(writers)
    won: list[int] = []
    refused: list[int] = []

    def publish(i: int) -> None:
        barrier.wait()
        try:
            store.publish(manifests[i])
            won.append(i)
        except VersionExists:
            refused.append(i)

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and sorted(won + refused) == list(range(writers))
    assert store.get_manifest("v1") == manifests[won[0]]  # the winner's, whole


def test_racing_publishers_of_identical_content_all_get_the_same_version(
    store: ModelStore, tmp_path: Path
):
    base = publishable(store, tmp_path, "v1")
    copies = [base.model_copy(update={"created_at": datetime.now(UTC)}) for _ in range(5)]
    barrier = threading.Barrier(len(copies))
    results = []

    def publish(manifest):
        barrier.wait()
        results.append(store.publish(manifest))

    threads = [threading.Thread(target=publish, args=(m,)) for m in copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = store.get_manifest("v1")
    assert len(results) == 5 and all(r == stored for r in results)


def test_readers_during_a_publish_see_no_version_or_the_whole_one(
    store: ModelStore, tmp_path: Path
):
    manifest = publishable(store, tmp_path, "v1")
    # A manifest big enough that a torn write would be visible.
    manifest.params = {f"p{i}": "x" * 200 for i in range(500)}
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                got = store.get_manifest("v1")
            except VersionNotFound:
                seen.append("absent")
                continue
            seen.append("whole" if got == manifest else "OTHER")

    readers = [threading.Thread(target=read) for _ in range(2)]
    for r in readers:
        r.start()
    store.publish(manifest)
    while seen.count("whole") < 3:
        pass
    stop.set()
    for r in readers:
        r.join()
    assert set(seen) <= {"absent", "whole"} and "OTHER" not in seen


def test_alias_history_says_who_moved_it_when_and_why(store: ModelStore, tmp_path: Path):
    v1 = store.publish(publishable(store, tmp_path, "v1", seed="a")).version
    v2 = store.publish(publishable(store, tmp_path, "v2", seed="b")).version
    store.set_alias("champion", v1, actor="alice", reason="first blessed release")
    store.set_alias("champion", v2, actor="release-flow", reason="canary passed")
    store.set_alias("champion", v1, actor="bob", reason="rollback: p95 regression")
    history = store.alias_history("champion")
    assert [(e.version, e.previous, e.actor, e.reason) for e in history] == [
        ("v1", None, "alice", "first blessed release"),
        ("v2", "v1", "release-flow", "canary passed"),
        ("v1", "v2", "bob", "rollback: p95 regression"),
    ]
    assert store.alias_at("champion", history[0].at - timedelta(seconds=1)) is None
    assert store.alias_at("champion", history[1].at) == "v2"
    assert store.alias_at("champion", history[2].at + timedelta(days=1)) == "v1"
    assert store.resolve("champion").version == "v1"
    assert store.current_aliases() == {"champion": "v1"}
    store.set_alias("champion", None, actor="bob", reason="retired")
    assert store.current_aliases() == {}
    with pytest.raises(VersionNotFound, match="cleared"):
        store.resolve("champion")


def test_alias_cannot_point_at_a_missing_version(store: ModelStore):
    with pytest.raises(VersionNotFound):
        store.set_alias("champion", "ghost", actor="a", reason="b")
    assert store.alias_history("champion") == []


def test_racing_alias_moves_are_all_kept_as_one_unbroken_chain(store: ModelStore, tmp_path: Path):
    versions = [
        store.publish(publishable(store, tmp_path, f"v{i}", seed=f"s{i}")).version for i in range(4)
    ]
    barrier = threading.Barrier(len(versions))

    def move(version: str) -> None:
        barrier.wait()
        store.set_alias("champion", version, actor=f"mover-{version}", reason="race")

    threads = [threading.Thread(target=move, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    history = store.alias_history("champion")
    assert sorted(e.version for e in history) == sorted(versions)
    assert [e.previous for e in history] == [None] + [e.version for e in history[:-1]]


def test_gc_deletes_orphans_and_never_a_referenced_blob(store: ModelStore, tmp_path: Path):
    manifest = store.publish(publishable(store, tmp_path, "v1"))
    orphan = store.put_blob(write_random(tmp_path / "orphan.bin", 10_000))
    later = datetime.now(UTC) + timedelta(hours=2)

    # Fresh orphans are spared: a writer may be about to publish them.
    report = store.gc()
    assert report.deleted == [] and report.spared_recent == [orphan.sha256]
    assert report.referenced == 2

    preview = store.gc(now=later, dry_run=True)
    assert preview.deleted == [orphan.sha256] and store.backend.exists(blob_key(orphan.sha256))

    report = store.gc(now=later)
    assert report.deleted == [orphan.sha256] and report.freed_bytes == 10_000
    assert not store.backend.exists(blob_key(orphan.sha256))
    assert not store.backend.exists(lease_key(orphan.sha256))
    for ref in manifest.blobs.values():
        store.fetch_blob(ref, tmp_path / "check" / ref.sha256)  # still there, still valid


def test_gc_spares_an_old_orphan_that_a_writer_just_reused(store: ModelStore, tmp_path: Path):
    path = write_random(tmp_path / "reused.bin", 4096)
    ref = store.put_blob(path)
    time.sleep(1.1)  # S3 dates have one-second resolution: make the reuse clearly later
    store.put_blob(path)  # deduplicated: nothing uploaded, but the lease is renewed
    blob = store.backend.stat(blob_key(ref.sha256))
    (lease,) = store.backend.list_objects(lease_key(ref.sha256))
    assert blob is not None and blob.modified < lease.modified
    # At a cutoff between the two, the blob alone would be an old orphan; the lease saves it.
    at_cutoff = {"now": lease.modified + timedelta(hours=1), "min_age": timedelta(hours=1)}
    report = store.gc(**at_cutoff)
    assert report.deleted == [] and report.spared_recent == [ref.sha256]
    store.backend.delete(lease_key(ref.sha256))
    assert store.gc(**at_cutoff, dry_run=True).deleted == [ref.sha256]


def test_gc_refuses_to_run_when_a_manifest_is_unreadable(store: ModelStore, tmp_path: Path):
    store.publish(publishable(store, tmp_path, "v1"))
    orphan = store.put_blob(write_random(tmp_path / "orphan.bin", 1000))
    store.backend.put_bytes(manifest_key("v2"), b"{not json")
    with pytest.raises(StoreError, match="manifest of v2 .* unreadable"):
        store.gc(now=datetime.now(UTC) + timedelta(hours=2))
    assert store.backend.exists(blob_key(orphan.sha256))


def test_lineage_parts_survive_the_round_trip(store: ModelStore, tmp_path: Path):
    lineage = lineage_for("x", env="e" * 64)
    manifest = publishable(
        store, tmp_path, "v1", lineage=lineage, sources={"env": {"python": "3.11.9"}}
    )
    store.publish(manifest)
    got = store.resolve("v1")
    assert got.lineage == lineage and got.lineage_sources == {"env": {"python": "3.11.9"}}


def test_create_if_absent_write_refuses_other_bytes_and_accepts_its_own_again(store: ModelStore):
    # A writer whose request landed but whose answer was lost retries with the same bytes.
    assert store.backend.put_bytes("versions/v9/manifest.json", b"mine", exclusive=True)
    assert store.backend.put_bytes("versions/v9/manifest.json", b"mine", exclusive=True)
    assert not store.backend.put_bytes("versions/v9/manifest.json", b"theirs", exclusive=True)
    assert store.backend.get_bytes("versions/v9/manifest.json") == b"mine"


def test_gc_keeps_blobs_that_records_beside_versions_reference(store: ModelStore, tmp_path: Path):
    store.publish(publishable(store, tmp_path, "v1"))
    calibration_set = store.put_blob(write_random(tmp_path / "calibration.parquet", 5_000))
    report_html = store.put_blob(write_random(tmp_path / "report.html", 6_000))
    store.backend.put_bytes("calibration/current.json", calibration_set.model_dump_json().encode())
    store.backend.put_bytes(
        "versions/v1/attachments/impact-report/r1.json",
        json.dumps({"blobs": {"html": report_html.model_dump()}}).encode(),
    )
    report = store.gc(now=datetime.now(UTC) + timedelta(hours=2))
    assert report.deleted == []
    for ref in (calibration_set, report_html):
        store.fetch_blob(ref, tmp_path / "check" / ref.sha256)

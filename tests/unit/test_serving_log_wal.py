"""The request log's write-ahead file: a row is on its way to disk before its answer leaves, a torn
last record is dropped, and every complete record is logged exactly once across crashes."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import uuid
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from logstore import wal
from logstore.spool import (
    INGESTING_SUFFIX,
    INSERTING_SUFFIX,
    LogRow,
    RequestLogWriter,
    SpoolWriter,
    decode_rows,
    ingest_spool,
    read_segment,
    recover_wals,
    write_segment,
)
from logstore.wal import WalFile
from tests.unit.test_serving_spool import FakeServer, count, rows


def encode_row(row: LogRow) -> bytes:
    """One record as the writer lays it out: length, CRC-32, the row as JSON."""
    payload = orjson.dumps(row)
    return wal.HEADER.pack(len(payload), zlib.crc32(payload)) + payload


@pytest.fixture
def clickhouse(settings: Any) -> Any:
    import logstore

    return logstore.connect(settings.resolved_clickhouse_dsn)


def dead_wal(directory: Path, name: str, records: list[bytes]) -> Path:
    """A write-ahead file whose writer died after writing `records` (the rest still zeroed)."""
    path = directory / name
    data = b"".join(records)
    path.write_bytes(data + bytes(4096 - len(data) % 4096))
    return path


def wal_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ".wal" in p.name and not p.name.startswith("."))


def test_append_returns_with_the_row_already_in_the_write_ahead_file(tmp_path: Path) -> None:
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w1"), connect_server=None, flush_s=3600, batch_rows=100
    )
    logged = rows(3, "ahead")
    for row in logged:
        writer.append(row)
    (path,) = wal_files(tmp_path)  # read through the file system, as a recoverer would
    data = path.read_bytes()
    assert len(data) == wal.CAPACITY  # reserved up front: a full disk fails at creation
    assert decode_rows(data) == (logged, 0)
    assert data.startswith(b"".join(encode_row(r) for r in logged))
    assert not list(tmp_path.glob("*.arrow")) and writer.buffered == 3
    writer.close()
    assert [read_segment(p).num_rows for p in tmp_path.glob("*.arrow")] == [3]
    assert not wal_files(tmp_path)


def test_a_torn_last_record_is_dropped_wherever_the_write_stopped() -> None:
    logged = rows(4, "torn")
    data = b"".join(encode_row(r) for r in logged)
    last = len(encode_row(logged[-1]))
    for cut in range(1, last):  # the process died inside the last copy, at any byte
        partial = data[len(data) - last : len(data) - cut]
        torn = len(partial.rstrip(b"\0"))  # what is left of it, less zeros a file ends in anyway
        assert decode_rows(data[: len(data) - cut]) == (logged[:3], torn)
        zeroed = data[: len(data) - cut] + bytes(cut + 100)  # as it sits in a reserved file
        assert decode_rows(zeroed) == (logged[:3], torn)
    no_header = data[: len(data) - last] + bytes(8) + data[len(data) - last + 8 :]
    assert decode_rows(no_header) == (logged[:3], last)  # the header goes in last
    assert decode_rows(data) == (logged, 0)
    assert decode_rows(b"") == ([], 0)


def test_a_last_record_with_a_bad_checksum_is_dropped() -> None:
    logged = rows(3, "crc")
    data = bytearray(b"".join(encode_row(r) for r in logged))
    data[-3] ^= 0xFF  # complete length, wrong bytes: never a record that was fully written
    kept, torn = decode_rows(bytes(data))
    assert kept == logged[:2] and torn == len(encode_row(logged[-1]))
    garbage_length = wal.HEADER.pack(wal.MAX_PAYLOAD + 1, 0) + b"x" * 10
    assert decode_rows(encode_row(logged[0]) + garbage_length) == (logged[:1], len(garbage_length))
    zeroed = bytes(4096)  # a reserved file's unused rest, or blocks zeroed by a power loss
    assert decode_rows(encode_row(logged[0]) + zeroed) == (logged[:1], 0)


def test_a_dead_writers_file_becomes_one_segment_and_its_rows_are_ingested_once(
    tmp_path: Path, clickhouse: Any
) -> None:
    tag = uuid.uuid4().hex[:12]
    logged = rows(6, tag)
    half_written = encode_row(rows(1, tag + "-never-answered")[0])[:-5]
    dead_wal(tmp_path, "w9-1-000001.wal", [*map(encode_row, logged), half_written])
    report = recover_wals(tmp_path)
    assert (report.files, report.rows, report.torn_bytes) == (1, 6, len(half_written))
    (segment,) = tmp_path.glob("*.arrow")
    assert segment.name == "w9-1-000001.arrow" and not wal_files(tmp_path)
    assert recover_wals(tmp_path).files == 0  # once
    assert ingest_spool(clickhouse, tmp_path).rows == 6
    assert ingest_spool(clickhouse, tmp_path).rows == 0
    assert count(clickhouse, tag) == 6 and count(clickhouse, tag + "-never-answered") == 0


def test_a_file_its_worker_died_creating_is_removed_and_a_live_ones_is_left(tmp_path: Path) -> None:
    # killed between WalFile.create's lock and its rename: pages reserved, lock free, no rows
    abandoned = tmp_path / f"{wal.CREATING_PREFIX}w9-1-000002.wal"
    abandoned.write_bytes(bytes(4096))
    # a live worker's, still being created: locked (flock conflicts across descriptors)
    creating = tmp_path / f"{wal.CREATING_PREFIX}w1-1-000003.wal"
    creating.write_bytes(bytes(4096))
    held = os.open(creating, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    # opened by a live worker and not yet locked: empty, so left alone
    just_opened = tmp_path / f"{wal.CREATING_PREFIX}w1-1-000004.wal"
    just_opened.touch()
    segment_tmp = tmp_path / ".tmp-w1-1-000001.arrow"  # a live writer's segment: locked
    segment_tmp.write_bytes(b"x")
    writing = os.open(segment_tmp, os.O_RDWR)
    fcntl.flock(writing, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        report = recover_wals(tmp_path)
        assert (report.files, report.rows) == (0, 0)
        assert not abandoned.exists()
        assert creating.exists() and just_opened.exists() and segment_tmp.exists()
    finally:
        os.close(held)
        os.close(writing)


def test_a_segment_its_writer_died_writing_is_removed_and_its_rows_come_from_the_wal(
    tmp_path: Path, clickhouse: Any
) -> None:
    """The writer's INSERT failed (its write-ahead file is `.inserting`), it fell back to a
    segment, and a SIGKILL came inside write_segment, after its bytes and before its rename. The
    temporary file is left unlocked; recovery deletes it and the rows, still in the write-ahead
    file, are ingested once. (Recovery's own segment of that file is `.arrow.ingesting`, another
    name, so before the lock the killed writer's file stayed in the spool forever.)"""
    tag = uuid.uuid4().hex[:12]
    logged = rows(5, tag)
    dead_wal(tmp_path, f"w6-1-000001.wal{INSERTING_SUFFIX}", [encode_row(r) for r in logged])
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from logstore.segments import write_segment
        from tests.unit.test_serving_spool import rows
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # killed before the rename
        write_segment(Path({str(tmp_path)!r}), "w6-1-000001.arrow", rows(5, {tag!r}))
        """
    )
    child = subprocess.run([sys.executable, "-c", script], cwd=Path.cwd(), timeout=60)
    assert child.returncode == -signal.SIGKILL
    left = tmp_path / ".tmp-w6-1-000001.arrow"
    assert left.stat().st_size > 0  # the killed writer's bytes, and nobody holds its lock
    assert recover_wals(tmp_path).rows == 5
    assert not left.exists()
    ingest_spool(clickhouse, tmp_path)
    assert count(clickhouse, tag) == 5
    assert not list(tmp_path.iterdir())


def test_a_segment_is_locked_until_it_has_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While write_segment renames, a recoverer cannot claim the temporary file."""
    import logstore.segments as segments

    real_replace = os.replace
    claimable: list[bool] = []

    def replace(src: Any, dst: Any) -> None:
        fd = wal.claim(Path(src))
        claimable.append(fd is not None)
        if fd is not None:
            os.close(fd)
        real_replace(src, dst)

    monkeypatch.setattr(segments.os, "replace", replace)
    write_segment(tmp_path, "w7-1-000001.arrow", rows(2, "locked"))
    assert claimable == [False]
    assert [p.name for p in tmp_path.iterdir()] == ["w7-1-000001.arrow"]


def test_a_live_writers_file_is_left_alone_and_its_segment_waits_for_it(
    tmp_path: Path, clickhouse: Any
) -> None:
    tag = uuid.uuid4().hex[:12]
    logged = rows(4, tag)
    live = WalFile.create(tmp_path, "w1-1-000001.wal")
    for row in logged:
        assert live.append(orjson.dumps(row))
    assert recover_wals(tmp_path).files == 0 and live.path.exists()
    # The writer has written the segment and not yet deleted its file: the segment must wait,
    # or a crash now would have a recoverer log the rows a second time.
    write_segment(tmp_path, "w1-1-000001.arrow", logged)
    assert ingest_spool(clickhouse, tmp_path).rows == 0 and count(clickhouse, tag) == 0
    live.retire()
    assert ingest_spool(clickhouse, tmp_path).rows == 4 and count(clickhouse, tag) == 4


def test_a_crash_between_the_segment_and_the_files_deletion_logs_each_row_once(
    tmp_path: Path, clickhouse: Any
) -> None:
    tag = uuid.uuid4().hex[:12]
    logged = rows(5, tag)
    write_segment(tmp_path, "w2-1-000007.arrow", logged)
    dead_wal(tmp_path, "w2-1-000007.wal", [encode_row(r) for r in logged])
    report = recover_wals(tmp_path)
    assert (report.files, report.rows) == (1, 0)  # its segment exists: the file is only deleted
    assert [p.name for p in tmp_path.iterdir()] == ["w2-1-000007.arrow"]
    ingest_spool(clickhouse, tmp_path)
    assert count(clickhouse, tag) == 5


def test_a_file_that_died_mid_insert_is_inserted_only_if_its_rows_are_absent(
    tmp_path: Path, clickhouse: Any
) -> None:
    landed, lost = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    import logstore.spool as spool

    inserted = rows(3, landed)  # the INSERT landed, then the worker died
    clickhouse.insert_arrow("inference_logs", spool.rows_to_table(inserted))
    dead_wal(tmp_path, f"w3-1-000001.wal{INSERTING_SUFFIX}", [encode_row(r) for r in inserted])
    dead_wal(tmp_path, f"w3-1-000002.wal{INSERTING_SUFFIX}", [encode_row(r) for r in rows(2, lost)])
    assert recover_wals(tmp_path).rows == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"w3-1-00000{i}.arrow{INGESTING_SUFFIX}" for i in (1, 2)
    ]
    ingest_spool(clickhouse, tmp_path)
    assert count(clickhouse, landed) == 3 and count(clickhouse, lost) == 2
    assert not list(tmp_path.iterdir())


def test_a_file_deleted_while_its_lock_was_awaited_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = dead_wal(tmp_path, "w4-1-000001.wal", [encode_row(rows(1)[0])])
    real_flock = fcntl.flock

    def flock_after_the_owner_finished(fd: int, operation: int) -> None:
        path.unlink()  # the owner (or another recoverer) finished with it meanwhile
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_owner_finished)
    assert wal.claim(path) is None


def test_a_killed_writer_loses_no_appended_row(tmp_path: Path, clickhouse: Any) -> None:
    tag = uuid.uuid4().hex[:12]
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from logstore.spool import RequestLogWriter, SpoolWriter
        from tests.unit.test_serving_spool import rows
        writer = RequestLogWriter(SpoolWriter(Path({str(tmp_path)!r}), 1 << 30, "killed"),
                                  connect_server=None, flush_s=0.01, batch_rows=7)
        writer.start()
        for row in rows(500, {tag!r}):
            writer.append(row)
        print("appended", flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "appended"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    ingest_spool(clickhouse, tmp_path)
    assert count(clickhouse, tag) == 500
    assert not wal_files(tmp_path)


def test_a_full_disk_keeps_rows_in_memory_says_why_and_writes_them_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w5"), connect_server=None, flush_s=3600, batch_rows=100
    )
    logged = rows(4, "full")
    writer.append(logged[0])
    real_fallocate = os.posix_fallocate

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    writer.flush()  # the next file cannot be reserved
    for row in logged[1:3]:
        writer.append(row)  # never raises: the request is still answered
    assert writer.wal_error is not None and "No space left" in writer.wal_error
    assert writer.stats.wal_failures == 2 and writer.buffered == 2
    monkeypatch.setattr(os, "posix_fallocate", real_fallocate)
    writer.flush()  # the next rotation reserves a fresh file: written ahead again
    assert writer.wal_error is None
    writer.append(logged[3])
    assert len(wal_files(tmp_path)) == 1
    writer.close()
    written = sorted(
        r
        for p in tmp_path.glob("*.arrow")
        for r in read_segment(p).column("request_id").to_pylist()
    )
    assert written == sorted(r[1] for r in logged) and not wal_files(tmp_path)
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_full_file_rotates_on_the_request_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wal, "CAPACITY", 500)  # room for a few rows
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w7"), connect_server=None, flush_s=3600, batch_rows=10_000
    )
    logged = rows(30, "rotating")
    for row in logged:
        writer.append(row)
    assert len(wal_files(tmp_path)) > 3 and writer.stats.wal_failures == 0
    recovered = [r for p in wal_files(tmp_path) for r in decode_rows(p.read_bytes())[0]]
    assert sorted(recovered) == sorted(logged)  # every row in exactly one file
    writer.close()
    assert sum(read_segment(p).num_rows for p in tmp_path.glob("*.arrow")) == 30


def test_with_a_server_the_file_is_marked_before_the_insert_and_deleted_after(
    tmp_path: Path,
) -> None:
    seen: list[list[str]] = []

    class WatchingServer(FakeServer):
        def insert_arrow(self, table: str, arrow_table: Any) -> None:
            seen.append(sorted(p.name.split(".", 1)[1] for p in wal_files(tmp_path)))
            super().insert_arrow(table, arrow_table)

    server = WatchingServer()
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w6"),
        connect_server=lambda: server,
        flush_s=3600,
        batch_rows=100,
    )
    for row in rows(3, "direct"):
        writer.append(row)
    writer.flush()
    # during the INSERT: this batch's file marked .inserting, and the next batch's fresh file
    assert seen == [["wal", "wal" + INSERTING_SUFFIX]]
    assert server.request_ids() == [f"direct-{i}" for i in range(3)]
    writer.close()
    assert not list(tmp_path.iterdir())


def test_written_files_are_emptied_and_reused_so_rows_land_on_pages_already_mapped(
    tmp_path: Path, clickhouse: Any
) -> None:
    tag = uuid.uuid4().hex[:12]
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w8"), connect_server=None, flush_s=3600, batch_rows=100
    )
    logged = rows(40, tag)
    inodes = set()
    for cycle in range(4):
        for row in logged[cycle * 10 : (cycle + 1) * 10]:
            writer.append(row)
        files = wal_files(tmp_path)
        inodes |= {p.stat().st_ino for p in files}
        in_files = [r for p in files for r in decode_rows(p.read_bytes())[0]]
        assert in_files == logged[cycle * 10 : (cycle + 1) * 10]  # only rows since the rotation
        writer.flush()
    assert len(inodes) == 2  # two files take turns: no new file after the first rotation
    writer.close()
    ingest_spool(clickhouse, tmp_path)
    assert count(clickhouse, tag) == 40
    assert not list(tmp_path.iterdir())

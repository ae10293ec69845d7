"""The request-log spool: whole segments, a loud cap, exactly-once ingestion, server fallback."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from logstore.spool import (
    COLUMNS,
    INGESTING_SUFFIX,
    LogRow,
    RequestLogWriter,
    SpoolBacklog,
    SpoolWriter,
    ingest_spool,
    read_segment,
    rows_to_table,
)


def rows(n: int, tag: str | None = None) -> list[LogRow]:
    tag = tag or uuid.uuid4().hex[:12]
    now = time.time()
    return [
        (
            now,
            f"{tag}-{i}",
            10 + i,
            "s",
            "stable",
            "v1",
            "l1",
            1.5,
            0.1,
            0.2,
            0.3,
            0.9,
            4,
            800,
            200,
            "",
            20,
            f"{i:032x}",
        )
        for i in range(n)
    ]


def count(client: Any, tag: str) -> int:
    return int(
        client.query(
            "SELECT count() FROM inference_logs WHERE startsWith(request_id, {tag:String})",
            parameters={"tag": tag + "-"},
        ).result_rows[0][0]
    )


@pytest.fixture
def clickhouse(settings: Any) -> Any:
    import logstore

    return logstore.connect(settings.resolved_clickhouse_dsn)


class FakeServer:
    """A ClickHouse server that can be switched off."""

    def __init__(self) -> None:
        self.down = False
        self.tables: list[pa.Table] = []

    def insert_arrow(self, table: str, arrow_table: pa.Table) -> None:
        if self.down:
            raise ConnectionError("connection refused")
        assert table == "inference_logs"
        self.tables.append(arrow_table)

    def query(self, query: str, parameters: dict[str, Any] | None = None) -> Any:
        raise AssertionError("not used: no leftovers in these tests")

    def request_ids(self) -> list[str]:
        return [r for t in self.tables for r in t.column("request_id").to_pylist()]


def test_rows_become_a_table_with_the_inference_logs_types() -> None:
    table = rows_to_table(rows(3, "t"))
    assert table.column_names == list(COLUMNS) and table.num_rows == 3
    assert table.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert table.column("batch_size").type == pa.uint16()
    assert rows_to_table([]).num_rows == 0


def test_a_segment_appears_whole_under_its_final_name(tmp_path: Path) -> None:
    spool = SpoolWriter(tmp_path, max_bytes=1 << 30, prefix="w1")
    path = spool.write(rows(5, "seg"))
    assert path.suffix == ".arrow" and not list(tmp_path.glob(".tmp-*"))
    assert read_segment(path).column("request_id").to_pylist() == [f"seg-{i}" for i in range(5)]
    assert spool.backlog.segments == 1 and spool.backlog.bytes == path.stat().st_size


def test_breaching_the_cap_is_logged_as_an_error_and_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = SpoolWriter(tmp_path, max_bytes=100, prefix="w1")
    with caplog.at_level(logging.WARNING, logger="logstore.spool"):
        spool.write(rows(50))
        assert spool.over_cap
        assert any(
            r.levelno == logging.ERROR and "over its cap" in r.message for r in caplog.records
        )
        for segment in tmp_path.glob("*.arrow"):
            segment.unlink()
        spool.check_cap()
    assert not spool.over_cap
    assert any("back under its cap" in r.message for r in caplog.records)


def test_ingest_inserts_every_segment_once_then_deletes_it(tmp_path: Path, clickhouse: Any) -> None:
    tag = uuid.uuid4().hex[:12]
    spool = SpoolWriter(tmp_path, max_bytes=1 << 30, prefix="w1")
    spool.write(rows(7, tag)[:4])
    spool.write(rows(7, tag)[4:])
    report = ingest_spool(clickhouse, tmp_path)
    assert (report.segments, report.rows, report.recovered) == (2, 7, 0)
    assert count(clickhouse, tag) == 7
    assert not list(tmp_path.iterdir())
    assert ingest_spool(clickhouse, tmp_path).rows == 0
    assert count(clickhouse, tag) == 7


def test_a_crash_between_insert_and_delete_does_not_duplicate_rows(
    tmp_path: Path, clickhouse: Any
) -> None:
    inserted, lost = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    spool = SpoolWriter(tmp_path, max_bytes=1 << 30, prefix="w1")
    # one claimed segment whose INSERT landed before the crash, one whose INSERT did not
    done = spool.write(rows(6, inserted))
    clickhouse.insert_arrow("inference_logs", read_segment(done))
    done.rename(done.with_name(done.name + INGESTING_SUFFIX))
    pending = spool.write(rows(3, lost))
    pending.rename(pending.with_name(pending.name + INGESTING_SUFFIX))
    report = ingest_spool(clickhouse, tmp_path)
    assert report.recovered == 2 and report.rows == 3
    assert count(clickhouse, inserted) == 6 and count(clickhouse, lost) == 3
    assert not list(tmp_path.iterdir())


class CountingClient:
    """The real log store, counting INSERTs; `crash_after_insert` dies once the first lands."""

    def __init__(self, client: Any, crash_after_insert: bool = False) -> None:
        self.client, self.crash, self.inserts = client, crash_after_insert, 0

    def insert_arrow(self, table: str, arrow_table: pa.Table) -> Any:
        self.client.insert_arrow(table, arrow_table)
        self.inserts += 1
        if self.crash:
            self.crash = False
            raise KeyboardInterrupt("killed after the INSERT, before any segment was deleted")

    def query(self, query: str, parameters: dict[str, Any] | None = None) -> Any:
        return self.client.query(query, parameters=parameters)


def small_segments(spool_dir: Path, n: int, per_segment: int) -> str:
    """`n` rows written as segments of `per_segment` rows each; the rows' tag."""
    tag = uuid.uuid4().hex[:12]
    spool = SpoolWriter(spool_dir, max_bytes=1 << 30, prefix="w1")
    batch = rows(n, tag)
    for i in range(0, n, per_segment):
        spool.write(batch[i : i + per_segment])
    return tag


def test_many_small_segments_are_ingested_in_one_insert(tmp_path: Path, clickhouse: Any) -> None:
    # a worker flushing every 100 ms writes ten segments a second: one INSERT each would make
    # ingestion slower than the spool fills
    tag = small_segments(tmp_path, 300, 3)
    counting = CountingClient(clickhouse)
    report = ingest_spool(counting, tmp_path)
    assert (report.segments, report.rows, counting.inserts) == (100, 300, 1)
    assert count(clickhouse, tag) == 300 and not list(tmp_path.iterdir())


def test_a_crash_after_a_batch_insert_leaves_no_duplicates(tmp_path: Path, clickhouse: Any) -> None:
    tag = small_segments(tmp_path, 40, 4)
    with pytest.raises(KeyboardInterrupt):
        ingest_spool(CountingClient(clickhouse, crash_after_insert=True), tmp_path)
    assert len(list(tmp_path.glob(f"*{INGESTING_SUFFIX}"))) == 10  # claimed, inserted, kept
    report = ingest_spool(clickhouse, tmp_path)  # the next ingester finds each one inserted
    assert report.recovered == 10 and report.rows == 0
    assert count(clickhouse, tag) == 40 and not list(tmp_path.iterdir())


def test_two_ingesters_on_one_folder_insert_each_row_once(tmp_path: Path, clickhouse: Any) -> None:
    # the first holds its claimed batch while its INSERT is slow; the second must not take the
    # claims for a crashed ingester's leftovers and insert them too
    tag = small_segments(tmp_path, 60, 3)

    inserting = threading.Event()

    class SlowInsert(CountingClient):
        def insert_arrow(self, table: str, arrow_table: pa.Table) -> Any:
            inserting.set()
            time.sleep(0.5)  # not a wait: the slow INSERT the second ingester runs beside
            return super().insert_arrow(table, arrow_table)

    first = threading.Thread(target=ingest_spool, args=(SlowInsert(clickhouse), tmp_path))
    first.start()
    # the first has claimed every segment and is inserting
    assert inserting.wait(timeout=30), "the first ingester never reached its INSERT"
    ingest_spool(clickhouse, tmp_path)
    first.join()
    assert count(clickhouse, tag) == 60 and not list(tmp_path.iterdir())


def test_a_segment_ingested_while_the_writer_rescans_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the reader claims (renames) or deletes a segment between the writer's listing and its stat:
    # the write succeeded, and raising would make the writer write its rows a second time
    spool = SpoolWriter(tmp_path, max_bytes=1 << 30, prefix="w1")
    real_scandir = os.scandir

    class Vanished:
        def __init__(self, entry: os.DirEntry[str]) -> None:
            self.name = entry.name

        def is_file(self) -> bool:
            return True

        def stat(self) -> os.stat_result:
            raise FileNotFoundError(self.name)

    class Listing:
        def __init__(self, path: Path) -> None:
            self.inner = real_scandir(path)

        def __enter__(self) -> list[Vanished]:
            return [Vanished(e) for e in self.inner]

        def __exit__(self, *exc: object) -> None:
            self.inner.close()

    monkeypatch.setattr("logstore.segments.os.scandir", Listing)
    spool.write(rows(3))  # no FileNotFoundError
    assert spool.backlog.segments == 0


def test_missing_spool_folder_ingests_nothing(tmp_path: Path, clickhouse: Any) -> None:
    assert ingest_spool(clickhouse, tmp_path / "absent").rows == 0


def writer_for(tmp_path: Path, server: FakeServer | None) -> RequestLogWriter:
    return RequestLogWriter(
        SpoolWriter(tmp_path, max_bytes=1 << 30, prefix="w1"),
        connect_server=(lambda: server) if server else None,
        flush_s=0.05,
        batch_rows=4,
    )


def test_without_a_server_every_flush_becomes_segments_of_at_most_batch_rows(
    tmp_path: Path,
) -> None:
    writer = writer_for(tmp_path, None)
    for row in rows(10):
        writer.append(row)
    writer.flush()
    segments = sorted(tmp_path.glob("*.arrow"))
    assert [read_segment(s).num_rows for s in segments] == [4, 4, 2]
    assert writer.stats.rows_spooled == 10 and writer.buffered == 0


def test_server_down_spools_and_server_back_drains_the_spool(tmp_path: Path) -> None:
    server = FakeServer()
    writer = writer_for(tmp_path, server)
    first, second = rows(6, "a"), rows(3, "b")
    server.down = True
    for row in first:
        writer.append(row)
    writer.flush()
    assert writer.stats.rows_spooled == 6 and list(tmp_path.glob("*.arrow"))
    server.down = False
    for row in second:
        writer.append(row)
    writer.flush()
    assert sorted(server.request_ids()) == sorted(r[1] for r in first + second)
    assert writer.stats.rows_inserted == 3 and writer.stats.rows_drained == 6
    writer.close()
    assert not list(tmp_path.iterdir())  # no segment, no write-ahead file left behind


def test_unreachable_at_connect_time_is_the_same_as_down(tmp_path: Path) -> None:
    attempts = []

    def connect() -> FakeServer:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("no route to host")
        return server

    server = FakeServer()
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w1"), connect_server=connect, flush_s=1, batch_rows=100
    )
    writer.append(rows(1, "x")[0])
    writer.flush()
    writer.append(rows(1, "y")[0])
    writer.flush()
    assert sorted(server.request_ids()) == ["x-0", "y-0"] and len(attempts) == 2


def test_when_server_and_disk_both_fail_rows_stay_buffered(tmp_path: Path) -> None:
    server = FakeServer()
    server.down = True
    writer = writer_for(tmp_path, server)

    def broken(*_: Any) -> Path:
        raise OSError("disk full")

    working = writer.spool.write
    writer.spool.write = broken  # type: ignore[method-assign]
    for row in rows(5, "kept"):
        writer.append(row)
    with pytest.raises(OSError):
        writer.flush()
    assert writer.buffered == 5 and writer.stats.spool_failures == 1
    writer.spool.write = working  # type: ignore[method-assign]
    writer.flush()
    assert writer.buffered == 0 and writer.stats.rows_spooled == 5


def test_the_background_thread_writes_on_its_interval_and_on_close(tmp_path: Path) -> None:
    writer = writer_for(tmp_path, None)
    writer.start()
    try:
        writer.append(rows(1)[0])
        deadline = time.monotonic() + 5
        while not list(tmp_path.glob("*.arrow")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(tmp_path.glob("*.arrow"))
        writer.append(rows(1)[0])
    finally:
        writer.close()
    assert writer.stats.rows_spooled == 2 and writer.buffered == 0


def test_a_big_backlog_is_counted_per_write_not_rescanned_at_every_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With nothing ingesting, every write used to list and stat the whole folder: each
    # rotation slower than the last. Writes count their own segment; rescans are rate-limited.
    spool = SpoolWriter(tmp_path, max_bytes=1 << 30, prefix="w1")
    scans = 0
    real_scan = spool.scan

    def counted() -> SpoolBacklog:
        nonlocal scans
        scans += 1
        return real_scan()

    monkeypatch.setattr(spool, "scan", counted)
    paths = [spool.write(rows(3, f"b{i}")) for i in range(20)]
    assert scans == 1  # the first write's; the next is due a second later
    assert spool.backlog.segments == 20
    assert spool.backlog.bytes == sum(p.stat().st_size for p in paths)


def test_the_cap_is_crossed_by_the_write_that_crosses_it_between_rescans(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = SpoolWriter(tmp_path, max_bytes=1 << 30, prefix="w1")
    first = spool.write(rows(50))
    spool.max_bytes = first.stat().st_size + 1  # the next write crosses it
    with caplog.at_level(logging.WARNING, logger="logstore.spool"):
        spool.write(rows(50))
    assert spool.over_cap
    assert any(r.levelno == logging.ERROR and "over its cap" in r.message for r in caplog.records)

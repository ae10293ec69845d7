"""RELAY_SERVING_LOG_SEGMENTER=copy: a sealed write-ahead file's records become a segment as they
are, and what ingestion reads from it is exactly what an encoded segment holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from logstore.log_tables import IMPRESSIONS
from logstore.spool import (
    RECORDS_SEGMENT_SUFFIX,
    RequestLogWriter,
    SpoolWriter,
    ingest_spool,
    read_segment,
)
from tests.unit.test_log_segmenter import write_impressions
from tests.unit.test_serving_spool import clickhouse, rows  # noqa: F401 (a fixture)


def writer_in(directory: Path, copy: bool, table=None) -> RequestLogWriter:
    spool = SpoolWriter(directory, 1 << 30, "w", *(() if table is None else (table,)))
    return RequestLogWriter(
        spool, connect_server=None, flush_s=3600, batch_rows=10_000, copy_segments=copy
    )


def only_segment(directory: Path, table=None):
    (path,) = [p for p in directory.iterdir() if not p.name.endswith(".wal")]
    return path, read_segment(path, *(() if table is None else (table,)))


def test_copied_records_read_back_as_the_rows_an_encoded_segment_holds(tmp_path: Path) -> None:
    logged = rows(9, "copy")
    found = {}
    for name, copy in (("copy", True), ("thread", False)):
        requests = writer_in(tmp_path / name / "requests", copy)
        impressions = writer_in(tmp_path / name / "impressions", copy, IMPRESSIONS)
        for row in logged:
            requests.append(row)
        for k in range(5):  # several columnar records, each with its own dictionaries
            write_impressions(impressions, k)
        for w in (requests, impressions):
            w.flush()
            assert w.pending == 0
            w.close()
        found[name] = (
            only_segment(tmp_path / name / "requests"),
            only_segment(tmp_path / name / "impressions", IMPRESSIONS),
        )
        assert (requests.stats.segments_copied, requests.stats.segments_by_writer) == (
            (1, 0) if copy else (0, 1)
        )
    (req_path, req_copy), (imp_path, imp_copy) = found["copy"]
    (_, req_thread), (_, imp_thread) = found["thread"]
    assert req_path.name.endswith(RECORDS_SEGMENT_SUFFIX)
    assert imp_path.name.endswith(RECORDS_SEGMENT_SUFFIX)
    assert req_copy.num_rows == 9 and req_copy.equals(req_thread)
    assert imp_copy.num_rows == 15 and imp_copy.equals(imp_thread)


def test_a_damaged_records_segment_is_refused_by_name_and_nothing_of_it_is_ingested(
    tmp_path: Path,
    clickhouse: Any,  # noqa: F811
) -> None:
    writer = writer_in(tmp_path, True)
    for row in rows(4, "torn"):
        writer.append(row)
    writer.close()
    path, _ = only_segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a flipped byte in the last record: its checksum no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=path.name):
        read_segment(path)
    before = clickhouse.query("SELECT count() FROM inference_logs").result_rows[0][0]
    with pytest.raises(ValueError, match=path.name):
        ingest_spool(clickhouse, tmp_path)
    assert clickhouse.query("SELECT count() FROM inference_logs").result_rows[0][0] == before

"""The shop's sessions on the durable log path: user_sessions' columns, `started_at` as the time
column through segments and recovery, and each session in ClickHouse exactly once."""

from __future__ import annotations

import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest

from logstore import wal
from logstore.impact import SESSION_COLUMNS
from logstore.log_tables import USER_SESSION_COLUMNS, USER_SESSIONS
from logstore.spool import (
    INGESTING_SUFFIX,
    INSERTING_SUFFIX,
    RequestLogWriter,
    SpoolWriter,
    ingest_spool,
    read_segment,
    recover_wals,
    rows_to_table,
    write_segment,
)
from simulation.shop_service import session_rows


@pytest.fixture
def clickhouse(settings: Any) -> Any:
    import logstore

    return logstore.connect(settings.resolved_clickhouse_dsn)


def sessions(n: int, tag: str) -> list[tuple[Any, ...]]:
    """Session rows in USER_SESSIONS' order; started_at in Unix seconds, on whole milliseconds."""
    now = time.time()
    return [
        (f"{tag}-{i}", 100 + i, round(now + i, 3), 30.5, "mobile", 42.25, i % 3, 19.5 * i)
        for i in range(n)
    ]


def count(client: Any, tag: str) -> tuple[int, int]:
    """Rows and distinct session ids of the tag's sessions."""
    found = client.query(
        "SELECT count(), uniqExact(session_id) FROM user_sessions "
        "WHERE startsWith(session_id, {tag:String})",
        parameters={"tag": tag + "-"},
    ).result_rows[0]
    return int(found[0]), int(found[1])


def dead_wal(directory: Path, name: str, rows: list[tuple[Any, ...]]) -> None:
    """A write-ahead file of a shop that died after appending `rows` as one group record."""
    payload = orjson.dumps(rows)
    data = wal.HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    (directory / name).write_bytes(data + bytes(4096 - len(data) % 4096))


def test_the_log_table_has_the_user_sessions_columns_in_order(clickhouse: Any) -> None:
    described = [r[0] for r in clickhouse.query("DESCRIBE TABLE user_sessions").result_rows]
    assert list(USER_SESSION_COLUMNS) == described == list(SESSION_COLUMNS)
    assert USER_SESSIONS.time_column == "started_at" and USER_SESSIONS.subdir == "sessions"


def test_a_sessions_segment_round_trips_with_started_at_as_its_time(tmp_path: Path) -> None:
    logged = sessions(4, "rt")
    table = rows_to_table(logged, USER_SESSIONS)
    assert table.schema.field("started_at").type == pa.timestamp("ms", tz="UTC")
    assert table.column("orders").type == pa.uint16()
    path = write_segment(tmp_path, "shop-1-000001.arrow", logged, USER_SESSIONS)
    found = read_segment(path, USER_SESSIONS)
    assert found.column_names == list(USER_SESSION_COLUMNS)
    back = [
        (*r[:2], r[2].timestamp(), *r[3:])
        for r in zip(*(found.column(c).to_pylist() for c in found.column_names), strict=True)
    ]
    assert back == logged


def test_a_rounds_frame_becomes_plain_rows_the_write_ahead_file_can_hold() -> None:
    started = pd.Timestamp.now(tz="UTC")
    frame = pd.DataFrame(
        {
            "session_id": ["live-ab-0", "live-ab-1"],
            "user_id": np.array([7, 8], dtype=np.uint64),
            "started_at": started,
            "user_age": np.array([31.0, 44.0], dtype=np.float32),
            "device_type": np.array(["mobile", "desktop"], dtype=object),
            "session_length_s": np.array([12.5, 3.0], dtype=np.float32),
            "orders": np.array([1, 0], dtype=np.uint16),
            "gmv": np.array([25.0, 0.0]),
        }
    )
    rows = session_rows(frame)
    assert rows[1] == ("live-ab-1", 8, started.timestamp(), 44.0, "desktop", 3.0, 0, 0.0)
    assert orjson.loads(orjson.dumps(rows))[0][0] == "live-ab-0"
    assert session_rows(pd.DataFrame()) == []


def test_written_sessions_are_ingested_once(tmp_path: Path, clickhouse: Any) -> None:
    tag = uuid.uuid4().hex[:12]
    spool = SpoolWriter(tmp_path, 1 << 30, "shop", USER_SESSIONS)
    writer = RequestLogWriter(spool, connect_server=None, flush_s=0.05, batch_rows=100)
    writer.start()
    writer.append_group(sessions(5, tag))
    writer.close()
    assert ingest_spool(clickhouse, tmp_path, USER_SESSIONS).rows == 5
    assert ingest_spool(clickhouse, tmp_path, USER_SESSIONS).rows == 0
    assert count(clickhouse, tag) == (5, 5)


def test_a_dead_shops_files_are_recovered_and_inserted_only_if_absent(
    tmp_path: Path, clickhouse: Any
) -> None:
    landed, lost, spooled = (uuid.uuid4().hex[:12] for _ in range(3))
    inserted = sessions(3, landed)  # the INSERT landed, then the shop died
    clickhouse.insert_arrow("user_sessions", rows_to_table(inserted, USER_SESSIONS))
    dead_wal(tmp_path, f"shop-1-000001.wal{INSERTING_SUFFIX}", inserted)
    dead_wal(tmp_path, f"shop-1-000002.wal{INSERTING_SUFFIX}", sessions(2, lost))
    dead_wal(tmp_path, "shop-1-000003.wal", sessions(4, spooled))
    assert recover_wals(tmp_path, USER_SESSIONS).rows == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        *(f"shop-1-00000{i}.arrow{INGESTING_SUFFIX}" for i in (1, 2)),
        "shop-1-000003.arrow",
    ]
    report = ingest_spool(clickhouse, tmp_path, USER_SESSIONS)
    assert (report.recovered, report.rows) == (2, 6)
    assert count(clickhouse, landed) == (3, 3) and count(clickhouse, lost) == (2, 2)
    assert count(clickhouse, spooled) == (4, 4)
    assert not list(tmp_path.iterdir())

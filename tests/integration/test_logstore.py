"""The real ClickHouse engine (chdb) behind clickhouse-connect: schema, migrations, window queries."""

from datetime import UTC, datetime, timedelta

import pytest

import logstore
from logstore.events import count_window, insert_events, read_window
from logstore.schema import MIGRATIONS
from relay.errors import LogStoreError
from simulation.shop import ShopConfig, generate_events

END = datetime(2024, 5, 1, tzinfo=UTC)  # a window no other test writes to


@pytest.fixture(scope="module")
def client(settings):
    return logstore.connect(settings.resolved_clickhouse_dsn)


def test_migrations_are_recorded_once_and_reapplying_is_a_no_op(client):
    assert logstore.migrate(client) == []
    versions = [
        r[0]
        for r in client.query("SELECT version FROM schema_migrations ORDER BY version").result_rows
    ]
    assert versions == [m.version for m in MIGRATIONS]
    tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
    assert {"events", "inference_logs", "user_sessions", "release_events"} <= tables


def test_window_query_returns_exactly_the_half_open_range_in_time_order(client):
    frame = generate_events(ShopConfig(seed=4, n_users=300, n_items=200), 3_000, END, days=2)
    insert_events(client, frame)
    start, end = END - timedelta(days=1), END
    got = read_window(client, start, end)
    ts = frame["ts"]
    expected = int(((ts >= start) & (ts < end)).sum())
    assert len(got) == expected == count_window(client, start, end)
    assert got["ts"].is_monotonic_increasing
    assert list(got.columns)[:2] == ["ts", "session_id"]


def test_empty_window_keeps_its_columns(client):
    got = read_window(client, datetime(2001, 1, 1, tzinfo=UTC), datetime(2001, 1, 2, tzinfo=UTC))
    assert got.empty and "clicked" in got.columns


def test_insert_refuses_a_frame_missing_columns(client):
    frame = generate_events(ShopConfig(seed=4, n_users=50, n_items=50), 10, END)
    with pytest.raises(ValueError, match="lacks columns: price"):
        insert_events(client, frame.drop(columns=["price"]))


def test_unreachable_server_names_the_dsn_without_the_password():
    with pytest.raises(LogStoreError) as err:
        logstore.connect("http://relay:s3cret@127.0.0.1:9/default")
    assert "127.0.0.1" in str(err.value) and "s3cret" not in str(err.value)

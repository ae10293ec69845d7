"""A log-store client for readers: every row the fleet has logged so far is in its tables."""

from __future__ import annotations

from pathlib import Path

from clickhouse_connect.driver.client import Client

from logstore.client import connect
from logstore.log_tables import FEEDBACK, IMPRESSIONS, SHADOW_PAIRS, USER_SESSIONS, LogTable
from logstore.spool import INFERENCE_LOGS, ingest_spool

# Every table written through the spool: the serving workers' four and the shop's sessions.
LOG_TABLES: tuple[LogTable, ...] = (
    INFERENCE_LOGS,
    IMPRESSIONS,
    FEEDBACK,
    SHADOW_PAIRS,
    USER_SESSIONS,
)


def connect_for_reading(dsn: str, spool_dir: Path) -> Client:
    """A client whose log tables (LOG_TABLES) hold every row the fleet has logged so far.

    Embedded (chdb): the workers and the shop spool their rows and the reader ingests them
    first. With a ClickHouse server they insert directly (draining their own spool), so nothing
    to do.
    """
    client = connect(dsn)
    if dsn.startswith("chdb://"):
        for table in LOG_TABLES:
            ingest_spool(client, table.spool_dir(spool_dir), table)
    return client

"""A durable log writer for one table, from Settings: the same for serving workers and the shop.

Every process that writes log rows (a serving worker's requests, impressions and feedback, the
shop's sessions) goes through `logstore.spool.RequestLogWriter`, so its rows survive a crash
and land in ClickHouse exactly once: with a ClickHouse server they are inserted directly (the
spool is the fallback), with embedded chdb they are spooled and the log store's owner ingests
them (`logstore.reading.connect_for_reading`). Whether a process writes a table at all is its
own decision (the serving request log can be switched off to benchmark; the shop always logs).
"""

from __future__ import annotations

import secrets
import socket

from logstore.client import connect
from logstore.log_tables import LogTable
from logstore.segmenter import shared_segmenter
from logstore.spool import RequestLogWriter, SpoolWriter
from relay.settings import Settings


def writer_prefix(role: str = "") -> str:
    """A file-name prefix unique across processes and restarts, naming the host (and role)."""
    host = f"{socket.gethostname()}-{secrets.token_hex(4)}"
    return f"{role}-{host}" if role else host


def log_writer_for(settings: Settings, table: LogTable, prefix: str) -> RequestLogWriter:
    """Where `table`'s rows go: a ClickHouse server directly (spool as fallback), else the spool.

    `prefix` starts every write-ahead file and segment name (`writer_prefix()`); the caller
    `start()`s the writer, which recovers the files of a dead process first, and `close()`s it.
    """
    dsn = settings.resolved_clickhouse_dsn
    # chdb allows one process per path and the log store's owner holds it: never open it here.
    server = None if dsn.startswith("chdb://") else (lambda: connect(dsn))
    spool = SpoolWriter(
        table.spool_dir(settings.resolved_spool_dir),
        settings.serving_spool_max_bytes,
        prefix=prefix,
        table=table,
    )
    return RequestLogWriter(
        spool,
        connect_server=server,
        flush_s=settings.serving_log_flush_ms / 1000,
        batch_rows=settings.serving_log_batch_rows,
        sync_each_record=settings.serving_log_fsync == "request",
        segmenter=shared_segmenter() if settings.serving_log_segmenter == "process" else None,
        copy_segments=settings.serving_log_segmenter == "copy",
    )

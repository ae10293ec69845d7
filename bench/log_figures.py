"""What the serving benchmark measures of the log path: CPU per request, rows written, ingestion.

`cpu_seconds` reads a process's user + system time from /proc: on a shared host the CPU a worker
spends per answered request is steadier than its throughput, which neighbours move. Rows logged
in a window are read from the worker's /metrics (written out plus still pending, so nothing
waits for a flush). `ingest_figures` times `ingest_spool` over a worker's spool into a chdb
engine of this process, the way the log store's owner ingests before it reads.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of metric `name` (all label sets) in a /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def logged_rows(url: str) -> float:
    """Log rows a worker has taken so far, every table: written out plus pending."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return metric_sum(text, "relay_log_written_rows_total") + metric_sum(
        text, "relay_log_pending_rows"
    )


def backpressure_rejections(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return metric_sum(text, "relay_log_backpressure_rejections_total")


def ingest_figures(spool_dir: Path, dsn: str) -> dict[str, Any]:
    """Time `ingest_spool` over every log table's spool folder under `spool_dir`."""
    import logstore
    from logstore.reading import LOG_TABLES
    from logstore.spool import ingest_spool

    client = logstore.connect(dsn)
    by_table: dict[str, int] = {}
    started = time.perf_counter()
    for table in LOG_TABLES:
        by_table[table.name] = ingest_spool(client, table.spool_dir(spool_dir), table).rows
    seconds = time.perf_counter() - started
    rows = sum(by_table.values())
    # What landed is checked against what was reported, so a rate is never over lost rows.
    landed = {
        t: int(client.query(f"SELECT count() FROM {t}").result_rows[0][0])  # constant names
        for t in by_table
    }
    return {
        "ingest_rows": rows,
        "ingest_s": round(seconds, 3),
        "ingest_rows_s": round(rows / seconds, 1) if seconds > 0 else 0.0,
        "ingest_rows_by_table": by_table,
        "ingest_landed_rows_by_table": landed,
    }

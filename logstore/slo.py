"""Per-slot latency and error figures over a window of `inference_logs`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from clickhouse_connect.driver.client import Client

# status >= 500 is the worker failing; 4xx is a client's bad request and not the model's fault
_WINDOW_SQL = """
SELECT
    slot,
    model_version,
    count() AS requests,
    quantile(0.5)(latency_ms) AS p50,
    quantile(0.95)(latency_ms) AS p95,
    quantile(0.99)(latency_ms) AS p99,
    countIf(status >= 500) / count() AS error_rate
FROM inference_logs
WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
GROUP BY slot, model_version
"""


@dataclass(frozen=True)
class SlotStats:
    """What one slot serving one version did over a window."""

    slot: str
    model_version: str
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    error_rate: float


def query_slot_stats(client: Client, start: datetime, end: datetime) -> list[SlotStats]:
    """One row per (slot, version) that served requests in [start, end)."""
    rows = client.query(_WINDOW_SQL, parameters={"start": start, "end": end}).result_rows
    return [
        SlotStats(
            slot=str(slot),
            model_version=str(version),
            requests=int(requests),
            p50_ms=float(p50),
            p95_ms=float(p95),
            p99_ms=float(p99),
            error_rate=float(error_rate),
        )
        for slot, version, requests, p50, p95, p99, error_rate in rows
    ]

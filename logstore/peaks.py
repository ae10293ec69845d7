"""The fleet's peak, read from inference_logs: its busiest second, and the champion's P95 at it.

The capacity check sizes its load from the first; with the check off, a release anchors the
gate's `tolerance_ms` at the second (`CanaryRules.peak_p95_ms`), so "+5 ms" means +5 ms where
latency matters most and not at whatever hour the release runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from clickhouse_connect.driver.client import Client


def query_peak_rate(client: Client, start: datetime, end: datetime) -> float:
    """The fleet's busiest second of real served requests in [start, end) (req/s; 0 if none).

    Served users only: stable, canary and baseline answered without a client error; a load
    test's rows (slot `loadtest`) and admin calls are not traffic.
    """
    rows = client.query(
        "SELECT max(c) FROM (SELECT toStartOfSecond(ts) AS s, count() AS c FROM inference_logs "
        "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} "
        "AND slot IN ('stable', 'canary', 'baseline') AND status < 400 GROUP BY s)",
        parameters={"start": start, "end": end},
    ).result_rows
    return float(rows[0][0] or 0) if rows else 0.0


@dataclass(frozen=True)
class PeakLatency:
    """The champion's latency in the fleet's busiest stretch of a lookback."""

    p95_ms: float
    requests: int  # the champion's answered requests in that stretch
    fleet_requests: int  # every served slot's, which chose the stretch
    start: datetime


def query_peak_p95(
    client: Client,
    start: datetime,
    end: datetime,
    champion: str,
    min_requests: int,
    stretch_s: int = 600,
) -> PeakLatency | None:
    """The champion's P95 in the busiest `stretch_s` of [start, end); None without one.

    Stretches are aligned (`toStartOfInterval`) and ranked by the fleet's served requests
    (stable, canary and baseline, status < 400, as `query_peak_rate` counts them); only those in
    which `champion` answered at least `min_requests` (as stable or baseline) qualify, so a
    version promoted since the peak is not judged on a few rows. The P95 is exact
    (`quantileExact`) over the champion's answered requests in that stretch.
    """
    champ = "model_version = {champion:String} AND slot IN ('stable', 'baseline')"
    rows = client.query(
        "SELECT b, total, n, p95 FROM ("
        f"SELECT toStartOfInterval(ts, INTERVAL {int(stretch_s)} SECOND) AS b, count() AS total, "
        f"countIf({champ}) AS n, quantileExactIf(0.95)(latency_ms, {champ}) AS p95 "
        "FROM inference_logs "
        "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} "
        "AND slot IN ('stable', 'canary', 'baseline') AND status < 400 GROUP BY b) "
        "WHERE n >= {least:UInt64} ORDER BY total DESC, b DESC LIMIT 1",
        parameters={"start": start, "end": end, "champion": champion, "least": min_requests},
    ).result_rows
    if not rows:
        return None
    at, total, n, p95 = rows[0]
    stamp = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
    return PeakLatency(float(p95), int(n), int(total), stamp.replace(tzinfo=stamp.tzinfo or UTC))

"""Random samples of answered requests' stage timings, the input of root-cause attribution."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd
from clickhouse_connect.driver.client import Client

# What the causal graph of a request's latency is over (tasks.attribution), in this order.
STAGE_COLUMNS = (
    "load_rps",
    "rows",
    "ahead_rows",
    "input_bytes",
    "ahead_input_bytes",
    "batch_size",
    "preprocess_ms",
    "compute_ms",
    "ahead_preprocess_ms",
    "ahead_compute_ms",
    "queue_ms",
    "postprocess_ms",
    "latency_ms",
)
AHEAD = 16  # requests that arrived just before one: the work it queues behind
RECENT = 64  # arrivals the offered load is measured over

# Per request, from the whole population in arrival (ts) order, before sampling:
#   ahead_*   the mean over the AHEAD requests that arrived just before it (its own value for
#             the first request, which has none);
#   load_rps  arrivals per second over the last RECENT arrivals, itself included.
_SAMPLE_SQL = """
WITH population AS (
    SELECT toFloat64(toUnixTimestamp64Micro(ts)) AS arrived_us, toFloat64(rows) AS rows,
           toFloat64(input_bytes) AS input_bytes, toFloat64(batch_size) AS batch_size,
           queue_ms, preprocess_ms, compute_ms, postprocess_ms, latency_ms
    FROM inference_logs
    WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
      AND slot = {slot:String} AND status = 200
      AND ({version:String} = '' OR model_version = {version:String})
)
SELECT load_rps, rows, ahead_rows, input_bytes, ahead_input_bytes, batch_size, preprocess_ms,
       compute_ms, ahead_preprocess_ms, ahead_compute_ms, queue_ms, postprocess_ms, latency_ms,
       count() OVER () AS population
FROM (
    SELECT *,
           ifNotFinite(avg(rows) OVER ahead, rows) AS ahead_rows,
           ifNotFinite(avg(input_bytes) OVER ahead, input_bytes) AS ahead_input_bytes,
           ifNotFinite(avg(preprocess_ms) OVER ahead, preprocess_ms) AS ahead_preprocess_ms,
           ifNotFinite(avg(compute_ms) OVER ahead, compute_ms) AS ahead_compute_ms,
           (count() OVER recent - 1) * 1e6
               / greatest(arrived_us - min(arrived_us) OVER recent, 1) AS load_rps
    FROM population
    WINDOW ahead AS (ORDER BY arrived_us ROWS BETWEEN {ahead:UInt32} PRECEDING AND 1 PRECEDING),
           recent AS (ORDER BY arrived_us ROWS BETWEEN {recent:UInt32} PRECEDING AND CURRENT ROW)
)
ORDER BY rand() LIMIT {limit:UInt32}
"""


@dataclass(frozen=True)
class StageSample:
    """Up to `limit` rows drawn uniformly from a population of `population` answered requests."""

    frame: pd.DataFrame  # STAGE_COLUMNS, as floats
    population: int


def sample_stage_rows(
    client: Client,
    start: datetime,
    end: datetime,
    slot: str,
    limit: int,
    version: str = "",
) -> StageSample:
    """A uniform sample of `slot`'s (and `version`'s, if given) answered requests in [start, end)."""
    result = client.query(
        _SAMPLE_SQL,
        parameters={
            "start": start,
            "end": end,
            "slot": slot,
            "version": version,
            "limit": limit,
            "ahead": AHEAD,
            "recent": RECENT - 1,
        },
    )
    rows = result.result_rows
    frame = pd.DataFrame([r[:-1] for r in rows], columns=list(STAGE_COLUMNS), dtype=float)
    return StageSample(frame, int(rows[0][-1]) if rows else 0)

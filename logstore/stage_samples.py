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
LOAD_WINDOW_MS = 250  # the offered load is the arrival rate in this window, centred on a request

# Per request, from the whole population in arrival (ts) order, before sampling:
#   ahead_*   the mean over the AHEAD requests that arrived just before it (its own value for
#             the first request, which has none);
#   load_rps  the other arrivals per second within LOAD_WINDOW_MS centred on its arrival, over
#             the part of that window inside the population (its ends are cut at the first
#             and last arrival). A window of fixed *time*, not of a fixed number of arrivals:
#             arrivals stamped in bunches (the event loop reads what queued while it was busy)
#             put many stamps within a millisecond, and 64 / (the span of 64 arrivals) then read
#             four times the offered rate on a slow host (2,042 req/s for 518 offered, measured
#             2026-12-07). Counting the others in 250 ms averages bunches out and follows the
#             bench's swinging rate; (count - 1) / span is unbiased for Poisson arrivals seen
#             from one of them.
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
           (count() OVER near - 1) * 1e6
               / greatest(least(arrived_us + {half_us:UInt32}, max(arrived_us) OVER ())
                          - greatest(arrived_us - {half_us:UInt32}, min(arrived_us) OVER ()),
                          1000) AS load_rps
    FROM population
    WINDOW ahead AS (ORDER BY arrived_us ROWS BETWEEN {ahead:UInt32} PRECEDING AND 1 PRECEDING),
           near AS (ORDER BY arrived_us
                    RANGE BETWEEN {half_us:UInt32} PRECEDING AND {half_us:UInt32} FOLLOWING)
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
            "half_us": LOAD_WINDOW_MS * 500,
        },
    )
    rows = result.result_rows
    frame = pd.DataFrame([r[:-1] for r in rows], columns=list(STAGE_COLUMNS), dtype=float)
    return StageSample(frame, int(rows[0][-1]) if rows else 0)

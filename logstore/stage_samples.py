"""Random samples of answered requests' stage timings, the input of root-cause attribution."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd
from clickhouse_connect.driver.client import Client

# What the causal graph of a request's latency is over (tasks.attribution), in this order.
STAGE_COLUMNS = (
    "in_flight",
    "rows",
    "input_bytes",
    "batch_size",
    "queue_ms",
    "preprocess_ms",
    "compute_ms",
    "postprocess_ms",
    "latency_ms",
)

# in_flight: how many of the population's requests were in the worker when this one arrived
# (ts is the arrival; ts + latency the answer). Arrivals count +1 and answers -1 in one stream
# ordered by time, answers first at a tie; the running sum at an arrival is its in-flight count,
# itself included. A closed-loop client's window, or an open-loop rate times latency (Little).
_SAMPLE_SQL = """
WITH population AS (
    SELECT toFloat64(toUnixTimestamp64Micro(ts)) AS arrived_us, rows, input_bytes, batch_size,
           queue_ms, preprocess_ms, compute_ms, postprocess_ms, latency_ms
    FROM inference_logs
    WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
      AND slot = {slot:String} AND status = 200
      AND ({version:String} = '' OR model_version = {version:String})
)
SELECT toFloat64(in_flight), rows, input_bytes, batch_size, queue_ms, preprocess_ms, compute_ms,
       postprocess_ms, latency_ms, count() OVER () AS population
FROM (
    SELECT *, sum(delta) OVER (ORDER BY t, delta ROWS UNBOUNDED PRECEDING) AS in_flight
    FROM (
        SELECT arrived_us AS t, toInt8(1) AS delta, * EXCEPT arrived_us FROM population
        UNION ALL
        SELECT arrived_us + latency_ms * 1000 AS t, toInt8(-1) AS delta, * EXCEPT arrived_us
        FROM population
    )
)
WHERE delta = 1
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
        parameters={"start": start, "end": end, "slot": slot, "version": version, "limit": limit},
    )
    rows = result.result_rows
    frame = pd.DataFrame([r[:-1] for r in rows], columns=list(STAGE_COLUMNS), dtype=float)
    return StageSample(frame, int(rows[0][-1]) if rows else 0)

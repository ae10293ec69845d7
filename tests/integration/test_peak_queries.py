"""The fleet's peak over the real embedded ClickHouse: the champion's P95 in the busiest stretch.

A release with the capacity check off anchors the gate's "+5 ms" at this figure, so what it
picks (the fleet's busiest ten minutes in which the champion served enough) is checked against
the rows themselves. Rows are written in 2035 so no other test's rows fall in the lookback.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

import logstore
from logstore.impact import insert_inference_logs
from logstore.peaks import query_peak_p95
from tests.integration.log_rows import inference_log_rows

START = datetime(2035, 5, 1, tzinfo=UTC)


def stretch(
    minute: int, slot: str, version: str, n: int, median_ms: float, rng: np.random.Generator
) -> pd.DataFrame:
    """`n` answered requests spread over the ten minutes from `minute`, with a few errors."""
    offsets = rng.uniform(0, 600_000, n)
    status = np.where(rng.random(n) < 0.02, 500, 200)
    return inference_log_rows(
        [START + timedelta(minutes=minute, milliseconds=float(t)) for t in offsets],
        [f"{slot}-{minute}-{i}" for i in range(n)],
        rng.integers(0, 500, n),
        slot,
        version,
        np.exp(rng.normal(0, 0.4, n)) * median_ms,
        status,
    )


@pytest.fixture(scope="module")
def seeded(settings):
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rng = np.random.default_rng(8)
    frames = {
        # a quiet hour of the champion, then its peak (slower: it queues), then a busier stretch
        # in which a newer version served almost everything
        "quiet": stretch(0, "stable", "p-v1", 600, 5.0, rng),
        "peak": stretch(60, "stable", "p-v1", 3000, 30.0, rng),
        "peak_canary": stretch(60, "canary", "p-v2", 300, 30.0, rng),
        "newer": stretch(120, "stable", "p-v2", 5000, 8.0, rng),
        "newer_old": stretch(120, "baseline", "p-v1", 150, 8.0, rng),
    }
    for frame in frames.values():
        insert_inference_logs(client, frame)
    return client, frames


def test_the_champions_p95_is_read_in_the_busiest_stretch_it_served(seeded):
    client, frames = seeded
    peak = query_peak_p95(client, START, START + timedelta(hours=3), "p-v1", min_requests=200)
    assert peak is not None
    # the newer version's stretch was busier, but the champion answered only ~150 there
    assert peak.start == START + timedelta(minutes=60)
    rows = frames["peak"]
    ok = np.sort(rows.loc[rows["status"] < 400, "latency_ms"].to_numpy())
    assert peak.requests == len(ok)
    assert peak.fleet_requests == peak.requests + int((frames["peak_canary"]["status"] < 400).sum())
    # quantileExact takes one of the rows at the 95th percentile
    assert ok[int(0.95 * len(ok)) - 1] <= peak.p95_ms <= ok[int(0.95 * len(ok))]
    assert peak.p95_ms > 30.0  # the peak's, not the quiet hour's (~5 ms)


def test_too_few_of_the_champions_requests_anywhere_gives_no_anchor(seeded):
    client, _ = seeded
    end = START + timedelta(hours=3)
    assert query_peak_p95(client, START, end, "p-v1", min_requests=10_000) is None
    assert query_peak_p95(client, START, end, "never-served", min_requests=1) is None
    # the lookback is honoured: before the peak, the quiet hour is all there is
    quiet = query_peak_p95(client, START, START + timedelta(minutes=30), "p-v1", min_requests=200)
    assert quiet is not None and quiet.start == START and quiet.p95_ms < 15.0

"""The shadow's query over the real embedded ClickHouse: its per-user sums, top-k overlaps and
quantiles are the numbers the same pairs give offline, and a tail-regressed candidate's pairs
are refused by the judge from them. Rows are written in 2035 so no other test's fall in the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

import logstore
from core.gate.rules import CanaryRules, ShadowRules
from core.gate.shadow import MirrorCounts, ShadowEvidence, judge_shadow
from logstore.log_tables import SHADOW_PAIR_COLUMNS
from logstore.shadow import LEVELS, query_shadow_pairs
from relay.types import Verdict

START = datetime(2035, 5, 1, tzinfo=UTC)
N = 3000


def test_clickhouse_pair_sums_equal_the_offline_ones_and_the_tail_is_refused(settings) -> None:
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rng = np.random.default_rng(3)
    users = rng.integers(0, 200, N)
    stable = np.exp(rng.normal(3.0, 0.5, N)).astype(np.float32)
    slow = rng.random(N) < 0.08  # a tail: 8 % of requests 4x slower
    shadow = (stable * np.where(slow, 4.0, 1.0) * np.exp(rng.normal(0, 0.05, N))).astype(np.float32)
    error = np.where(rng.random(N) < 0.004, "engine_error", "")
    items = np.argsort(rng.random((N, 1000)), axis=1)[:, :10].astype(np.uint64)  # distinct ids
    swapped = rng.random(N) < 0.3  # a third of answers differ in their top 5 by one item
    shown = items.copy()
    shown[swapped, 4] = 5000
    rows = [
        [
            START + timedelta(milliseconds=int(i * 10)),
            f"sq-{i}",
            int(users[i]),
            "sq-v1",
            "sq-v2",
            float(stable[i]),
            float(shadow[i]),
            str(error[i]),
            20,
            items[i].tolist(),
            shown[i].tolist() if not error[i] else [],
        ]
        for i in range(N)
    ]
    client.insert("shadow_pairs", rows, column_names=list(SHADOW_PAIR_COLUMNS))
    sums = query_shadow_pairs(client, START, START + timedelta(hours=1), "sq-v1", "sq-v2", 5)

    ok = error == ""
    d = np.log(shadow.astype(np.float64)) - np.log(stable.astype(np.float64))
    assert sums.pairs == N and sums.users == len(np.unique(users))
    assert sums.errors.x == (~ok).sum()
    assert sums.latency.n == ok.sum()
    assert sums.latency.x == pytest.approx(d[ok].sum(), rel=1e-6)
    per_user = np.bincount(users, weights=np.where(ok, d, 0.0))
    assert sums.latency.x_sq == pytest.approx((per_user**2).sum(), rel=1e-6)
    overlap = np.where(swapped, 0.8, 1.0)
    assert sums.agreement.x / sums.agreement.n == pytest.approx(overlap[ok].mean(), rel=1e-6)
    at = LEVELS.index(0.95)
    assert sums.shadow_quantiles_ms[at] == pytest.approx(np.quantile(shadow[ok], 0.95), rel=0.01)

    gate, _ = judge_shadow(sums, MirrorCounts(N, 0), ShadowRules(), CanaryRules(), ShadowEvidence())
    assert gate.verdict is Verdict.failed and "P95" in gate.reason, gate.reason
    assert gate.measurements["agreement"] == pytest.approx(overlap[ok].mean(), rel=1e-6)

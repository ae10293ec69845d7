"""The canary gate's queries over the real embedded ClickHouse: per-user sums and the rank test.

The judge trusts that ClickHouse's per-user sums are the same numbers an offline replay computes
from rows (`cohort_sums_of`, which the gate benchmark uses), so the two are compared here on one
set of rows. Rows are written in 2034 so no other test's rows fall in the window.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

import logstore
from logstore.feedback import query_click_cohorts
from logstore.impact import insert_inference_logs
from logstore.log_tables import FEEDBACK_COLUMNS, IMPRESSION_COLUMNS
from logstore.slo import (
    cohort_sums_of,
    paired_seconds_of,
    query_cohorts,
    query_paired_seconds,
    query_rank_test,
    query_request_rate,
)
from relay.types import Verdict
from tasks.canary_analysis import CanaryRules, StepEvidence, judge_window, read_step_figures
from tests.integration.log_rows import inference_log_rows

START = datetime(2034, 3, 1, tzinfo=UTC)


def rows(slot: str, version: str, n: int, factor: float, rng: np.random.Generator) -> pd.DataFrame:
    users = rng.integers(0, 300, n) + (0 if slot == "canary" else 1000)
    status = np.where(rng.random(n) < 0.02, 500, np.where(rng.random(n) < 0.01, 422, 200))
    return inference_log_rows(
        [START + timedelta(milliseconds=int(t)) for t in rng.uniform(0, 60_000, n)],
        [f"{slot}-{i}" for i in range(n)],
        users,
        slot,
        version,
        np.exp(rng.normal(3.0, 0.6, n)) * factor,
        status,
    )


@pytest.fixture(scope="module")
def seeded(settings):
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rng = np.random.default_rng(5)
    frames = {
        "canary": rows("canary", "q-v2", 3000, 1.6, rng),
        "baseline": rows("baseline", "q-v1", 3000, 1.0, rng),
        "stable": rows("stable", "q-v1", 2000, 1.0, rng),
    }
    for frame in frames.values():
        insert_inference_logs(client, frame)
    return client, frames


def test_request_rate_is_measured_over_the_span_the_traffic_covers(seeded):
    client, frames = seeded
    total = sum(len(f) for f in frames.values())
    first = min(f["ts"].min() for f in frames.values())
    # a five-minute lookback that began long before the traffic: its rate is over the traffic's span
    end = START + timedelta(minutes=1)
    rate = query_request_rate(client, end - timedelta(minutes=5), end)
    assert rate.requests == total
    assert rate.span_s == pytest.approx((end - first).total_seconds(), abs=0.01)
    assert rate.rps == pytest.approx(total / 60, rel=0.01)  # not diluted over five minutes
    quiet = query_request_rate(client, START - timedelta(minutes=5), START)
    assert quiet.requests == 0 and quiet.rps == 0.0


def test_clickhouse_per_user_sums_equal_the_offline_replay(seeded):
    client, frames = seeded
    got = {
        c.slot: c
        for c in query_cohorts(client, START, START + timedelta(minutes=1), ("canary", "baseline"))
    }
    assert set(got) == {"canary", "baseline"}  # stable was not asked for
    for slot in ("canary", "baseline"):
        f = frames[slot]
        want = cohort_sums_of(
            slot,
            f["model_version"].iloc[0],
            f["user_id"].to_numpy(),
            f["latency_ms"].to_numpy().astype(float),
            f["status"].to_numpy(),
            np.array([t.timestamp() for t in f["ts"]]),
        )
        have = got[slot]
        assert have.users == want.users and have.model_version == want.model_version
        for name in ("answered", "requests", "errors"):
            assert getattr(have, name) == getattr(want, name), name
        for name in ("log_sum", "log_sq"):
            assert getattr(have, name) == pytest.approx(getattr(want, name), rel=1e-5), name
        for clustering in ("by_user", "by_second"):
            h, w = getattr(have, clustering), getattr(want, clustering)
            assert h.clusters == w.clusters, clustering
            assert (h.aa, h.rr, h.ee, h.re) == (w.aa, w.rr, w.ee, w.re), clustering
            assert h.ss == pytest.approx(w.ss, rel=1e-5) and h.a_s == pytest.approx(w.a_s, rel=1e-5)
        assert have.by_second.clusters == 60  # a minute of rows, one cluster per second
        # quantileExact in ClickHouse, the same order statistic in the replay: the tail test's
        # quantiles and their neighbours agree to the row
        for name in ("p50_ms", "p95_ms", "p99_ms", "q93_ms", "q97_ms", "q985_ms", "q995_ms"):
            assert getattr(have, name) == pytest.approx(getattr(want, name), rel=1e-9), name
        assert have.requests < len(f)  # 4xx are the client's fault: neither latency nor error


def test_rank_test_sees_a_slower_canary_and_none_on_an_empty_window(seeded):
    client, frames = seeded
    users = sum(
        frames[s].loc[frames[s]["status"] < 400, "user_id"].nunique()
        for s in ("canary", "baseline")
    )
    test = query_rank_test(client, START, START + timedelta(minutes=1), "q-v2", "q-v1")
    assert test is not None and test.users == users and test.p_value < 1e-6
    empty = START + timedelta(days=1)
    assert query_rank_test(client, empty, empty + timedelta(minutes=1), "q-v2", "q-v1") is None


def test_step_figures_from_clickhouse_fail_a_canary_slower_by_60_percent(seeded):
    client, _ = seeded
    end = START + timedelta(minutes=1)
    figures = read_step_figures(client, START, START + timedelta(seconds=30), end, "q-v2", "q-v1")
    assert figures.stable is not None and figures.stable.requests > 1900
    assert figures.window_canary is not None and figures.window_canary.requests < 2000
    gate, _ = judge_window(figures, CanaryRules(), StepEvidence())
    assert gate.verdict is Verdict.failed and "relative to baseline" in gate.reason
    assert gate.measurements["mwu_p"] < 1e-6 and gate.measurements["window_mwu_p"] < 1e-3


def test_clickhouse_pairs_canary_and_baseline_by_second_as_the_replay_does(seeded):
    client, frames = seeded

    def rows(f: pd.DataFrame) -> tuple[np.ndarray, ...]:
        return (
            f["user_id"].to_numpy(),
            f["latency_ms"].to_numpy().astype(float),
            f["status"].to_numpy(),
            np.array([t.timestamp() for t in f["ts"]]),
        )

    have = query_paired_seconds(client, START, START + timedelta(minutes=1), "q-v2", "q-v1")
    want = paired_seconds_of(rows(frames["canary"]), rows(frames["baseline"]))
    assert have.seconds == want.seconds == 60
    for name in ("ac_ab", "ec_eb", "ec_rb", "rc_eb", "rc_rb"):
        assert getattr(have, name) == getattr(want, name), name
    for name in ("sc_sb", "sc_ab", "ac_sb"):
        assert getattr(have, name) == pytest.approx(getattr(want, name), rel=1e-5), name


def test_click_sums_per_user_credit_one_click_per_shown_item_and_ignore_strangers(settings):
    """Per-user impressions and clicked impressions of canary and baseline, as the judge reads
    them: clicks and orders on one item are one clicked impression, an item shown twice in a
    feed is credited once, other slots, versions and unknown requests count for nothing."""
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    at = START + timedelta(hours=2)
    rng = np.random.default_rng(8)
    impressions, feedback, want = [], [], {}
    for slot, version, users in (("canary", "c-v2", 40), ("baseline", "c-v1", 50)):
        per_user = {}
        for u in range(users):
            user = 10_000 * len(want) + u
            n = k = 0
            for r in range(int(rng.integers(1, 4))):
                request = f"{slot}-{u}-{r}"
                items = list(range(20))
                items[19] = items[0]  # item 0 shown twice: at rank 1 and rank 20
                for rank, item in enumerate(items, 1):
                    impressions.append((request, rank, slot, version, user, item))
                n += 20
                for item in set(rng.choice(19, int(rng.integers(0, 4)), replace=False)):
                    feedback.append((request, int(item), "click"))
                    if item % 2:  # ordered too: still one clicked impression
                        feedback.append((request, int(item), "order"))
                    k += 1
            per_user[user] = (n, k)
        want[slot] = per_user
    impressions += [("s-0", 1, "stable", "c-v1", 99, 1), ("x-0", 1, "canary", "other", 98, 1)]
    feedback += [("s-0", 1, "click"), ("x-0", 1, "click"), ("nobody-served-this", 3, "click")]
    frame = pd.DataFrame(
        impressions, columns=["request_id", "rank", "slot", "model_version", "user_id", "item_id"]
    )
    for name in IMPRESSION_COLUMNS:
        if name not in frame:
            frame[name] = 0.0 if name not in ("lineage_id", "session_id") else "l"
    frame["ts"] = at
    frame["rank"] = frame["rank"].astype(np.uint16)
    for name in (
        "user_id",
        "item_id",
        "category_id",
        "brand_id",
        "device_type",
        "hour",
        "weekday",
        "position",
        "region_id",
    ):
        frame[name] = frame[name].astype(np.uint64)
    client.insert_df("impressions", frame[list(IMPRESSION_COLUMNS)])
    fb = pd.DataFrame(feedback, columns=["request_id", "item_id", "event"])
    fb["ts"], fb["order_value"] = at + timedelta(seconds=2), 0.0
    fb["feedback_id"] = [f"cq-{i}" for i in range(len(fb))]
    fb["item_id"] = fb["item_id"].astype(np.uint64)
    client.insert_df("feedback", fb[list(FEEDBACK_COLUMNS)])

    got = query_click_cohorts(client, at, at + timedelta(minutes=1), "c-v2", "c-v1")
    assert set(got) == {"canary", "baseline"}
    for slot, per_user in want.items():
        n = np.array([v[0] for v in per_user.values()], dtype=float)
        k = np.array([v[1] for v in per_user.values()], dtype=float)
        have = got[slot]
        assert (have.users, have.impressions, have.clicked) == (len(n), n.sum(), k.sum()), slot
        assert (have.nn, have.kk, have.nk) == ((n * n).sum(), (k * k).sum(), (n * k).sum()), slot

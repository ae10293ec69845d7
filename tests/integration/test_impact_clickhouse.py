"""The impact report over the real embedded ClickHouse: the join, orphan counts, and the causal
estimates recovering a planted effect while the naive correlation stays biased.

Every test seeds its own window (in 2033) and its own model-version names, because the whole
test session shares one chdb path with other tests.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

import logstore
from core.impact.analysis import analyse_impact as analyse
from core.impact.types import ImpactFinding, ImpactOptions, ImpactReport, ImpactWindow
from logstore.impact import (
    INFERENCE_LOG_COLUMNS,
    count_join_coverage,
    insert_inference_logs,
    insert_user_sessions,
    read_latency_histogram,
    read_latency_profile,
    read_session_outcomes,
)
from simulation.sessions import (
    CANARY,
    STABLE,
    SessionWorld,
    SlotTraffic,
    TrafficConfig,
    seed_traffic,
    simulate_traffic,
)
from tasks.impact import query_impact_sessions

NOW = datetime(2033, 6, 1, tzinfo=UTC)  # the clock the analyses are stamped with

HOUR = timedelta(hours=1)
OPTIONS = ImpactOptions(min_sessions=300, refutation_simulations=3, min_sessions_per_slot=50)


def window(day: int, hours: int = 6) -> ImpactWindow:
    start = datetime(2033, 5, day, tzinfo=UTC)
    return ImpactWindow(start=start, end=start + timedelta(hours=hours))


def slots(tag: str, canary_share: float = 0.2) -> tuple[SlotTraffic, ...]:
    return (
        SlotTraffic(STABLE, f"{tag}-stable", f"{tag}_s", 1 - canary_share),
        SlotTraffic(CANARY, f"{tag}-canary", f"{tag}_c", canary_share, extra_latency_ms=25.0),
    )


@pytest.fixture(scope="module")
def client(settings):
    return logstore.connect(settings.resolved_clickhouse_dsn)


def run_report(settings, w: ImpactWindow, versions: list[str]) -> ImpactReport:
    data = query_impact_sessions.fn(settings, w, versions, HOUR)
    return analyse(data, OPTIONS, now=NOW)


# -- the join --------------------------------------------------------------------------------
def test_per_session_aggregates_from_clickhouse_match_the_raw_rows(client):
    w = window(1)
    traffic = simulate_traffic(
        TrafficConfig(n_sessions=800, seed=31, slots=slots("agg")), w.start, w.end
    )
    insert_user_sessions(client, traffic.sessions)
    insert_inference_logs(client, traffic.logs)

    got = read_session_outcomes(client, w.start, w.end).set_index("session_id")
    expected = traffic.logs.groupby("session_id").agg(
        exp_requests=("latency_ms", "size"),
        exp_latency=("latency_ms", "mean"),
        exp_version=("model_version", "first"),
        exp_slot=("slot", "first"),
        exp_failed=("status", lambda s: int((s >= 500).sum())),
    )
    assert len(got) == 800
    joined = expected.join(got, how="inner")
    assert len(joined) == 800
    # A session starting near the window's end logs requests after it: every one is counted.
    assert (joined["exp_requests"] == joined["requests"]).all()
    np.testing.assert_allclose(joined["exp_latency"], joined["latency_mean_ms"], rtol=1e-5)
    assert (joined["exp_version"] == joined["model_version"]).all()
    assert (joined["exp_slot"] == joined["slot"]).all()
    assert (joined["exp_failed"] == joined["failed_requests"]).all()
    assert (joined["mixed_versions"] == 0).all()
    assert (joined["latency_p95_ms"] >= joined["latency_mean_ms"] * 0.9).all()
    sessions = traffic.sessions.set_index("session_id")
    np.testing.assert_allclose(got["gmv"], sessions.loc[got.index, "gmv"])
    assert (got["device_type"] == sessions.loc[got.index, "device_type"]).all()

    canary_only = read_session_outcomes(client, w.start, w.end, ["agg-canary"])
    assert set(canary_only["model_version"]) == {"agg-canary"}
    assert len(canary_only) == int((expected["exp_version"] == "agg-canary").sum())

    profile = read_latency_profile(client, w.start, w.end).set_index("model_version")
    assert profile.loc["agg-canary", "p95_ms"] > profile.loc["agg-stable", "p95_ms"]
    assert int(profile["requests"].sum()) == int(
        ((traffic.logs["ts"] >= w.start) & (traffic.logs["ts"] < w.end)).sum()
    )
    histogram = read_latency_histogram(client, w.start, w.end, 25.0, 40)
    assert int(histogram["requests"].sum()) == int(profile["requests"].sum())
    assert histogram["bin_start_ms"].max() <= 39 * 25.0


def test_orphans_are_counted_not_silently_dropped(client, settings):
    w = window(3)
    traffic = simulate_traffic(
        TrafficConfig(n_sessions=500, seed=32, slots=slots("orph")), w.start, w.end
    )
    sessions, logs = traffic.sessions, traffic.logs
    lonely = sessions.iloc[:40]["session_id"]  # these sessions lose every request
    unknown = sessions.iloc[40:65]["session_id"]  # these requests lose their session
    kept_logs = logs[~logs["session_id"].isin(lonely)]
    insert_user_sessions(client, sessions[~sessions["session_id"].isin(unknown)])
    insert_user_sessions(client, sessions.iloc[100:103])  # duplicates, as a retried insert makes
    insert_inference_logs(client, kept_logs)

    coverage = count_join_coverage(client, w.start, w.end, HOUR)
    in_window = (kept_logs["ts"] >= w.start) & (kept_logs["ts"] < w.end)
    orphan_rows = kept_logs[in_window & kept_logs["session_id"].isin(unknown)]
    assert coverage.sessions == 475 and coverage.session_rows == 478
    assert coverage.duplicate_session_rows == 3
    assert coverage.sessions_without_requests == 40
    assert coverage.requests == int(in_window.sum())
    assert coverage.requests_without_session == len(orphan_rows) > 0
    assert coverage.unknown_session_ids == 25

    joined = read_session_outcomes(client, w.start, w.end)
    assert len(joined) == 435 and joined["session_id"].is_unique

    report = run_report(settings, w, [])
    assert report.coverage["sessions_without_requests"] == 40
    assert report.coverage["requests_without_session"] == len(orphan_rows)
    text = " ".join(report.caveats)
    assert "40 of 475 sessions logged no inference request" in text
    assert "(25 session ids) have no user_sessions row" in text
    assert "3 duplicate user_sessions rows" in text


def test_a_session_served_by_two_versions_counts_for_its_majority_version(client):
    w = window(4)
    traffic = simulate_traffic(
        TrafficConfig(n_sessions=50, seed=35, slots=slots("mix")), w.start, w.end
    )
    logs = traffic.logs.copy()
    first = traffic.sessions["session_id"].iloc[0]
    rows = logs.index[logs["session_id"] == first]
    minority = rows[: max(1, len(rows) // 4)]  # a quarter of its requests hit the other slot
    other = "mix-canary" if logs.loc[rows[-1], "model_version"] == "mix-stable" else "mix-stable"
    logs.loc[minority, "model_version"] = other
    majority = logs.loc[rows[-1], "model_version"]
    insert_user_sessions(client, traffic.sessions)
    insert_inference_logs(client, logs)

    got = read_session_outcomes(client, w.start, w.end).set_index("session_id")
    assert got.loc[first, "model_version"] == majority
    assert got.loc[first, "mixed_versions"] == 1
    assert int(got["mixed_versions"].sum()) == 1


def test_requests_still_in_the_serving_spool_are_ingested_before_the_report(client, settings):
    from logstore.spool import SpoolWriter

    w = window(8)
    traffic = simulate_traffic(
        TrafficConfig(n_sessions=120, seed=36, slots=slots("spool")), w.start, w.end
    )
    insert_user_sessions(client, traffic.sessions)
    epoch = pd.Timestamp(0, tz="UTC")
    logs = traffic.logs.assign(ts=(traffic.logs["ts"] - epoch) / pd.Timedelta(seconds=1))
    rows = list(logs[list(INFERENCE_LOG_COLUMNS)].itertuples(index=False, name=None))
    SpoolWriter(settings.resolved_spool_dir, 1 << 30, "impact-test").write(rows)
    assert read_session_outcomes(client, w.start, w.end).empty  # not yet in ClickHouse

    data = query_impact_sessions.fn(settings, w, [], HOUR)
    assert len(data.sessions) == 120
    assert data.coverage.requests > 0 and data.coverage.requests_without_session == 0
    assert not list(settings.resolved_spool_dir.glob("impact-test-*"))


# -- bad input -------------------------------------------------------------------------------
def test_empty_window_gives_a_no_data_report_not_a_crash(settings):
    report = run_report(settings, window(5), [])
    assert report.finding is ImpactFinding.no_data
    assert "no sessions and no requests" in report.headline
    assert report.coverage["sessions"] == 0 and report.estimates == []


def test_unknown_versions_give_no_data_naming_them(client, settings):
    w = window(6)
    seed_traffic(
        client, TrafficConfig(n_sessions=200, seed=33, slots=slots("known")), w.start, w.end
    )
    report = run_report(settings, w, ["never-deployed"])
    assert report.finding is ImpactFinding.no_data
    assert "for versions never-deployed" in report.headline
    assert report.coverage["sessions"] == 200


def test_one_device_only_drops_the_covariate_and_still_estimates(client, settings):
    w = window(7)
    world = SessionWorld(device_share=(0.0, 1.0, 0.0))
    config = TrafficConfig(
        n_sessions=1_500, seed=34, gmv_per_ms=-0.1, slots=slots("ios"), world=world
    )
    seed_traffic(client, config, w.start, w.end)
    report = run_report(settings, w, [])
    assert report.covariates == ["user_age"]
    assert any("device_type has a single value (ios)" in n for n in report.notes)
    assert ("device_type", "latency_mean_ms") not in report.graph_edges
    causal = report.causal
    assert causal is not None and causal.covers(-0.1)
    assert report.finding is not ImpactFinding.no_data


# -- correctness -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def planted(client, settings) -> ImpactReport:
    w = window(10, hours=12)
    config = TrafficConfig(n_sessions=5_000, seed=41, gmv_per_ms=-0.12, slots=slots("plant"))
    seed_traffic(client, config, w.start, w.end)
    return run_report(settings, w, ["plant-stable", "plant-canary"])


@pytest.fixture(scope="module")
def null_effect(client, settings) -> ImpactReport:
    # A correct 95 % interval misses the truth in 1 seed of 20 (seed 42 is one: -0.041 GMV/ms,
    # p = 0.008); that the intervals are calibrated across seeds is checked in
    # tests/unit/test_impact_calibration.py, so one fixed seed here tests the pipeline.
    w = window(12, hours=12)
    config = TrafficConfig(n_sessions=5_000, seed=43, gmv_per_ms=0.0, slots=slots("null"))
    seed_traffic(client, config, w.start, w.end)
    return run_report(settings, w, [])


def test_causal_estimates_recover_the_planted_effect_while_naive_is_biased(planted):
    by_key = {e.key: e for e in planted.estimates}
    assert by_key["dowhy_backdoor"].covers(-0.12), by_key["dowhy_backdoor"]
    assert by_key["dowhy_frontdoor"].covers(-0.12), by_key["dowhy_frontdoor"]
    assert by_key["ols"].covers(-0.12)
    naive = by_key["naive"]
    assert not naive.covers(-0.12) and naive.value < -0.12  # device confounding exaggerates it
    assert planted.finding is ImpactFinding.effect_detected
    assert all(r.passed for r in planted.refutations)
    t = planted.translation
    assert t is not None and t.ci_low < -0.12 * t.sessions_per_day < t.ci_high
    assert t.sessions_per_day == pytest.approx(10_000, rel=0.01)  # 5,000 sessions in 12 h


def test_canary_latency_difference_and_its_gmv_are_estimated(planted):
    slots_ = planted.slots
    assert slots_ is not None and slots_.available
    assert slots_.canary_version == "plant-canary" and slots_.stable_version == "plant-stable"
    low, high = slots_.latency_diff_ci or (0.0, 0.0)
    assert low > 0  # the canary was built 25 ms slower per request
    assert slots_.implied_gmv_per_day is not None and slots_.implied_gmv_per_day < 0


def test_zero_planted_effect_gives_an_interval_covering_zero(null_effect):
    causal = null_effect.causal
    assert causal is not None and causal.covers(0.0), causal
    frontdoor = null_effect.estimate("dowhy_frontdoor")
    assert frontdoor is not None and frontdoor.covers(0.0), frontdoor
    naive = null_effect.estimate("naive")
    assert naive is not None and naive.ci_high < 0  # the raw correlation still "finds" a cost
    assert null_effect.finding is ImpactFinding.no_detectable_effect
    assert "cannot tell the effect from zero" in null_effect.headline
    placebo = next(r for r in null_effect.refutations if r.key == "placebo")
    assert placebo.passed and abs(placebo.new_effect) <= placebo.tolerance


def test_only_per_session_rows_reach_python(planted):
    # 5,000 sessions made ~100,000 requests; one row per session left ClickHouse.
    assert planted.coverage["sessions_joined"] == planted.sessions == 5_000
    assert planted.coverage["requests"] > 90_000
    versions = {p["model_version"] for p in planted.latency_profile}
    assert versions == {"plant-stable", "plant-canary"}

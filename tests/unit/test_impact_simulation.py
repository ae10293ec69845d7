"""The session simulator: the planted effect is what it says, and zero means zero."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from simulation.sessions import (
    CANARY,
    STABLE,
    SessionWorld,
    SlotTraffic,
    TrafficConfig,
    session_outcomes,
    simulate_traffic,
)

START = datetime(2030, 3, 1, tzinfo=UTC)
END = START + timedelta(hours=4)


def _outcomes(latency: float, n: int, effect: float, seed: int = 3):
    rng = np.random.default_rng(seed)
    device = np.random.default_rng(99).integers(0, 3, n)
    age = np.random.default_rng(98).uniform(18, 70, n)
    return session_outcomes(np.full(n, latency), device, age, rng, effect)


def test_zero_effect_makes_outcomes_identical_whatever_the_latency():
    fast, slow = _outcomes(60.0, 5_000, 0.0), _outcomes(600.0, 5_000, 0.0)
    np.testing.assert_array_equal(fast.session_length_s, slow.session_length_s)
    np.testing.assert_array_equal(fast.gmv, slow.gmv)
    np.testing.assert_array_equal(fast.orders, slow.orders)


def test_planted_effect_moves_expected_gmv_by_effect_per_ms():
    effect, n = -0.08, 200_000
    fast, slow = _outcomes(100.0, n, effect), _outcomes(200.0, n, effect)
    diff = slow.gmv - fast.gmv  # common random numbers keep the noise of the difference small
    standard_error = diff.std(ddof=1) / np.sqrt(n)
    assert abs(diff.mean() - effect * 100) < 4 * standard_error
    world = SessionWorld()
    expected_seconds = effect / world.gmv_per_session_s * 100
    assert np.median(slow.session_length_s - fast.session_length_s) == pytest.approx(
        expected_seconds
    )


def test_outcomes_are_realistic_non_negative_and_lumpy():
    out = _outcomes(150.0, 20_000, -0.05)
    assert (out.gmv >= 0).all() and (out.orders >= 0).all()
    assert ((out.orders == 0) == (out.gmv == 0)).all()
    assert 0.1 < (out.orders == 0).mean() < 0.5
    assert (out.session_length_s >= SessionWorld().min_session_s).all()


def test_session_outcomes_rejects_misaligned_inputs_and_unknown_devices():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="must align"):
        session_outcomes(np.ones(3), np.zeros(2, int), np.ones(3), rng, 0.0)
    with pytest.raises(ValueError, match="device codes"):
        session_outcomes(np.ones(2), np.array([0, 3]), np.ones(2), rng, 0.0)


def test_simulated_requests_belong_to_their_sessions_and_slots():
    config = TrafficConfig(
        n_sessions=2_000,
        seed=5,
        slots=(
            SlotTraffic(STABLE, "sim-v1", "l1", 0.8),
            SlotTraffic(CANARY, "sim-v2", "l2", 0.2, extra_latency_ms=40.0),
        ),
    )
    traffic = simulate_traffic(config, START, END)
    sessions, logs = traffic.sessions, traffic.logs
    assert len(sessions) == 2_000 and sessions["session_id"].is_unique
    assert set(logs["session_id"]) == set(sessions["session_id"])
    joined = logs.merge(sessions[["session_id", "started_at", "session_length_s"]], on="session_id")
    offset_s = (joined["ts"] - joined["started_at"]).dt.total_seconds()
    assert (offset_s >= 0).all() and (offset_s <= joined["session_length_s"] + 1e-3).all()
    assert sessions["started_at"].min() >= START and sessions["started_at"].max() < END
    assert set(sessions["device_type"]) == {"web", "ios", "android"}
    per_session_slots = logs.groupby("session_id")["slot"].nunique()
    assert (per_session_slots == 1).all()  # a session sticks to one slot, as the router does
    share = logs.drop_duplicates("session_id")["slot"].eq(CANARY).mean()
    assert 0.15 < share < 0.25
    latency = logs.groupby("slot")["latency_ms"].mean()
    assert latency[CANARY] > latency[STABLE] + 20
    parts = logs[["queue_ms", "preprocess_ms", "compute_ms", "postprocess_ms"]].sum(axis=1)
    np.testing.assert_allclose(parts, logs["latency_ms"], rtol=1e-4)


def test_device_confounds_latency_and_spending():
    traffic = simulate_traffic(TrafficConfig(n_sessions=6_000, seed=8, gmv_per_ms=0.0), START, END)
    latency = traffic.logs.groupby("session_id")["latency_ms"].mean().rename("latency")
    frame = traffic.sessions.join(latency, on="session_id")
    by_device = frame.groupby("device_type")[["latency", "gmv"]].mean()
    # Android waits longest and spends least: the confounding the report has to undo.
    assert by_device.loc["android", "latency"] > by_device.loc["web", "latency"] + 50
    assert by_device.loc["android", "gmv"] < by_device.loc["ios", "gmv"] - 20


def test_same_seed_same_traffic_and_bad_configs_refused():
    config = TrafficConfig(n_sessions=300, seed=2)
    first, second = simulate_traffic(config, START, END), simulate_traffic(config, START, END)
    assert first.sessions.equals(second.sessions) and first.logs.equals(second.logs)
    with pytest.raises(ValueError, match="end must be after start"):
        simulate_traffic(config, END, START)
    bad = TrafficConfig(n_sessions=10, slots=(SlotTraffic(STABLE, "a", "l", 0.5),))
    with pytest.raises(ValueError, match="sum to 1"):
        simulate_traffic(bad, START, END)

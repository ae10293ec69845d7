"""bench.gate's replay draws cohorts as live routing would: new users, never shared, rows kept
together per user; so a replayed A/A release from a short recording decides as a live one does."""

from __future__ import annotations

import numpy as np

from bench.gate_replay import (
    REGRESSIONS,
    STEPS,
    Load,
    Recording,
    plan_for,
    replay_release,
)
from core.gate.rules import CanaryRules


def recording(seed: int, rps: float = 70.0, seconds: int = 60, users: int = 1500) -> Load:
    """A minute at 70 req/s (4,200 rows, as short as bench.gate's quick recordings): lognormal
    latencies with a per-second load swing and a per-user effect, 0.1 % of requests 5xx."""
    rng = np.random.default_rng(seed)
    n = int(rps * seconds)
    ts = np.sort(rng.uniform(0, seconds, n))
    swing = np.exp(0.3 * rng.standard_normal(seconds + 1))[ts.astype(int)]
    user = rng.integers(0, users, n)
    per_user = np.exp(0.2 * rng.standard_normal(users))[user]
    latency = 20.0 * swing * per_user * np.exp(0.8 * rng.standard_normal(n))
    status = np.where(rng.random(n) < 0.001, 500, 200)
    half = rng.random(n) < 0.5
    slot = [Recording(ts[m], user[m], latency[m], status[m]) for m in (half, ~half)]
    return Load("light", slot[0], slot[1], rps)


def outcomes(load: Load, rps: float, regression: str, releases: int) -> list[str]:
    rules = CanaryRules()
    plan = plan_for(load, rps, rules)
    rng = np.random.default_rng(7)
    return [
        replay_release(load, rps, REGRESSIONS[regression], rules, plan, rng, 1.0).outcome
        for _ in range(releases)
    ]


def test_replayed_cohorts_are_new_users_never_shared_with_each_users_rows_together() -> None:
    load = recording(0)
    rng = np.random.default_rng(1)
    canary, baseline = load.draw(rng, 3000, 3000, 2)
    assert len(canary[0]) == len(baseline[0]) == 3000
    assert not set(canary[0]) & set(baseline[0])  # sticky routing: no user in both slots
    assert not set(canary[0]) & set(load.pooled.user)  # fresh ids, not the recorded users
    later, _ = load.draw(rng, 3000, 3000, 3)
    assert not set(later[0]) & set(canary[0])  # each window's draws are new users too
    # a drawn user brings its recorded rows, so users keep their share of repeat requests
    _, per_user = np.unique(canary[0], return_counts=True)
    assert per_user.mean() > 1.5


def test_an_equal_release_from_a_short_recording_is_promoted_without_a_person() -> None:
    """Drawing rows (the old replay) paused 12 of 12 of these: both cohorts shared the
    recording's users and each row was reused tens of times, so no look could pass."""
    load = recording(0)
    fast = outcomes(load, 500.0, "aa", 12)
    assert fast.count("promoted") >= 11, fast
    assert "rolled_back" not in fast


def test_a_uniformly_slower_candidate_is_still_rolled_back_from_the_same_recording() -> None:
    load = recording(0)
    slow = outcomes(load, 500.0, "uniform x1.5", 12)
    assert slow.count("rolled_back") == 12, slow
    assert STEPS[0] == 5  # the replay walks the flow's steps


def test_the_split_replay_brings_new_users_every_window_and_catches_a_skew_from_them() -> None:
    # The sample-ratio check counts users, so its evidence grows only as new users arrive, as
    # they do live. Re-drawing the recording's own 1,500 users every window (the bench until
    # 2026-12-07) capped the evidence at them: 2 windows here already hold far more.
    from bench.gate_replay import split_check

    load = recording(2)
    got = split_check(load, replays=2, seed=9, max_windows=10)
    distinct = len(np.unique(np.concatenate([load.canary.user, load.baseline.user])))
    assert got["users_in_2_windows_median"] > 3 * distinct  # old: at most `distinct`
    # ~3,300 new users a window: within 10 windows a 6 % canary is told from 5 % every time
    assert got["detected_within_max_windows"] == 1.0
    assert got["aa_flag_rate"] == 0.0

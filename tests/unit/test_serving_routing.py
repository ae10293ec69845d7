"""Routing: sticky per-user buckets and the stable/canary table's transitions."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from serving.routing import (
    BASELINE,
    CANARY,
    STABLE,
    Injection,
    RoutingTable,
    perturbed,
    route_bucket,
)
from serving.schema import RequestRejected


@dataclass(frozen=True)
class Model:
    version: str


OLD, NEW = Model("v1"), Model("v2")


def test_bucket_is_the_same_in_another_process_with_another_hash_seed() -> None:
    users = list(range(0, 5000, 37))
    here = [route_bucket(u, "v2") for u in users]
    code = (
        "from serving.routing import route_bucket;"
        f"print([route_bucket(u, 'v2') for u in {users!r}])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert eval(there) == here  # noqa: S307 - our own subprocess's printed list


def test_buckets_are_roughly_uniform_and_differ_by_canary() -> None:
    buckets = [route_bucket(u, "v2") for u in range(20_000)]
    share_below_10 = sum(b < 10 for b in buckets) / len(buckets)
    assert 0.09 < share_below_10 < 0.11
    other = [route_bucket(u, "v3") for u in range(20_000)]
    assert sum(a == b for a, b in zip(buckets, other, strict=True)) < 0.05 * len(buckets)


def test_assignment_is_sticky_and_raising_the_weight_only_adds_users() -> None:
    table = RoutingTable(stable=OLD).with_loaded(CANARY, NEW).with_weight(5)
    users = range(10_000)
    at5 = {u for u in users if table.route(u) == (CANARY, NEW)}
    assert at5 == {u for u in users if table.route(u) == (CANARY, NEW)}  # same answer twice
    at25 = {u for u in users if table.with_weight(25).route(u) == (CANARY, NEW)}
    assert at5 < at25
    assert 0.03 < len(at5) / 10_000 < 0.07 and 0.22 < len(at25) / 10_000 < 0.28


def test_weight_zero_and_hundred() -> None:
    table = RoutingTable(stable=OLD).with_loaded(CANARY, NEW)
    assert all(table.route(u) == (STABLE, OLD) for u in range(500))
    assert all(table.with_weight(100).route(u) == (CANARY, NEW) for u in range(500))


def test_no_stable_means_no_route() -> None:
    assert RoutingTable().route(1) is None


def test_loading_a_canary_resets_its_weight_to_zero() -> None:
    table = RoutingTable(stable=OLD).with_loaded(CANARY, NEW).with_weight(30)
    reloaded = table.with_loaded(CANARY, Model("v3"))
    assert reloaded.canary_weight == 0 and reloaded.canary == Model("v3")
    assert table.canary_weight == 30  # tables are values: the old one is untouched


def test_promote_moves_canary_to_stable_and_empties_the_canary() -> None:
    promoted = RoutingTable(stable=OLD).with_loaded(CANARY, NEW).with_weight(50).promoted()
    assert promoted.stable == NEW and promoted.canary is None and promoted.canary_weight == 0
    assert promoted.models() == {NEW}


def test_rollback_unloads_the_canary_and_is_idempotent() -> None:
    rolled = RoutingTable(stable=OLD).with_loaded(CANARY, NEW).with_weight(50).rolled_back()
    assert rolled.canary is None and rolled.canary_weight == 0 and rolled.stable == OLD
    assert rolled.rolled_back() == rolled


@pytest.mark.parametrize("weight", [-1, 101, 2.5, "10", True])
def test_weight_must_be_an_integer_percentage(weight: object) -> None:
    with pytest.raises(RequestRejected) as info:
        RoutingTable(stable=OLD).with_loaded(CANARY, NEW).with_weight(weight)  # type: ignore[arg-type]
    assert info.value.code == "bad_weight" and info.value.status == 400


def test_weight_or_promote_without_a_canary_is_a_conflict() -> None:
    table = RoutingTable(stable=OLD)
    for change in (lambda: table.with_weight(10), table.promoted):
        with pytest.raises(RequestRejected) as info:
            change()
        assert info.value.code == "no_canary" and info.value.status == 409
    assert table.with_weight(0).canary_weight == 0


def test_injected_latency_is_per_slot_and_bounded() -> None:
    table = RoutingTable(stable=OLD).with_latency(CANARY, 80)
    assert table.injection(CANARY) == Injection(80.0, 1.0)
    assert table.injection(STABLE) == Injection() and table.injection(BASELINE) == Injection()
    for bad_slot, ms in (("blue", 5), (CANARY, -1), (CANARY, 10**6)):
        with pytest.raises(RequestRejected):
            table.with_latency(bad_slot, ms)
    for bad_factor in (0.5, 0, 1000, "2"):
        with pytest.raises(RequestRejected):
            table.with_latency(CANARY, 0, bad_factor)  # type: ignore[arg-type]


def test_injected_latency_targets_one_stage_and_refuses_unknown_ones() -> None:
    table = RoutingTable(stable=OLD).with_latency(CANARY, 20, stage="preprocess")
    assert table.injection(CANARY) == Injection(20.0, 1.0, "preprocess")
    assert RoutingTable(stable=OLD).with_latency(CANARY, 20).injection(CANARY).stage == "compute"
    with pytest.raises(RequestRejected) as info:
        table.with_latency(CANARY, 20, stage="network")
    assert info.value.code == "bad_stage" and "network" in info.value.detail
    assert table.injection(CANARY).stage == "preprocess"


def test_slowdown_multiplies_the_time_a_request_took() -> None:
    slow = RoutingTable(stable=OLD).with_latency(CANARY, 0, 1.5).injection(CANARY)
    assert slow.extra_s(0.020) == pytest.approx(0.010)  # 20 ms becomes 30 ms
    assert Injection(5.0, 2.0).extra_s(0.010) == pytest.approx(0.015)


def test_canary_and_baseline_get_equal_disjoint_cohorts_and_stable_the_rest() -> None:
    base = Model("v1")  # the stable version, loaded again: a different object in its own slot
    table = (
        RoutingTable(stable=OLD)
        .with_loaded(CANARY, NEW)
        .with_loaded(BASELINE, base)
        .with_weight(25)
    )
    users = range(40_000)
    slots = [r[0] for u in users if (r := table.route(u)) is not None]
    shares = {slot: slots.count(slot) / len(slots) for slot in (CANARY, BASELINE, STABLE)}
    assert shares[CANARY] == pytest.approx(0.25, abs=0.01)
    assert shares[BASELINE] == pytest.approx(0.25, abs=0.01)
    assert shares[STABLE] == pytest.approx(0.50, abs=0.01)
    # raising the weight only adds users to the canary: nobody leaves it
    wider = table.with_weight(50)
    assert all(wider.route(u)[0] == CANARY for u in users if table.route(u)[0] == CANARY)  # type: ignore[index]


def test_baseline_caps_the_canary_weight_at_half_and_leaves_with_it() -> None:
    table = RoutingTable(stable=OLD).with_loaded(CANARY, NEW).with_loaded(BASELINE, Model("v1"))
    with pytest.raises(RequestRejected) as info:
        table.with_weight(60)
    assert info.value.code == "bad_weight" and "50%" in info.value.detail
    assert table.with_weight(50).rolled_back().models() == {OLD}
    promoted = table.with_weight(50).promoted()
    assert promoted.stable is NEW and promoted.baseline is None and promoted.canary is None


def test_a_perturbed_ranking_reorders_the_feed_but_keeps_every_score() -> None:
    scores = np.array([0.2, 0.9, 0.05, 0.4], dtype=np.float32)
    rng = np.random.default_rng(0)
    upside_down = perturbed(scores, "reversed", rng)
    assert sorted(upside_down) == sorted(scores)
    assert list(np.argsort(-upside_down)) == list(np.argsort(-scores))[::-1]
    assert perturbed(scores, "model", rng) is scores
    shuffled = [tuple(perturbed(scores, "shuffled", rng)) for _ in range(20)]
    assert all(sorted(s) == sorted(scores) for s in shuffled) and len(set(shuffled)) > 1


def test_ranking_is_per_slot_and_refuses_unknown_ones() -> None:
    table = RoutingTable(stable=OLD, canary=NEW).with_ranking(CANARY, "reversed")
    assert table.ranking(CANARY) == "reversed" and table.ranking(STABLE) == "model"
    assert table.with_latency(CANARY, 5.0).ranking(CANARY) == "reversed"  # independent of latency
    with pytest.raises(RequestRejected) as bad:
        table.with_ranking(CANARY, "upside-down")
    assert bad.value.code == "bad_ranking" and "model, reversed, shuffled" in bad.value.detail
    with pytest.raises(RequestRejected):
        table.with_ranking("gold", "model")

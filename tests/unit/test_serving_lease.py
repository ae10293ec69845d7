"""The canary lease (dead-man's switch) on a clock the test moves: no sleeping.

A canary weight above 0 holds only while the release renews it; a lease that runs out takes
the weight to 0 on that worker alone, with every model left loaded.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from relay.settings import Settings
from relay.types import CanaryRemoval
from serving.metrics import ServingMetrics
from serving.routing import (
    BASELINE,
    CANARY,
    STABLE,
    CanaryLease,
    RoutingTable,
    check_removal_reason,
    grant_lease,
)
from serving.schema import RequestRejected
from serving.worker import Served, Worker


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Model:
    version: str


OLD, NEW = Model("v1"), Model("v2")


def leased(weight: int = 20, length_s: float = 30.0, now: float = 1000.0) -> RoutingTable[Model]:
    table = RoutingTable(stable=OLD).with_loaded(CANARY, NEW).with_loaded(BASELINE, Model("v1"))
    return table.with_weight(weight, grant_lease(length_s, now, max_s=600))


# -- the table: pure transitions -------------------------------------------------------------------


def test_a_lease_holds_the_weight_until_its_end_then_the_weight_is_zero() -> None:
    table = leased()
    assert table.lapsed(1029.99) is table  # nothing to do: the very same table
    lapsed = table.lapsed(1030.0)
    assert lapsed.canary_weight == 0 and lapsed.lease == CanaryLease(30.0, 1030.0, lapsed=True)
    assert lapsed.models() == table.models()  # stable, canary, baseline all still loaded
    assert all(lapsed.route(u)[0] == STABLE for u in range(2000))  # type: ignore[index]
    assert lapsed.lapsed(2000.0) is lapsed  # runs out once


def test_a_renewal_moves_the_end_and_keeps_the_weight() -> None:
    table = leased().renewed(grant_lease(30.0, 1025.0, 600), now=1025.0)
    assert table.canary_weight == 20 and table.lapsed(1054.9) is table
    assert table.lapsed(1055.0).canary_weight == 0


def test_renewing_a_lapsed_lease_is_a_conflict_naming_when_it_ran_out() -> None:
    lapsed = leased().lapsed(1030.0)
    with pytest.raises(RequestRejected) as info:
        lapsed.renewed(grant_lease(30.0, 1042.0, 600), now=1042.0)
    assert (info.value.code, info.value.status) == ("lease_expired", 409)
    assert "ran out 12.0 s ago" in info.value.detail and "set the weight again" in info.value.detail


def test_renewing_without_a_canary_or_at_weight_zero_is_a_conflict() -> None:
    fresh = grant_lease(30.0, 1000.0, 600)
    for table, code in (
        (RoutingTable(stable=OLD), "no_canary"),
        (RoutingTable(stable=OLD).with_loaded(CANARY, NEW), "no_lease"),
        (leased().with_weight(0), "no_lease"),
    ):
        with pytest.raises(RequestRejected) as info:
            table.renewed(fresh, now=1000.0)
        assert (info.value.code, info.value.status) == (code, 409)


def test_every_way_to_weight_zero_drops_the_lease() -> None:
    table = leased()
    assert table.with_weight(0).lease is None
    assert table.rolled_back().lease is None and table.promoted().lease is None
    assert table.with_loaded(CANARY, Model("v3")).lease is None  # a new canary starts at 0
    assert table.with_latency(CANARY, 5).lease == table.lease  # unrelated changes keep it


def test_setting_the_weight_again_after_a_lapse_starts_a_fresh_lease() -> None:
    again = leased().lapsed(1030.0).with_weight(25, grant_lease(30.0, 1100.0, 600))
    assert again.canary_weight == 25 and again.lease == CanaryLease(30.0, 1130.0)


@pytest.mark.parametrize("bad", [0, 0.0, -5, 600.001, 10**9, math.nan, math.inf, "30", True, None])
def test_a_lease_must_be_seconds_above_zero_and_at_most_the_maximum(bad: object) -> None:
    with pytest.raises(RequestRejected) as info:
        grant_lease(bad, 1000.0, max_s=600)
    assert (info.value.code, info.value.status) == ("bad_lease", 400)
    assert (
        "at most 600" in info.value.detail
        and "RELAY_SERVING_CANARY_LEASE_MAX_S" in info.value.detail
    )


def test_the_longest_allowed_lease_is_granted() -> None:
    assert grant_lease(600, 1.0, max_s=600) == CanaryLease(600.0, 601.0)


# -- the worker: admin operations, state, metrics ------------------------------------------------


@dataclass
class FakeEngine:
    name: str = "fake"


@dataclass
class FakeModel:
    version: str
    lineage_id: str = "lin"
    engine: FakeEngine = field(default_factory=FakeEngine)

    def describe(self) -> dict[str, Any]:
        return {"version": self.version, "lineage_id": self.lineage_id}


@dataclass
class FakeBatcher:
    depth: int = 0

    async def close(self) -> None:
        return None


@dataclass(eq=False)
class FakeServed:
    model: FakeModel
    batcher: FakeBatcher = field(default_factory=FakeBatcher)

    @property
    def version(self) -> str:
        return self.model.version


def worker_with_canary(clock: Clock, max_s: float = 600.0) -> Worker:
    settings = Settings(serving_canary_lease_max_s=max_s, serving_canary_lease_s=min(90.0, max_s))
    worker = Worker(settings, cast(Any, None), ServingMetrics(), None, clock=clock)
    table: RoutingTable[Any] = RoutingTable(stable=FakeServed(FakeModel("v1")))
    table = table.with_loaded(CANARY, FakeServed(FakeModel("v2")))
    worker.table = cast(
        RoutingTable[Served], table.with_loaded(BASELINE, FakeServed(FakeModel("v1")))
    )
    return worker


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_the_worker_drops_an_unrenewed_canary_to_zero_logs_counts_and_shows_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    worker = worker_with_canary(clock)

    async def scenario() -> None:
        state = await worker.set_weight(20, lease_s=30)
        assert state["canary_weight"] == 20
        assert (
            state["canary_lease"]["seconds_left"] == 30.0
            and state["canary_lease"]["lease_s"] == 30.0
        )
        clock.now += 29.9
        assert not worker.expire_lease() and worker.table.canary_weight == 20
        assert worker.state()["canary_lease"]["seconds_left"] == pytest.approx(0.1)
        clock.now += 0.1
        with caplog.at_level("WARNING", logger="serving.worker"):
            assert worker.expire_lease()
        assert not worker.expire_lease()  # once
        state = worker.state()
        assert state["canary_weight"] == 0
        assert {slot: s["version"] for slot, s in state["slots"].items()} == {
            STABLE: "v1",
            CANARY: "v2",
            BASELINE: "v1",
        }
        lease = state["canary_lease"]
        assert lease["lapsed"] and lease["seconds_left"] == 0.0 and lease["expirations"] == 1
        assert lease["expires_at"] is not None
        text = worker.metrics.render().decode()
        assert "relay_canary_lease_expirations_total 1.0" in text
        assert "relay_canary_lease_seconds_left 0.0" in text
        assert "relay_canary_weight 0.0" in text

    run(scenario)
    assert any(
        "lease ran out" in r.message and "weight 20 -> 0" in r.message for r in caplog.records
    )


def test_renewals_keep_the_weight_and_stopping_them_ends_it_one_lease_later() -> None:
    clock = Clock()
    worker = worker_with_canary(clock)

    async def scenario() -> None:
        await worker.set_weight(10, lease_s=30)
        for _ in range(10):  # a long analysis, renewed every 20 s
            clock.now += 20
            await worker.renew(30)
            assert not worker.expire_lease() and worker.table.canary_weight == 10
        clock.now += 29.99  # the release dies right after its last renewal
        assert not worker.expire_lease()
        clock.now += 0.01
        assert worker.expire_lease() and worker.table.canary_weight == 0

    run(scenario)


def test_a_renewal_after_the_end_but_before_the_watchdog_looked_is_refused_and_counted() -> None:
    clock = Clock()
    worker = worker_with_canary(clock)

    async def scenario() -> None:
        await worker.set_weight(10, lease_s=5)
        clock.now += 6
        with pytest.raises(RequestRejected) as info:
            await worker.renew(5)
        assert (info.value.code, info.value.status) == ("lease_expired", 409)
        assert worker.table.canary_weight == 0 and worker.lease_expirations == 1

    run(scenario)


def test_bad_weight_and_lease_requests_change_nothing() -> None:
    clock = Clock()
    worker = worker_with_canary(clock, max_s=120)

    async def scenario() -> None:
        await worker.set_weight(10, lease_s=60)
        before = worker.table
        cases: list[tuple[Callable[[], Awaitable[Any]], str, int]] = [
            (lambda: worker.set_weight(20), "missing_field", 400),  # above 0 needs a lease
            (lambda: worker.set_weight(20, lease_s=0), "bad_lease", 400),
            (lambda: worker.set_weight(20, lease_s=-1), "bad_lease", 400),
            (lambda: worker.set_weight(20, lease_s=121), "bad_lease", 400),
            (lambda: worker.renew(121), "bad_lease", 400),
            (lambda: worker.renew("soon"), "bad_lease", 400),
        ]
        for call, code, status in cases:
            with pytest.raises(RequestRejected) as info:
                await call()
            assert (info.value.code, info.value.status) == (code, status)
            assert worker.table is before
        await worker.set_weight(0)  # weight 0 needs no lease
        assert worker.table.canary_weight == 0 and worker.table.lease is None
        with pytest.raises(RequestRejected) as info:
            await worker.renew(60)
        assert info.value.code == "no_lease" and info.value.status == 409
        await worker.rollback()
        with pytest.raises(RequestRejected) as info:
            await worker.renew(60)
        assert info.value.code == "no_canary" and info.value.status == 409

    run(scenario)


def test_workers_expire_independently_each_on_its_own_clock() -> None:
    clocks = Clock(), Clock(now=5.0)  # different clocks: leases are never compared across workers
    workers = [worker_with_canary(c) for c in clocks]

    async def scenario() -> None:
        for w in workers:
            await w.set_weight(30, lease_s=10)
        clocks[0].now += 11
        assert [w.expire_lease() for w in workers] == [True, False]
        assert [w.table.canary_weight for w in workers] == [0, 30]
        clocks[1].now += 11
        assert workers[1].expire_lease() and workers[1].table.canary_weight == 0

    run(scenario)


# -- the worker's one way to take a canary out -------------------------------------------------------


def test_every_way_a_canary_leaves_a_worker_goes_through_one_function_that_counts_its_reason() -> (
    None
):
    clock = Clock()
    worker = worker_with_canary(clock)

    async def scenario() -> None:
        await worker.set_weight(10, lease_s=5)
        clock.now += 6
        assert worker.expire_lease()  # the watchdog's path: weight 0, every model still loaded
        assert worker.table.canary is not None and worker.table.baseline is not None
        state = await worker.rollback(CanaryRemoval.orphaned)  # the guard's path: unloaded
        assert state["canary_removals"] == {"lease_expired": 1, "orphaned": 1}
        assert state["slots"][CANARY] is None and state["slots"][BASELINE] is None
        state = await worker.rollback(CanaryRemoval.verdict)  # nothing left: not counted
        assert state["canary_removals"] == {"lease_expired": 1, "orphaned": 1}
        assert worker.lease_expirations == 1

    run(scenario)


def test_a_removal_reason_a_caller_may_not_give_is_refused_by_name() -> None:
    assert check_removal_reason("verdict") is CanaryRemoval.verdict
    for bad in ("lease_expired", "because", 3, None):
        with pytest.raises(RequestRejected) as info:
            check_removal_reason(bad)
        assert info.value.code == "bad_reason" and info.value.status == 400
        allowed = "verdict, release_ended, orphaned, champion_rollback, operator, got"
        assert info.value.detail.startswith(f"reason must be one of {allowed}")

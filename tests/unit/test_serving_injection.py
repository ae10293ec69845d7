"""Injected latency: held after scoring (mode hold), burnt on the CPU after scoring (mode cpu),
or spent inside the engine's batches (mode engine), where the stage's own timer measures it, as a
real slower model would be."""

from __future__ import annotations

import time

import pytest

from serving.batching import EngineFault
from serving.routing import RoutingTable
from serving.schema import RequestRejected


def test_engine_mode_slows_the_stage_on_the_engine_thread_and_holds_nothing() -> None:
    injection = (
        RoutingTable().with_latency("stable", 0.0, 3.0, "compute", "engine").injection("stable")
    )
    assert not injection.holds
    assert injection.engine_fault() == EngineFault("compute", 0.0, 3.0)


def test_hold_mode_is_the_default_and_never_touches_the_engine() -> None:
    injection = RoutingTable().with_latency("stable", 20.0).injection("stable")
    assert injection.holds and injection.engine_fault() is None


def test_an_engine_fault_costs_its_own_stage_only() -> None:
    fault = EngineFault("compute", ms=1.0, factor=3.0)
    began = time.perf_counter()
    fault.spend("preprocess", 0.010)
    other = time.perf_counter() - began
    began = time.perf_counter()
    fault.spend("compute", 0.002)  # 1 ms + (3 - 1) x 2 ms
    own = time.perf_counter() - began
    assert other < 0.002 and own >= 0.005


def test_cpu_mode_delays_each_request_on_the_cpu_not_on_a_timer() -> None:
    """A costlier request path: the delay is CPU the worker spends, so its throughput falls."""
    injection = RoutingTable().with_latency("canary", 4.0, mode="cpu").injection("canary")
    assert injection.holds and injection.burns and injection.engine_fault() is None
    wall, cpu = time.perf_counter(), time.process_time()
    injection.spend_cpu(injection.extra_s(0.0))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # burnt, not slept: 4 ms of this thread's own CPU, however busy the host (a hold uses ~0)
    assert cpu >= 0.004 and wall >= 0.004
    assert not RoutingTable().with_latency("canary", 4.0).injection("canary").burns


def test_cpu_mode_never_freezes_the_worker() -> None:
    """Each burn blocks the event loop, health and admin calls included: 50 ms a request at most."""
    with pytest.raises(RequestRejected) as refused:
        RoutingTable().with_latency("canary", 51.0, mode="cpu")
    assert refused.value.code == "bad_latency" and "at most 50 ms" in refused.value.detail
    slow = RoutingTable().with_latency("canary", 10.0, 100.0, mode="cpu").injection("canary")
    began = time.perf_counter()
    slow.spend_cpu(slow.extra_s(10.0))  # a factor on a slow request: capped all the same
    assert time.perf_counter() - began < 0.2


def test_cpu_mode_may_plant_a_tail_and_engine_mode_may_not() -> None:
    table = RoutingTable().with_latency("canary", 50.0, mode="cpu", share=0.05)
    assert table.injection("canary").share == 0.05
    with pytest.raises(RequestRejected) as refused:
        RoutingTable().with_latency("canary", 50.0, mode="engine", share=0.05)
    assert refused.value.code == "bad_mode"


@pytest.mark.parametrize(
    ("stage", "mode", "code"),
    [("queue", "engine", "bad_stage"), ("compute", "sideways", "bad_mode")],
)
def test_an_impossible_injection_is_refused_naming_the_problem(
    stage: str, mode: str, code: str
) -> None:
    with pytest.raises(RequestRejected) as refused:
        RoutingTable().with_latency("stable", 1.0, 1.0, stage, mode)
    assert refused.value.code == code

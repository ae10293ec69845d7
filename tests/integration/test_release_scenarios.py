"""The release, end to end, with two real serving workers and the real log store.

Scenarios: first release; a good candidate promoted against its baseline; a canary over the
absolute SLO rolled back; a costlier candidate refused by the capacity check before any user; a canary slower than its baseline but under the SLO rolled back by the
relative comparison; a canary as fast as its baseline whose feeds lose clicks rolled back by
the click-through check; a worker killed mid-canary; too little traffic paused for a person (twice:
the plan, then the step); numerically broken candidates never deployed; the release guard
rolling back a champion whose live SLO breaks; a manual rollback. The canary gate runs its
default rules throughout.
Tests run in order and share one fleet: each starts from the state the previous one left.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
from prefect.client.schemas.objects import StateType
from prefect.flow_runs import resume_flow_run
from prefect.input.actions import read_flow_run_input
from prefect.input.run_input import keyset_from_paused_state

import logstore
from core.data.validation import window_ending
from core.impact.experiment_types import ExperimentFinding
from core.impact.storage import list_experiments, list_impact_reports
from core.lineage.hashing import compute_lineage_record
from core.training.model import TrainConfig, predict, train_model
from flows.guard import release_guard
from flows.release import retrain_and_release
from flows.rollback import rollback
from logstore.release_events import events_of_release
from model_store import open_store
from relay.errors import ParityFailed
from relay.settings import get_settings
from relay.types import Release, Verdict
from relay_testing.metrics import buffered_log_rows, requests_answered
from relay_testing.shop import Shop
from relay_testing.waiting import poll_until, wait_until
from serving.fleet import FleetClient
from serving.process import WorkerProcess, start_worker
from serving.routing import route_bucket
from simulation.seed import seed_events
from simulation.shop import ShopConfig, generate_events
from simulation.traffic import LiveTraffic, drive, request_bodies
from tasks.calibration import (
    CalibrationThresholds,
    assess_candidate_calibration,
    ensure_calibration_set,
)
from tasks.canary import check_blessing
from tasks.compilation import CompileOutcome, compile_engines, optimise_fp32
from tasks.export import export_model
from tasks.registry import build_manifest
from tests.integration.experiment_checks import assert_experiment_in_report_and_history
from tests.integration.release_params import END, SHOP_RPS, SMALL_RELEASE, merged, seeded

pytestmark = pytest.mark.slow

TOKEN = "scenario-admin-token"
SHOP = ShopConfig(seed=51, n_users=3_000, n_items=1_000)
RUN = {"window_end": END, **SMALL_RELEASE}
# One look per step, and the plan may not lengthen the last step past it (it would otherwise,
# up to 40 looks, where a thin canary could still conclude): a canary that cannot conclude, and
# a plan that says so up front whatever the host's latency noise.
ONE_LOOK = {"max_windows": 1, "plan_max_windows": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Fleet:
    root: Path
    env: dict[str, str]
    ports: list[int]
    workers: list[WorkerProcess] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def start(self, i: int) -> WorkerProcess:
        env = {
            **self.env,
            "RELAY_SERVING_PORT": str(self.ports[i]),
            "RELAY_SERVING_BINARY_PORT": "0",
        }
        worker = start_worker(env, self.root / f"worker{i}-{time.time_ns()}.log")
        if i < len(self.workers):
            self.workers[i] = worker
        else:
            self.workers.append(worker)
        return worker

    def state(self) -> list[dict]:
        with FleetClient.from_settings(get_settings()) as fleet:
            return [w.state for w in fleet.state().workers]

    def stable(self) -> set[str | None]:
        return {
            s["slots"]["stable"]["version"] if s["slots"].get("stable") else None
            for s in self.state()
        }

    def canary(self) -> set[str | None]:
        return {
            s["slots"]["canary"]["version"] if s["slots"].get("canary") else None
            for s in self.state()
        }


@pytest.fixture(scope="module")
def fleet(prefect_harness, settings, relay_home, tmp_path_factory):
    root = tmp_path_factory.mktemp("scenarios")
    seed_events(logstore.connect(settings.resolved_clickhouse_dsn), 40_000, END, config=SHOP)
    overrides = {
        "RELAY_MODEL_STORE_URL": f"file://{root / 'store'}",
        "RELAY_MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_FAULT_INJECTION": "true",  # this run injects latency or rankings
    }
    ports = [free_port(), free_port()]
    env = {
        **overrides,
        "RELAY_HOME": str(relay_home),  # the same spool folder the flow ingests
        "RELAY_CLICKHOUSE_DSN": settings.resolved_clickhouse_dsn,  # chdb: the worker only spools
        "RELAY_SERVING_STABLE_REF": "champion",
        "RELAY_SERVING_LOG_FLUSH_MS": "100",
    }
    state = Fleet(root, env, ports)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in overrides.items():
            mp.setenv(key, value)
        mp.setenv("RELAY_SERVING_FLEET_URLS", ",".join(f"http://127.0.0.1:{p}" for p in ports))
        get_settings.cache_clear()
        try:
            state.start(0)
            state.start(1)
            yield state
        finally:
            for worker in state.workers:
                worker.stop()
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def shop_process(fleet):
    """The shop process calling the fleet, as `make up` runs it: the canary's only traffic."""
    urls = ",".join(f"http://127.0.0.1:{p}" for p in fleet.ports)
    process = Shop({**os.environ, **fleet.env, "RELAY_SERVING_FLEET_URLS": urls})
    try:
        yield process
    finally:
        if process.running:
            process.stop()


@pytest.fixture
def shop(shop_process):
    """The shop, open: started if no test has started it yet or one closed it."""
    if not shop_process.running:
        world = {"seed": SHOP.seed, "n_users": SHOP.n_users, "n_items": SHOP.n_items}
        shop_process.start(SHOP_RPS, world)
    return shop_process


def run_release(seed: int, **overrides):
    state = retrain_and_release(**merged(RUN, seeded(seed), overrides), return_state=True)
    assert state.is_completed(), state.message
    return state.result()


def kinds(summary) -> dict[str, list]:
    events = events_of_release(
        logstore.connect(get_settings().resolved_clickhouse_dsn), summary_release_id(summary)
    )
    out: dict[str, list] = {}
    for e in events:
        out.setdefault(e.kind, []).append(e)
    return out


def summary_release_id(summary) -> str:
    client = logstore.connect(get_settings().resolved_clickhouse_dsn)
    rows = client.query(
        "SELECT release_id FROM release_events WHERE model_version = {v:String} AND kind = 'outcome' ORDER BY ts DESC LIMIT 1",
        parameters={"v": summary.version},
    ).result_rows
    return rows[0][0]


def test_first_release_deploys_as_stable_and_becomes_champion(fleet):
    summary = run_release(seed=1)
    assert summary.outcome == "promoted" and summary.reason.startswith("first release")
    store = open_store(get_settings())
    assert store.get_alias("champion") == summary.version
    assert fleet.stable() == {summary.version}
    # no canary, so no experiment, and the record says why rather than showing a zero effect
    (experiment,) = list_experiments(store, summary.version)
    assert experiment.finding is ExperimentFinding.no_experiment
    assert experiment.headline == (
        "No experiment: first release: no stable version to compare the candidate against."
    )
    fleet.versions["v1"] = summary.version


def test_good_candidate_is_blessed_canaried_and_promoted(fleet, shop):
    summary = run_release(
        seed=2,
        canary_steps=[25, 50],  # two steps
        impact_report_after=True,
        impact={"min_sessions": 10},
    )
    looks = [
        (e.details.get("weight"), e.verdict, e.reason[:300]) for e in kinds(summary)["slo_window"]
    ]
    assert summary.outcome == "promoted", (summary.reason, looks[-3:])
    store = open_store(get_settings())
    assert store.get_alias("champion") == summary.version
    assert fleet.stable() == {summary.version} and fleet.canary() == {None}
    events = kinds(summary)
    windows = events["slo_window"]
    assert windows[-1].verdict == "passed"
    assert {e.details["weight"] for e in windows} == {25, 50}
    last = windows[-1].details["measurements"]
    # judged against a baseline of equal share; stable reported beside them
    assert last["baseline_requests"] >= 200 and last["canary_requests"] >= 200
    assert last["latency_ratio_high"] < last["latency_tolerance_ratio"]
    assert "mSPRT" in windows[-1].details["method"] and "per-user" in windows[-1].details["method"]
    assert "no regression beyond tolerance" in windows[-1].reason
    # shoppers' clicks were judged too, over the whole canary (both steps)
    assert last["ctr_judged"] == 1 and last["canary_impressions"] >= 2_000
    assert "click-through canary" in windows[-1].reason
    assert events["canary_plan"][0].verdict == "reachable"
    assert "decision" not in events  # at the shop's 60 req/s: promoted without a person
    # the tail was judged beside the mean: its interval within the tolerance too
    assert last["p95_ratio_high"] < last["latency_tolerance_ratio"]
    assert events["promote"][0].verdict == "passed"
    history = store.alias_history("champion")
    assert [h.version for h in history[-2:]] == [fleet.versions["v1"], summary.version]
    reports = list_impact_reports(store, summary.version)  # the canary window's impact report
    assert len(reports) == 1 and reports[0].finding
    assert_experiment_in_report_and_history(store, summary, summary_release_id(summary), reports[0])
    fleet.versions["v2"] = summary.version


def test_a_candidate_over_the_slo_at_every_load_is_refused_by_the_capacity_check_before_any_user(
    fleet, shop
):
    # The plant is +400 ms on every canary answer (over the 300 ms SLO at any rate), not a
    # compute cost: on this 2-core host the check flags a 30 % costlier candidate in about 95 %
    # of runs and its twin in about 5 % (bench.capacity, 20 runs each), so a cost plant would
    # fail this test about one run in twenty. What it holds: the check runs before any weight, refuses with both figures,
    # and leaves champion and fleet as they were. Seed 12's model is never blessed against v2
    # (AUC drop over 0.02, deterministic): the blessing is not what this test is about.
    champion = open_store(get_settings()).get_alias("champion")
    with FleetClient.from_settings(get_settings()) as client:
        assert client.set_injected_latency("canary", 400.0).ok
        try:
            summary = run_release(
                seed=12,
                # the shop's rate: the store's busiest second holds other tests' bursts (3,000
                # req/s once, over what the champion can serve, so the check was inconclusive)
                capacity={"enabled": True, "peak_rps": SHOP_RPS},
                blessing={"max_auc_drop": 1.0},
            )
        finally:
            client.set_injected_latency("canary", 0.0)
    assert summary.outcome == "refused", summary.reason
    assert "capacity check" in summary.reason and "below the champion's" in summary.reason
    assert "candidate" in summary.reason and "champion" in summary.reason
    assert summary.reason.count("req/s") >= 2  # both throughputs at the SLO
    assert open_store(get_settings()).get_alias("champion") == champion
    assert fleet.stable() == {champion} and fleet.canary() == {None}
    events = kinds(summary)
    (checked,) = events["capacity"]
    assert checked.verdict == Verdict.failed
    measured = checked.details
    assert measured["candidate_throughput_rps"] < 0.9 * measured["champion_throughput_rps"]
    assert measured["wall_s"] <= 120
    assert "weight" not in events  # no step ever gave the candidate a user


def test_canary_over_the_absolute_slo_is_rolled_back(fleet, shop):
    with FleetClient.from_settings(get_settings()) as client:
        client.set_injected_latency("canary", 400.0)
        try:
            summary = run_release(seed=3)
        finally:
            client.set_injected_latency("canary", 0.0)
    assert summary.outcome == "rolled_back", summary.reason
    assert "absolute SLO: canary P95" in summary.reason and "> 300 ms" in summary.reason
    assert open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]
    assert fleet.stable() == {fleet.versions["v2"]} and fleet.canary() == {None}
    events = kinds(summary)
    assert events["slo_window"][-1].verdict == Verdict.failed
    rollback_ms = events["rollback"][0].details["rollback_ms"]
    assert 0 < rollback_ms < 10_000
    assert events["rolled_back"][0].details["rollback_ms"] == pytest.approx(rollback_ms)


def test_canary_slower_than_its_baseline_under_the_slo_is_rolled_back_by_the_relative_rule(
    fleet, shop
):
    with FleetClient.from_settings(get_settings()) as client:
        # x3: at light load the +5 ms floor puts the tolerance near x2, so x2 sat on the boundary
        client.set_injected_latency("canary", 0.0, factor=3.0)  # three times as slow, < 300 ms
        try:
            summary = run_release(seed=8)
        finally:
            client.set_injected_latency("canary", 0.0)
    assert summary.outcome == "rolled_back", summary.reason
    assert "relative to baseline" in summary.reason and "absolute" not in summary.reason
    assert "beyond the tolerance" in summary.reason
    failed = kinds(summary)["slo_window"][-1]
    measured = failed.details["measurements"]
    assert measured["canary_p95_ms"] < 300 and measured["latency_ratio_low"] > 1.0
    assert measured["latency_ratio"] > measured["latency_tolerance_ratio"]
    assert open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]
    assert fleet.canary() == {None} and fleet.stable() == {fleet.versions["v2"]}


def test_canary_that_serves_fast_but_loses_clicks_is_rolled_back_on_click_through(fleet, shop):
    # The canary's feeds are served upside down (its scores reversed at serve time, as a
    # train/serve skew would): as fast as ever, calibrated as before, but shoppers click less.
    with FleetClient.from_settings(get_settings()) as client:
        assert client.set_ranking("canary", "reversed").ok
        try:
            summary = run_release(seed=9)
        finally:
            client.set_ranking("canary", "model")
    assert summary.outcome == "rolled_back", summary.reason
    assert "fewer clicks than baseline: click-through canary" in summary.reason
    assert "relative to baseline" not in summary.reason and "absolute" not in summary.reason
    failed = kinds(summary)["slo_window"][-1]
    measured = failed.details["measurements"]
    assert measured["ctr_judged"] == 1 and measured["ctr_ratio_high"] < 1.0
    assert measured["ctr_ratio"] < measured["ctr_tolerance_ratio"]
    assert measured["canary_impressions"] >= 2_000 and measured["baseline_impressions"] >= 2_000
    # not judged slower: the latency interval's low end is under the tolerance, so the latency
    # rule had no case against the canary (with a reason above naming only click-through).
    # Not "wholly inside": the click-through rule often ends the step in its first window, and
    # the gate never promises a latency pass there. On a loaded host one window's latency
    # interval is wider than the tolerance (a two-process fresh clone: x1.29-high against x1.20,
    # rolled back on click-through after 12 s). Before that it asserted the interval covers
    # x1.00, which a 95 % interval misses by design in some runs.
    assert measured["latency_ratio_low"] < measured["latency_tolerance_ratio"]
    assert measured["canary_p95_ms"] < 300
    assert open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]
    assert fleet.canary() == {None} and fleet.stable() == {fleet.versions["v2"]}


def served_by(worker: WorkerProcess, slot: str) -> float:
    """Requests the worker has answered from `slot`, 0 once it cannot be reached."""
    try:
        return requests_answered(worker.http_url, slot=slot)
    except httpx.HTTPError:
        return 0.0


@pytest.mark.slow
def test_a_tail_regressed_candidate_is_refused_in_shadow_before_any_user_sees_it(fleet, shop):
    # 8 % of the canary slot's requests held 30 ms more: the P95 lands in that tail, the
    # geometric mean moves ~x1.2, inside the light-load tolerance (+5 ms of a few-ms P95).
    with FleetClient.from_settings(get_settings()) as client:
        assert client.set_injected_latency("canary", 30.0, share=0.08).ok
        try:
            summary = run_release(seed=8, shadow={"share": 0.5, "window_s": 5.0, "max_windows": 8})
        finally:
            client.set_injected_latency("canary", 0.0)
    assert summary.outcome == "refused", summary.reason
    assert "candidate refused in shadow" in summary.reason and "P95" in summary.reason
    events = kinds(summary)
    assert "weight" not in events and "slo_window" not in events  # no user was routed to it
    last = events["shadow_window"][-1]
    assert last.verdict == Verdict.failed
    measured = last.details["measurements"]
    assert measured["p95_ratio_low"] > measured["tolerance_ratio"]
    assert measured["shadow_error_rate"] == 0 and measured["dropped"] == 0
    assert open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]
    assert fleet.canary() == {None} and fleet.stable() == {fleet.versions["v2"]}
    assert not any(s["shadow"]["on"] for s in fleet.state())  # turned off on every worker


def test_worker_killed_mid_canary_is_an_error_and_the_survivor_rolls_back(fleet, shop):
    victim = fleet.workers[1]

    def kill_when_canary_takes_traffic() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                state = httpx.get(
                    f"{victim.http_url}/admin/state",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=2,
                ).json()
                if state["slots"].get("canary") and state.get("canary_weight", 0) > 0:
                    # mid-canary: once the canary has answered some of the shop's requests here
                    poll_until(lambda: served_by(victim, "canary") >= 20, 60, interval_s=0.2)
                    os.kill(victim.process.pid, signal.SIGKILL)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_canary_takes_traffic, daemon=True)
    killer.start()
    summary = run_release(seed=4, analysis_window_s=8.0)
    killer.join(timeout=5)
    assert not victim.alive()
    assert summary.outcome == "rolled_back" and "unreachable" in summary.reason
    survivor = fleet.workers[0]
    state = httpx.get(
        f"{survivor.http_url}/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert (
        state["slots"].get("canary") is None
        and state["slots"]["stable"]["version"] == fleet.versions["v2"]
    )
    assert open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]
    victim.stop()
    fleet.start(1).wait_ready()  # back with the champion as stable, for the next scenarios
    assert fleet.stable() == {fleet.versions["v2"]}


@contextlib.contextmanager
def answering_pauses(
    answers: list[dict], within_s: float = 300, plan_answer: dict | None = None
) -> Iterator[threading.Thread]:
    """Resume each paused flow run with the next answer, as the on-call engineer would.

    With `plan_answer`, a pause on the canary plan ("Start the canary anyway?", which the plan
    asks only where its noise estimate says the canary cannot conclude) gets that answer and
    leaves `answers` for the step's pauses. Only while the block runs: a test that fails before
    its pauses leaves no thread behind to answer the next test's pause with its answers.
    """
    stop = threading.Event()

    def resume_when_paused() -> None:
        deadline = time.monotonic() + within_s
        seen: set = set()
        while answers and not stop.is_set() and time.monotonic() < deadline:
            with get_client(sync_client=True) as client:
                paused = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        state=FlowRunFilterState(
                            type=FlowRunFilterStateType(any_=[StateType.PAUSED])
                        )
                    )
                )
            fresh = [r for r in paused if (r.id, r.state_id) not in seen]
            if fresh:
                run = fresh[0]
                seen.add((run.id, run.state_id))
                asks = read_flow_run_input(
                    keyset_from_paused_state(run.state)["description"], flow_run_id=run.id
                )
                if plan_answer is not None and "Start the canary anyway?" in str(asks):
                    resume_flow_run(run.id, run_input=plan_answer)
                else:
                    resume_flow_run(run.id, run_input=answers.pop(0))
            stop.wait(0.5)

    thread = threading.Thread(target=resume_when_paused, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=10)


def skew_the_split(stop: threading.Event, sent: collections.Counter) -> None:
    """A sticky-cohort skew: once a canary takes users, extra shoppers who all hash into the
    canary's buckets call the fleet (fresh user ids, as a cohort a bug routed there would).
    `sent` counts the answers by status (the test's message shows them if the skew fails)."""
    urls = [u.strip() for u in get_settings().serving_fleet_urls.split(",") if u.strip()]
    # the bodies first: generating them takes seconds, and the skew must be there from the
    # step's first look, or an equal canary can pass before the split is ever skewed
    bodies = list(request_bodies(generate_events(SHOP, 20 * 4_000, END, days=0.05, chunk=77), 20))
    deadline = time.monotonic() + 600
    version, weight = None, 0
    while not stop.is_set() and time.monotonic() < deadline and not weight:
        with FleetClient.from_settings(get_settings()) as fleet:
            first = fleet.state().workers[0].state or {}
        canary = (first.get("slots") or {}).get("canary") or {}
        version, weight = canary.get("version"), int(first.get("canary_weight") or 0)
        time.sleep(0.2)
    if not version or not weight:
        return
    sent[f"canary at {weight} %"] += 1
    ids = (u for u in range(7_000_000, 9_000_000) if route_bucket(u, version) < weight)
    with httpx.Client(timeout=10.0) as client:
        for i, body in enumerate(bodies):
            if stop.is_set() or time.monotonic() > deadline:
                return
            body["user"]["user_id"] = next(ids)
            body["session"]["session_id"] = f"skew-{i}"  # required: without it a 400
            try:
                answer = client.post(f"{urls[i % len(urls)]}/v1/predict", json=body)
                sent[answer.status_code] += 1
            except httpx.HTTPError as exc:  # a refused request skews nothing
                sent[type(exc).__name__] += 1
            time.sleep(1 / 40)  # 40 req/s of canary-only users beside the shop's 60


def test_a_skewed_split_is_held_as_invalid_and_a_person_decides(fleet, shop):
    stop, sent = threading.Event(), collections.Counter()
    skewer = threading.Thread(target=skew_the_split, args=(stop, sent), daemon=True)
    skewer.start()
    try:
        with answering_pauses(
            [{"decision": "roll back", "comment": "split is skewed"}],
            plan_answer={"decision": "start the canary", "comment": "the split is what is tested"},
        ):
            summary = run_release(seed=7)
    finally:
        stop.set()
        skewer.join(timeout=10)
    events = kinds(summary)
    assert summary.outcome == "rolled_back" and "split is skewed" in summary.reason, (
        sent,
        [
            (e.verdict, e.reason)
            for kind in ("canary_plan", "slo_window", "decision")
            for e in events.get(kind, [])
        ],
    )
    invalid = [e for e in events["slo_window"] if e.verdict == "invalid"]
    assert invalid, [e.reason for e in events["slo_window"]]
    assert invalid[0].reason.startswith("sample-ratio mismatch at 50 %: canary ")
    assert "(expected 50.00%)" in invalid[0].reason and "a person decides" in invalid[0].reason
    m = invalid[0].details["measurements"]
    assert m["canary_user_share"] > 0.55 and min(m["split_p_users"], m["split_p_requests"]) < 1e-3
    # held, not decided: the only rollback is the person's
    # (a person's start of the canary at weight 0, where the plan asked for one, is no verdict)
    steps = [(e.verdict, e.details["weight"]) for e in events["decision"] if e.details["weight"]]
    assert steps == [("failed", 50)]
    assert fleet.canary() == {None}
    assert open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]


def test_too_little_traffic_is_inconclusive_and_pauses_for_a_person(fleet, shop):
    # Two pauses: the plan warns up front that no step can conclude (a person starts it
    # anyway), then the step ends inconclusive (a person rolls back). The shop closes: nobody
    # calls the fleet, and one 1 s window could not conclude at the rate it had.
    shop.stop()
    answers = [
        {"decision": "start the canary", "comment": "try it"},
        {"decision": "roll back", "comment": "too quiet to judge"},
    ]
    with answering_pauses(answers, within_s=240):
        summary = run_release(seed=5, analysis_window_s=1.0, gate=ONE_LOOK)
    assert not answers, "the run did not pause twice"
    assert summary.outcome == "rolled_back" and "too quiet to judge" in summary.reason
    events = kinds(summary)
    assert events["canary_plan"][0].verdict == "unreachable"
    decisions = [(e.verdict, e.details["weight"]) for e in events["decision"]]
    assert decisions == [("passed", 0), ("failed", 50)]  # both answers are kept with the release
    assert "canary started by a person: try it" in events["decision"][0].reason
    assert "50 %: not within 1 window" in events["canary_plan"][0].reason
    assert events["slo_window"][-1].verdict == Verdict.inconclusive
    assert (
        fleet.canary() == {None}
        and open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]
    )


def test_a_pause_nobody_answers_takes_its_default_and_the_run_still_completes(fleet):
    # The plan cannot conclude (1 s windows, the shop closed) and nobody answers within
    # the timeout: the release is not deployed, and Prefect shows the run Completed, not
    # Failed "never resumed" (run_release asserts the state).
    started = time.monotonic()
    summary = run_release(
        seed=6,
        analysis_window_s=1.0,
        gate=ONE_LOOK,
        approval_timeout_s=2,
    )
    assert time.monotonic() - started < 120
    assert summary.outcome == "not_deployed" and "nobody answered" in summary.reason
    events = kinds(summary)
    assert [e.verdict for e in events["decision"]] == ["failed"]
    assert fleet.canary() == {None}
    assert open_store(get_settings()).get_alias("champion") == fleet.versions["v2"]


def test_numerically_broken_candidates_are_never_deployed(fleet, tmp_path):
    frame = generate_events(SHOP, 8_000, END)
    trained = train_model(frame, TrainConfig(seed=9, epochs=1))
    model = trained.model
    with torch.no_grad():  # NaN weights: stopped at the parity gate
        model.mlp[0].weight[0, 0] = float("nan")
    trained.reference_scores = predict(model, trained.holdout_x)
    path = export_model(model, tmp_path / "nan" / "model.onnx")
    with pytest.raises(ParityFailed, match="does not reproduce"):
        compile_engines.fn(path, trained, tmp_path / "nan")

    with torch.no_grad():  # constant scores: passes parity, stopped by calibration
        for p in model.mlp.parameters():
            p.zero_()
    trained.reference_scores = predict(model, trained.holdout_x)
    workdir = tmp_path / "flat"
    workdir.mkdir()
    torch.save(model.state_dict(), workdir / "weights.pt")
    path = export_model(model, workdir / "model.onnx")
    engines = [optimise_fp32(path, workdir / "ort-fp32.onnx")]
    settings = get_settings()
    store = open_store(settings)
    record = compute_lineage_record(path, frame, engines, "broken")
    manifest = store.publish(
        build_manifest(
            trained, CompileOutcome(engines, []), record, store, path, workdir / "weights.pt"
        )
    )
    calibration = ensure_calibration_set.fn(settings, workdir, window_ending(END, 7.0))
    report = assess_candidate_calibration.fn(
        settings, manifest.version, calibration, CalibrationThresholds(), workdir
    )
    assert not report.blessed and any(
        c.gate == "score_std" and c.verdict is Verdict.failed for c in report.checks
    )
    gate = check_blessing.fn(
        settings, Release("broken-release", manifest.version, manifest.lineage_id)
    )
    assert gate.verdict is Verdict.failed and gate.reason.startswith("not deployed")
    assert fleet.canary() == {None} and fleet.stable() == {fleet.versions["v2"]}


def test_release_guard_rolls_back_a_champion_whose_live_slo_breaks(fleet):
    settings = get_settings()
    urls = [u for u in settings.serving_fleet_urls.split(",")]
    with FleetClient.from_settings(settings) as client:
        client.set_injected_latency("stable", 400.0)
        try:
            drive(urls, LiveTraffic(rate_rps=30.0, duration_s=5.0, seed=6))
        finally:
            client.set_injected_latency("stable", 0.0)
    # the guard reads what the workers logged: every row out of their memory first
    wait_until(
        lambda: all(buffered_log_rows(w.http_url) == 0 for w in fleet.workers), 30, "rows flushed"
    )
    state = release_guard(window_minutes=0.5, limits={"min_requests": 40}, return_state=True)
    assert state.is_completed(), state.message
    decision = state.result()
    assert decision.verdict is Verdict.failed and "live P95" in decision.reason
    assert decision.attribution is not None and "why: " in decision.reason  # said, even if
    assert decision.attribution["statement"] in decision.reason  # the window is too small
    assert open_store(settings).get_alias("champion") == fleet.versions["v1"]
    assert fleet.stable() == {fleet.versions["v1"]}


def test_manual_rollback_restores_a_named_blessed_version_and_refuses_unknown_ones(fleet):
    state = rollback(
        target_version=fleet.versions["v2"], reason="on-call restores v2", return_state=True
    )
    assert state.is_completed(), state.message
    store = open_store(get_settings())
    assert store.get_alias("champion") == fleet.versions["v2"]
    assert store.alias_history("champion")[-1].reason == "on-call restores v2"
    assert fleet.stable() == {fleet.versions["v2"]}
    missing = rollback(target_version="no-such-version", return_state=True)
    assert missing.is_failed() and "no-such-version" in missing.message

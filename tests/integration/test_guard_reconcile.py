"""The guard's fleet reconciliation on two real workers: an orphaned canary and a wrong stable are
repaired while stable keeps answering, a live release's canary is left alone, and a worker that
does not answer is an `error` naming it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.states import Crashed
from pydantic import SecretStr

import logstore
from flows.release import retrain_and_release
from logstore.release_events import events_of_release
from relay.settings import Settings
from relay.types import Release, Verdict
from serving.fleet import FleetClient
from serving.process import WorkerProcess, start_worker
from tasks.canary import record
from tasks.reconcile import reconcile_fleet, take_out_canary_of_dead_release
from tests.integration.test_serving_fleet import docs, publish_variant

TOKEN = "reconcile-token-5e1"
GUARD = Release("guard-reconcile-test", "", "")


@pytest.fixture(scope="module")
def fleet(
    published_version: Any, settings: Settings, prefect_harness: None, tmp_path_factory: Any
) -> Iterator[tuple[list[WorkerProcess], Settings, str, str]]:
    root = tmp_path_factory.mktemp("reconcile")
    canary = publish_variant(published_version, "orphan", 0.5, root / "orphan.onnx").version
    stable = published_version.manifest.version
    env = {
        "RELAY_MODEL_STORE_URL": published_version.store.backend.describe(),
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_STABLE_REF": stable,
        "RELAY_CLICKHOUSE_DSN": f"chdb://{root / 'never-opened'}",
    }
    workers = [start_worker({**env, "RELAY_HOME": str(root / n)}, root / f"{n}.log") for n in "ab"]
    try:
        for w in workers:
            w.wait_ready()
        guarded = settings.model_copy(
            update={
                "serving_fleet_urls": ",".join(w.http_url for w in workers),
                "serving_admin_token": SecretStr(TOKEN),
            }
        )
        yield workers, guarded, stable, canary
    finally:
        for w in workers:
            w.stop()


def predict_until(stop: threading.Event, urls: list[str], statuses: list[int]) -> None:
    bodies = docs(20, seed=3)
    with httpx.Client(timeout=10) as client:
        i = 0
        while not stop.is_set():
            statuses.append(
                client.post(f"{urls[i % 2]}/v1/predict", json=bodies[i % 20]).status_code
            )
            i += 1


def test_orphaned_canary_and_a_wrong_stable_are_repaired_with_no_failed_request(fleet):
    workers, settings, stable, canary = fleet
    urls = [w.http_url for w in workers]
    crashed = Release("crashed-release-1", canary, "lineage-of-the-orphan")
    record(settings, crashed, "deploy", "passed", "canary deployed by a release that then died")
    with FleetClient(urls, TOKEN) as client:
        assert client.deploy_canary(canary, weight=5, baseline=stable, lease_s=60).ok
    with FleetClient(urls[1:], TOKEN) as b:
        assert b.rollback().ok and b.load("stable", canary).ok  # B drifted off the champion
    stop, statuses = threading.Event(), []
    traffic = threading.Thread(target=predict_until, args=(stop, urls, statuses))
    traffic.start()
    try:
        gate = reconcile_fleet.fn(settings, GUARD, stable, [])
    finally:
        stop.set()
        traffic.join()

    assert gate.verdict is Verdict.passed, gate.reason
    assert gate.measurements["repairs"] == 2.0
    with FleetClient(urls, TOKEN) as client:
        after = client.state().workers
    assert [(w.stable_version, w.canary_version, w.baseline_version) for w in after] == [
        (stable, None, None),
        (stable, None, None),
    ]
    # each worker was told why its canary went, and counts it
    assert [w.state["canary_removals"] for w in after] == [{"orphaned": 1}, {"operator": 1}]
    assert statuses and set(statuses) == {200}, f"{len(statuses)} requests: {set(statuses)}"
    # the dead release's own record says what became of its canary
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    took_out = [e for e in events_of_release(client, crashed.release_id) if e.kind == "reconcile"]
    assert [(e.verdict, e.details["action"]) for e in took_out] == [("repaired", "take_canary_out")]
    assert "with no live release" in took_out[0].reason and urls[0] in took_out[0].reason
    restored = [e for e in events_of_release(client, GUARD.release_id) if e.kind == "reconcile"]
    assert [(e.verdict, e.details["action"]) for e in restored] == [("repaired", "restore_stable")]


def test_a_live_releases_canary_is_left_alone(fleet):
    workers, settings, stable, canary = fleet
    urls = [w.http_url for w in workers]
    with FleetClient(urls, TOKEN) as client:
        assert client.deploy_canary(canary, weight=5, baseline=stable, lease_s=60).ok
        try:
            gate = reconcile_fleet.fn(settings, GUARD, stable, ["release-run (id-1, Running)"])
            assert gate.verdict is Verdict.passed and "left alone" in gate.reason
            assert {w.canary_version for w in client.state().workers} == {canary}
        finally:
            assert client.rollback().ok


def test_a_crashing_release_takes_out_only_its_own_canary_in_its_hook(fleet, monkeypatch):
    workers, settings, stable, canary = fleet
    urls = [w.http_url for w in workers]
    monkeypatch.setattr("tasks.reconcile.get_settings", lambda: settings)
    run = FlowRun(id=uuid.uuid4(), flow_id=uuid.uuid4(), name="dying-release")
    with FleetClient(urls, TOKEN) as client:
        assert client.deploy_canary(canary, weight=5, baseline=stable, lease_s=60).ok
        record(settings, Release("another-release", canary, "l"), "deploy", "passed", "not ours")
        take_out_canary_of_dead_release(retrain_and_release, run, Crashed(message="SIGTERM"))
        assert {w.canary_version for w in client.state().workers} == {canary}  # not its canary

        record(settings, Release(str(run.id), canary, "l"), "deploy", "passed", "ours")
        take_out_canary_of_dead_release(retrain_and_release, run, Crashed(message="SIGTERM"))
        after = client.state().workers
    assert {(w.stable_version, w.canary_version) for w in after} == {(stable, None)}
    events = events_of_release(logstore.connect(settings.resolved_clickhouse_dsn), str(run.id))
    crashed = [e for e in events if e.kind == "crashed"]
    assert [(e.verdict, e.details["reason"]) for e in crashed] == [("done", "release_ended")]
    assert {w.state["canary_removals"].get("release_ended") for w in after} == {1}
    assert (
        "ended CRASHED (SIGTERM)" in crashed[0].reason and "champion unchanged" in crashed[0].reason
    )


def test_a_worker_that_does_not_answer_is_an_error_naming_it(fleet):
    workers, settings, stable, _ = fleet
    gone = workers[1]
    gone.stop()
    gate = reconcile_fleet.fn(settings, GUARD, stable, [])
    assert gate.verdict is Verdict.error
    assert gone.http_url in gate.reason and "unreachable" in gate.reason

"""Relay through its deployments, against a real Prefect server, as `make up` sets it up.

The stack (deployed_stack.py) runs the scripts behind `make up`: a Prefect server on a free
loopback port, pools `cpu` and `gpu`, `prefect deploy --all`, a `cpu` pool worker, and two
serving workers. Releases are triggered with `prefect deployment run`, as the schedule or an
on-call engineer would; each flow run is a subprocess of the pool worker. Tests run in order and
share the stack: each starts from the state the previous one left. The last one loses the pool
worker's host mid-canary and watches Prefect's automations clean up after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from relay_testing.deployed_stack import REPO, DeployedStack, finish, outcome_of
from tests.integration.release_params import END, SHOP_RPS, SMALL_RELEASE, merged, seeded

pytestmark = pytest.mark.slow

SPEC = yaml.safe_load((REPO / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}
RELEASE = "retrain-and-release/retrain-and-release"
ROLLBACK = "rollback/rollback"
GUARD = "release-guard/release-guard"
DRIFT = "drift-watch/drift-watch"
SHOP = {"seed": 51, "n_users": 3_000, "n_items": 1_000}
# Small data, one short canary step; its traffic comes from the shop process the stack runs.
SMALL = {"window_end": END.isoformat(), **SMALL_RELEASE, "actor": "e2e test"}
RELEASE_ARTIFACTS = {
    "data-validation",
    "parity",
    "release-summary",
    "calibration",
    "release-outcome",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedStack]:
    deployed = DeployedStack(tmp_path_factory.mktemp("deployed"))
    try:
        seeding = deployed.seed_events(40_000, END, SHOP)  # while the server starts
        deployed.start(serving_workers=2)
        # as `make up`: the shop calls the fleet from the start (until a first release its
        # feeds are refused, "no stable model yet"), at the rate the small canary is sized for
        deployed.start_shop(rate_rps=SHOP_RPS, shop=SHOP)
        finish(seeding)
        yield deployed
    finally:
        deployed.stop()


@pytest.fixture(scope="module")
def versions() -> dict[str, str]:
    return {}


def release(stack: DeployedStack, seed: int, **overrides: Any) -> tuple[dict, dict]:
    run_id = stack.run_deployment(RELEASE, merged(SMALL, seeded(seed), overrides))
    run = stack.wait_for_run(run_id, timeout_s=300)
    assert run["state_type"] == "COMPLETED", (
        f"{run['state']['message']}\n{stack.worker_log()[-6000:]}"
    )
    return run, stack.artifacts(run_id)


def test_deploy_all_creates_every_deployment_of_prefect_yaml_in_its_pool(stack):
    deployed = {d["name"]: d for d in stack.api("POST", "/deployments/filter", {})}
    assert set(deployed) == set(DEPLOYMENTS)
    for name, spec in DEPLOYMENTS.items():
        got = deployed[name]
        assert got["work_pool_name"] == spec["work_pool"]["name"]
        assert got["entrypoint"] == spec["entrypoint"]
        assert got["enforce_parameter_schema"] is True
        assert got["pull_steps"] == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ]
        wanted = spec.get("schedules") or []
        assert len(got["schedules"]) == len(wanted), name
        stored = [
            {k: s["schedule"].get(k) for k in want}
            for s, want in zip(got["schedules"], wanted, strict=True)
        ]
        assert stored == wanted, name
        assert all(s["active"] for s in got["schedules"])
    release_limit = deployed["retrain-and-release"]["global_concurrency_limit"]
    assert release_limit["limit"] == 1
    assert deployed["retrain-and-release"]["concurrency_options"]["collision_strategy"] == "ENQUEUE"


def test_work_pools_come_from_their_templates(stack):
    for template in sorted((REPO / "deployments" / "pools").glob("*.json")):
        pool = stack.api("GET", f"/work_pools/{template.stem}")
        assert pool["type"] == "process"
        assert pool["base_job_template"] == json.loads(template.read_text())
    workers = stack.api("POST", "/work_pools/cpu/workers/filter", {})
    assert [w["status"] for w in workers] == ["ONLINE"]


def test_negative_canary_weight_is_rejected_by_the_cli_before_any_flow_run(stack):
    before = len(stack.flow_runs_of(RELEASE))
    done = stack.prefect("deployment", "run", RELEASE, "--param", "canary_steps=[-5]")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0
    assert "Validation failed for field 'canary_steps[0]'" in said, said
    assert "-5 is less than the minimum of 1" in said, said
    assert len(stack.flow_runs_of(RELEASE)) == before  # nothing was created, nothing ran


def test_zero_slo_is_rejected_by_the_api_the_ui_calls_with_its_message(stack):
    deployment = stack.api("GET", f"/deployments/name/{RELEASE}")
    before = len(stack.flow_runs_of(RELEASE))
    response = httpx.post(
        f"{stack.api_url}/deployments/{deployment['id']}/create_flow_run",
        json={"parameters": {"gate": {"max_p95_ms": 0}}},
        timeout=30,
    )
    assert response.status_code == 409
    assert "Validation failed for field 'gate.max_p95_ms'" in response.json()["detail"]
    assert "0 is less than or equal to the minimum of 0" in response.json()["detail"]
    assert len(stack.flow_runs_of(RELEASE)) == before


def test_bad_canary_rules_are_rejected_by_the_api_before_any_flow_run(stack):
    deployment = stack.api("GET", f"/deployments/name/{RELEASE}")
    before = len(stack.flow_runs_of(RELEASE))
    for parameters, field in (
        ({"gate": {"confidence": 1.0}}, "gate.confidence"),
        ({"gate": {"confidence": 0.4}}, "gate.confidence"),
        ({"gate": {"tolerance_pct": -5}}, "gate.tolerance_pct"),
        ({"gate": {"max_windows": 0}}, "gate.max_windows"),
        ({"canary_steps": [60]}, "canary_steps[0]"),  # the baseline needs as many users again
    ):
        response = httpx.post(
            f"{stack.api_url}/deployments/{deployment['id']}/create_flow_run",
            json={"parameters": parameters},
            timeout=30,
        )
        assert response.status_code == 409, parameters
        assert f"Validation failed for field '{field}'" in response.json()["detail"], parameters
    assert len(stack.flow_runs_of(RELEASE)) == before


def test_first_release_from_the_deployment_becomes_champion(stack, versions):
    run, artifacts = release(stack, seed=1)
    assert run["work_pool_name"] == "cpu" and run["parameters"]["training"]["epochs"] == 3
    assert set(artifacts) >= RELEASE_ARTIFACTS
    assert outcome_of(artifacts) == "Release promoted"
    champion = stack.store().get_alias("champion")
    assert champion is not None and champion in str(artifacts["release-summary"]["data"])
    assert stack.fleet_stable() == {champion}
    versions["first"] = champion


def test_second_release_is_canaried_and_promoted(stack, versions):
    run, artifacts = release(stack, seed=2)
    assert set(artifacts) >= RELEASE_ARTIFACTS | {"canary-plan", "canary-weight-50"}, sorted(
        artifacts
    )
    assert outcome_of(artifacts) == "Release promoted", artifacts["release-outcome"]["data"]
    store = stack.store()
    champion = store.get_alias("champion")
    assert champion not in (None, versions["first"])
    assert [e.version for e in store.alias_history("champion")] == [versions["first"], champion]
    assert stack.fleet_stable() == {champion}
    versions["second"] = champion


def test_rollback_to_an_unknown_version_fails_and_changes_nothing(stack, versions):
    run_id = stack.run_deployment(ROLLBACK, {"target_version": "no-such-version"})
    run = stack.wait_for_run(run_id, timeout_s=180)
    assert run["state_type"] == "FAILED"
    assert "no-such-version" in run["state"]["message"]
    assert stack.store().get_alias("champion") == versions["second"]
    assert stack.fleet_stable() == {versions["second"]}


def test_rollback_deployment_moves_champion_back(stack, versions):
    run_id = stack.run_deployment(
        ROLLBACK, {"reason": "e2e: on-call rolls back", "actor": "e2e test"}
    )
    run = stack.wait_for_run(run_id, timeout_s=180)
    assert run["state_type"] == "COMPLETED", run["state"]["message"]
    store = stack.store()
    assert store.get_alias("champion") == versions["first"]
    last = store.alias_history("champion")[-1]
    assert (last.version, last.actor, last.reason) == (
        versions["first"],
        "e2e test",
        "e2e: on-call rolls back",
    )
    assert stack.fleet_stable() == {versions["first"]}


def test_planted_drift_is_detected_and_its_event_starts_a_release_through_the_trigger(
    stack, versions
):
    # The shop process `make up` runs (deployments/local/shop.sh), with drift planted the way an
    # operator plants it: its drift file. Shoppers whose devices moved to one kind call the real
    # fleet; drift-watch, run from its deployment, reads their impressions and alerts; the
    # trigger prefect.yaml declares on relay.drift.detected starts retrain-and-release.
    # First the shop's clean traffic: the same world the champion trained on, served through the
    # fleet and logged as impressions, must not look drifted.
    # At the deployment's family-wise 1 % a correct drift-watch fails about one clean window in
    # a hundred by design (bench.drift: 1.3 % of 300 served-shaped windows), so the clean check
    # runs at 0.1 %: a systematic mismatch (an earlier one was p 4e-7) still fails it.
    strict = {"window_minutes": 0.5, "rules": {"alpha": 0.001}}
    clean = stack.wait_for_run(stack.run_deployment(DRIFT, strict), 240)
    assert clean["state_type"] == "COMPLETED", clean["state"]["message"]
    clean_report = stack.artifacts(clean["id"])["drift-watch"]["data"]
    assert clean_report.startswith("# Drift watch: passed"), clean_report
    before = {r["id"] for r in stack.flow_runs_of(RELEASE)}
    drift_file = stack.home / "shop" / "drift.json"
    drift_file.write_text('{"kind": "device_mix", "magnitude": 0.5}')
    try:  # the shop reads it at its next round and keeps serving while drift-watch runs
        stack.wait_for(lambda: "drift device_mix x0.5" in stack.shop_log(), 30, "a drifted round")
        time.sleep(24)  # with the run's start-up, drift-watch's 30 s window is all drifted
        run_id = stack.run_deployment(DRIFT, {"window_minutes": 0.5})
        run = stack.wait_for_run(run_id, timeout_s=240)
    finally:
        drift_file.unlink()
    assert run["state_type"] == "COMPLETED", run["state"]["message"]
    report = stack.artifacts(run_id)["drift-watch"]["data"]
    assert "device_type" in report and "failed" in report, report

    def drift_events() -> list[dict[str, Any]]:  # the server persists events in batches
        query = {"filter": {"event": {"name": ["relay.drift.detected"]}, "order": "DESC"}}
        return stack.api("POST", "/events/filter", query)["events"]

    [event] = stack.wait_for(drift_events, timeout_s=30, what="relay.drift.detected event")
    assert "device_type" in event["payload"]["features"]
    assert event["resource"]["prefect.resource.id"] == f"relay.model.{versions['first']}"

    def triggered() -> list[dict[str, Any]]:
        return [r for r in stack.flow_runs_of(RELEASE) if r["id"] not in before]

    started = stack.wait_for(triggered, timeout_s=90, what="release run started by the trigger")
    assert len(started) == 1 and started[0]["parameters"]["actor"] == "drift-watch"
    # It runs as any release would, with the deployment's defaults; whether it is blessed
    # depends on the drifted traffic it trained on. It must not leave a canary behind.
    stack.end_release(started[0]["id"])
    assert stack.fleet_stable() == {versions["first"]}


def test_deploy_creates_the_crash_automations(stack):
    automations = {a["name"]: a for a in stack.api("POST", "/automations/filter", {})}
    silent = automations["relay-silent-release-is-crashed"]
    assert silent["trigger"]["posture"] == "Proactive" and silent["trigger"]["within"] == 90
    assert [a["type"] for a in silent["actions"]] == ["change-flow-run-state"]
    guard = stack.api("GET", f"/deployments/name/{GUARD}")
    reaction = automations["relay-guard-after-a-crashed-release"]
    assert reaction["trigger"]["expect"] == ["prefect.flow-run.Crashed"]
    assert [(a["type"], a["deployment_id"]) for a in reaction["actions"]] == [
        ("run-deployment", guard["id"])
    ]
    # deploying again replaces them rather than piling up copies
    stack._script("deploy.sh", timeout_s=240)
    names = [a["name"] for a in stack.api("POST", "/automations/filter", {})]
    assert sorted(names) == sorted(automations)


def test_a_release_whose_host_is_lost_mid_canary_is_crashed_and_its_canary_taken_out(
    stack, versions
):
    """SIGKILL the pool worker and the release's flow process together (a lost host): nothing
    marks the run but the heartbeat automation; the guard it triggers takes the canary out."""
    champion = stack.store().get_alias("champion")
    run_id = stack.run_deployment(
        RELEASE,
        merged(SMALL, seeded(3), {"analysis_window_s": 30.0, "gate": {"max_windows": 10}}),
    )
    stack.wait_for(lambda: stack.canary_weights() == {50}, 300, "the canary at 50 %")
    killed_at = time.monotonic()
    stack.kill_pool_worker()
    stack.start_pool_worker()  # a new host takes over the pool; the old run is not its business

    stack.wait_for(lambda: stack.canary_weights() == {0}, 150, "weight 0 on every worker")
    assert time.monotonic() - killed_at <= 90 + 30 + 5  # one lease plus one renewal period
    run = stack.wait_for_run(run_id, timeout_s=240)
    assert run["state_type"] == "CRASHED" and "no heartbeat" in run["state"]["message"]

    guards = stack.wait_for(
        lambda: [r for r in stack.flow_runs_of(GUARD) if r["state_type"] == "COMPLETED"],
        240,
        "a guard run after the crash",
    )
    said = str(stack.artifacts(guards[0]["id"])["fleet-reconciliation"]["data"])
    assert "repaired: canary" in said and "with no live release" in said, said
    assert {(w.stable_version, w.canary_version) for w in stack.fleet_state()} == {(champion, None)}
    assert stack.store().get_alias("champion") == champion
    rows = stack.release_events(run_id)
    assert ("reconcile", "repaired", "take_canary_out") in {
        (r["kind"], r["verdict"], r["details"].get("action")) for r in rows
    }, rows
    slot = stack.api("GET", f"/deployments/name/{RELEASE}")["global_concurrency_limit"]
    assert slot["active_slots"] == 0

    next_run = stack.wait_for_run(
        stack.run_deployment(RELEASE, merged(SMALL, seeded(4), {"deploy": False})), timeout_s=300
    )
    assert next_run["state_type"] == "COMPLETED", next_run["state"]["message"]

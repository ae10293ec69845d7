"""prefect.yaml is the single source of deployments: every entrypoint is a flow that accepts its parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.exceptions import ParameterTypeError
from prefect.flows import Flow, load_flow_from_entrypoint

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_entrypoint_is_a_flow_accepting_the_files_parameters(name):
    spec = DEPLOYMENTS[name]
    flow = load_flow_from_entrypoint(str(ROOT / spec["entrypoint"]))
    assert isinstance(flow, Flow)
    accepted = set(flow.parameters.properties)
    assert set(spec.get("parameters", {})) <= accepted, f"{name}: unknown parameters"
    flow.validate_parameters(dict(spec.get("parameters", {})))


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_work_pool_has_a_base_job_template(name):
    pool = DEPLOYMENTS[name]["work_pool"]["name"]
    assert (ROOT / "deployments" / "pools" / f"{pool}.json").is_file()


def test_expected_deployments_and_schedules():
    assert set(DEPLOYMENTS) == {
        "retrain-and-release",
        "rollback",
        "release-guard",
        "impact-report",
        "compile-tensorrt",
        "drift-watch",
    }
    assert DEPLOYMENTS["compile-tensorrt"]["work_pool"]["name"] == "gpu"
    weekly = DEPLOYMENTS["retrain-and-release"]["schedules"][0]
    assert weekly["cron"] == "0 3 * * 1" and weekly["timezone"] == "UTC"
    assert DEPLOYMENTS["retrain-and-release"]["concurrency_limit"]["limit"] == 1
    assert DEPLOYMENTS["drift-watch"]["schedules"][0]["interval"] == 900


def test_drift_alerts_start_a_release_through_a_valid_trigger():
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
    from prefect.events.schemas.events import Resource

    from core.drift.alerts import DRIFT_EVENT, drift_resource

    (spec,) = DEPLOYMENTS["retrain-and-release"]["triggers"]
    trigger = DeploymentEventTrigger.model_validate(spec)
    assert trigger.expect == {DRIFT_EVENT} and trigger.enabled
    # the resource drift-watch's event names is the one the trigger listens for
    assert trigger.match.matches(Resource.model_validate(drift_resource("v1", "lin")))
    assert not trigger.match.matches(Resource({"prefect.resource.id": "prefect.flow-run.x"}))


@pytest.mark.parametrize(
    "bad",
    [
        {"training": {"epochs": -1}},
        {"window_days": 0},
        {"data": {"min_rows": 0}},
        {"canary_steps": [-5]},
        {"canary_steps": [5, 150]},
        {"gate": {"max_p95_ms": 0}},
    ],
    ids=[
        "negative-epochs",
        "zero-window",
        "zero-min-rows",
        "negative-canary-weight",
        "weight-over-100",
        "zero-slo",
    ],
)
def test_invalid_release_parameters_are_rejected_before_any_work(bad):
    flow = load_flow_from_entrypoint(str(ROOT / DEPLOYMENTS["retrain-and-release"]["entrypoint"]))
    with pytest.raises(ParameterTypeError):
        flow.validate_parameters(bad)


AUTOMATIONS = yaml.safe_load((ROOT / "deployments" / "automations.yaml").read_text())["automations"]


def test_automations_file_validates_as_prefect_automations():
    from prefect.events.schemas.automations import AutomationCore

    for automation in AUTOMATIONS:
        AutomationCore.model_validate(automation)


def test_silent_release_automation_waits_three_heartbeats_of_what_flow_runs_are_told():
    """A healthy release must never be marked Crashed: the automation's silence is at least three
    heartbeats as the cpu pool (deployment runs) and the Makefile (`make demo`) set them."""
    import json
    import re

    from flows.release import retrain_and_release

    (silent,) = [a for a in AUTOMATIONS if a["name"] == "relay-silent-release-is-crashed"]
    trigger = silent["trigger"]
    assert trigger["match_related"]["prefect.resource.name"] == retrain_and_release.name
    pool = json.loads((ROOT / "deployments" / "pools" / "cpu.json").read_text())
    pool_s = int(
        pool["variables"]["properties"]["env"]["default"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]
    )
    make = re.search(
        r"PREFECT_FLOWS_HEARTBEAT_FREQUENCY \?= (\d+)", (ROOT / "Makefile").read_text()
    )
    assert make is not None
    assert trigger["within"] >= 3 * max(pool_s, int(make.group(1)))
    assert DEPLOYMENTS["retrain-and-release"]["work_pool"]["name"] == "cpu"


def test_the_guard_runs_when_a_release_crashes():
    (trigger,) = DEPLOYMENTS["release-guard"]["triggers"]
    assert trigger["expect"] == ["prefect.flow-run.Crashed"]
    assert trigger["match_related"] == {
        "prefect.resource.role": "flow",
        "prefect.resource.name": "retrain-and-release",
    }

"""Every run knob's default is written once, in the thresholds' own type, and `prefect.yaml` sets
only what production deliberately runs differently.

A flow's signature reads its defaults from the type the tasks consume (`CanaryRules`,
`GuardLimits`, `TrainConfig`, `DataLimits`, `CalibrationThresholds`, `ImpactOptions`), so a
default changed there changes the flow, the UI's form and every deployment at once. The first
half of this file pins that wiring: each such parameter's default equals the type's, and is
written as a reference to it, not as a second literal. The second half is the list of what
each deployment sets, with why: adding one is a decision this file has to be told about.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.drift.analysis import DriftRules
from core.impact.types import ImpactOptions
from flows.drift import drift_watch
from flows.guard import release_guard
from flows.impact import impact_report
from flows.release import retrain_and_release
from flows.rollback import rollback
from flows.tensorrt import compile_tensorrt_plan
from tasks.calibration import CalibrationThresholds
from tasks.canary_analysis import CanaryRules
from tasks.data import DataLimits
from tasks.guard import GuardLimits
from tasks.tensorrt import TensorRtBuildOptions, request_tensorrt_plan
from tasks.training import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}
FLOWS: dict[str, Any] = {
    "retrain-and-release": retrain_and_release,
    "rollback": rollback,
    "release-guard": release_guard,
    "impact-report": impact_report,
    "compile-tensorrt": compile_tensorrt_plan,
    "drift-watch": drift_watch,
}

RULES, LIMITS, TRAINING, DATA = CanaryRules(), GuardLimits(), TrainConfig(), DataLimits()
BLESSING, IMPACT, TENSORRT = CalibrationThresholds(), ImpactOptions(), TensorRtBuildOptions()

# flow -> parameter -> the default's one home (its type's value).
HOMES: dict[str, dict[str, Any]] = {
    "retrain-and-release": {
        "epochs": TRAINING.epochs,
        "batch_size": TRAINING.batch_size,
        "seed": TRAINING.seed,
        "min_rows": DATA.min_rows,
        "max_kl": BLESSING.max_kl,
        "max_auc_drop": BLESSING.max_auc_drop,
        "max_windows_per_step": RULES.max_windows,
        "slo_p95_ms": RULES.max_p95_ms,
        "slo_error_rate": RULES.max_error_rate,
        "confidence": RULES.confidence,
        "tolerance_pct": RULES.tolerance_pct,
        "tolerance_ms": RULES.tolerance_ms,
        "error_tolerance_pt": RULES.error_tolerance_pt,
        "min_requests": RULES.min_requests,
        "impact_min_sessions": IMPACT.min_sessions,
    },
    "release-guard": {
        "slo_p95_ms": LIMITS.max_p95_ms,
        "slo_error_rate": LIMITS.max_error_rate,
        "min_requests": LIMITS.min_requests,
        "max_auc_drop": LIMITS.max_auc_drop,
        "min_traffic_share": LIMITS.min_traffic_share,
    },
    "impact-report": {
        "min_sessions": IMPACT.min_sessions,
        "min_sessions_per_slot": IMPACT.min_sessions_per_slot,
        "refutation_simulations": IMPACT.refutation_simulations,
        "max_refutation_sessions": IMPACT.max_refutation_sessions,
        "seed": IMPACT.seed,
    },
    "compile-tensorrt": {"profile": TENSORRT.profile},
    "drift-watch": {
        "min_rows": DriftRules().min_rows,
        "sigma": DriftRules().sigma,
        "alpha": DriftRules().alpha,
        "wasserstein_limit": DriftRules().wasserstein_limit,
        "jensen_shannon_limit": DriftRules().jensen_shannon_limit,
        "cooldown_hours": DriftRules().cooldown_hours,
    },
}

# Still written twice: the signature's literal and its home. Pinned equal here until the
# signature reads the home like the others (then move the entry to HOMES).
COPIES: dict[str, dict[str, Any]] = {
    "retrain-and-release": {
        "tensorrt_wait_s": inspect.signature(request_tensorrt_plan.fn).parameters["wait_s"].default,
    },
    "compile-tensorrt": {"workspace_mib": TENSORRT.workspace_mib},
}

# deployment -> parameter -> (the value production runs, why it differs from the flow's default)
OVERRIDES: dict[str, dict[str, tuple[Any, str]]] = {
    "retrain-and-release": {
        "analysis_window_s": (60.0, "production looks are longer than the demo's 20 s windows"),
    },
    "rollback": {},
    "release-guard": {},
    "impact-report": {},
    "compile-tensorrt": {},
    "drift-watch": {},
}
# deployment -> parameter -> why it repeats the flow's default on purpose
REPEATED: dict[str, dict[str, str]] = {
    "rollback": {
        name: "a UI Quick run sends no parameters: these put target, reason and actor on its record"
        for name in ("target_version", "reason", "actor")
    },
}


def default_of(flow: Any, name: str) -> Any:
    return inspect.signature(flow.fn).parameters[name].default


def signature_defaults(flow: Any) -> dict[str, ast.expr]:
    """The default expressions of the flow function's parameters, as written in its source."""
    source = Path(inspect.getsourcefile(flow.fn) or "").read_text()
    [node] = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == flow.fn.__name__
    ]
    named = node.args.args[len(node.args.args) - len(node.args.defaults) :]
    return {a.arg: d for a, d in zip(named, node.args.defaults, strict=True)}


@pytest.mark.parametrize(
    ("flow_name", "parameter"),
    [(f, p) for f, params in HOMES.items() for p in params],
)
def test_flow_default_is_its_thresholds_types_default(flow_name, parameter):
    flow = FLOWS[flow_name]
    assert default_of(flow, parameter) == HOMES[flow_name][parameter]
    written = signature_defaults(flow)[parameter]
    # a reference to the type (RULES.max_windows, LIMITS.max_p95_ms, BatchProfile()), not a literal
    assert not isinstance(written, ast.Constant), (
        f"{flow_name}: {parameter} = {ast.unparse(written)} repeats its type's default; read it"
    )


@pytest.mark.parametrize(
    ("flow_name", "parameter"),
    [(f, p) for f, params in COPIES.items() for p in params],
)
def test_a_default_still_written_twice_agrees_with_its_copy(flow_name, parameter):
    assert default_of(FLOWS[flow_name], parameter) == COPIES[flow_name][parameter]


def test_the_guard_holds_the_champion_to_the_canarys_slo_and_the_blessings_auc_limit():
    assert (LIMITS.max_p95_ms, LIMITS.max_error_rate) == (RULES.max_p95_ms, RULES.max_error_rate)
    assert LIMITS.max_auc_drop == BLESSING.max_auc_drop


@pytest.mark.parametrize("parameter", sorted(HOMES["impact-report"]))
def test_impact_flow_bounds_agree_with_impact_options(parameter):
    flow = FLOWS["impact-report"]
    declared = ImpactOptions.model_json_schema()["properties"][parameter]
    accepted = flow.parameters.properties[parameter]
    for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        assert accepted.get(bound) == declared.get(bound), f"{parameter}: {bound}"


def test_every_deployment_is_listed_here():
    assert set(OVERRIDES) == set(DEPLOYMENTS) == set(FLOWS)
    assert set(REPEATED) <= set(DEPLOYMENTS)


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_deployment_sets_exactly_the_declared_parameters(name):
    set_here = DEPLOYMENTS[name].get("parameters") or {}
    declared = set(OVERRIDES[name]) | set(REPEATED.get(name, {}))
    assert set(set_here) == declared, (
        f"{name}: prefect.yaml sets {sorted(set_here)}; an override is a decision: declare it "
        "with its reason in OVERRIDES (or drop a value equal to the flow's default)"
    )
    for parameter, (value, _why) in OVERRIDES[name].items():
        assert set_here[parameter] == value, parameter


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_an_override_differs_from_the_flows_default_and_a_repeat_equals_it(name):
    flow, set_here = FLOWS[name], DEPLOYMENTS[name].get("parameters") or {}
    for parameter in OVERRIDES[name]:
        assert set_here[parameter] != default_of(flow, parameter), f"{name}: {parameter}"
    for parameter in REPEATED.get(name, {}):
        assert set_here[parameter] == default_of(flow, parameter), f"{name}: {parameter}"


def test_no_shared_parameter_block_in_definitions():
    # Anchored parameter blocks merged into several deployments were how defaults got copied.
    assert "parameters" not in SPEC["definitions"]

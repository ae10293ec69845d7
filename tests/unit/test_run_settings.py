"""Typed run settings: a flow takes the rules its stages consume as parameters, whole.

`retrain_and_release` takes `DataLimits`, `TrainConfig`, `CalibrationThresholds`, `CanaryRules`
and `ImpactOptions`; `release_guard` takes `GuardLimits`; `drift_watch` takes `DriftRules`. Each
default is written once, in its type: the deployment's parameter schema (what Prefect's run form
renders and the API validates against) shows every field of every model with that default, and
a deployment in `prefect.yaml` sets only the nested fields it changes, each with why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import ValidationError, validate

from core.calibration.assessment import CalibrationThresholds
from core.data.validation import DataLimits
from core.drift.analysis import DriftRules
from core.impact.types import ImpactOptions
from core.training.model import TrainConfig
from flows.drift import drift_watch
from flows.guard import release_guard
from flows.impact import impact_report
from flows.release import retrain_and_release
from flows.rollback import rollback
from flows.tensorrt import compile_tensorrt_plan
from tasks.canary_analysis import CanaryRules
from tasks.guard import GuardLimits
from tasks.shadow import ShadowRules
from tests.unit.test_prefect_yaml import DEPLOYMENTS, ROOT

FLOWS: dict[str, Any] = {
    "retrain-and-release": retrain_and_release,
    "rollback": rollback,
    "release-guard": release_guard,
    "impact-report": impact_report,
    "compile-tensorrt": compile_tensorrt_plan,
    "drift-watch": drift_watch,
}
# flow -> parameter -> the rules model it takes
MODELS: dict[str, dict[str, type]] = {
    "retrain-and-release": {
        "data": DataLimits,
        "training": TrainConfig,
        "blessing": CalibrationThresholds,
        "gate": CanaryRules,
        "shadow": ShadowRules,
        "impact": ImpactOptions,
    },
    "release-guard": {"limits": GuardLimits},
    "drift-watch": {"rules": DriftRules},
}
# deployment -> parameter -> (the value production runs, why it differs from the flow's default)
OVERRIDES: dict[str, dict[str, tuple[Any, str]]] = {
    "retrain-and-release": {
        "analysis_window_s": (60.0, "production looks are longer than the demo's 20 s windows"),
    },
}
# deployment -> parameter -> why it repeats the flow's default on purpose
REPEATED: dict[str, dict[str, str]] = {
    "rollback": {
        name: "a UI Quick run sends no parameters: these put target, reason and actor on its record"
        for name in ("target_version", "reason", "actor")
    },
}


def defaults_of(model: type) -> dict[str, Any]:
    """Each field's default as the type itself writes it."""
    if dataclasses.is_dataclass(model):
        return {f.name: f.default for f in dataclasses.fields(model)}
    return {name: info.default for name, info in model.model_fields.items()}  # type: ignore[attr-defined]


def schema_of(flow: Any) -> dict[str, Any]:
    return parameter_schema(flow).model_dump_for_openapi()


@pytest.mark.parametrize(
    ("flow_name", "parameter"), [(f, p) for f, models in MODELS.items() for p in models]
)
def test_the_run_form_shows_every_field_of_the_rules_model_with_its_types_default(
    flow_name: str, parameter: str
) -> None:
    model = MODELS[flow_name][parameter]
    schema = schema_of(FLOWS[flow_name])
    prop = schema["properties"][parameter]
    assert prop["$ref"] == f"#/definitions/{model.__name__}"  # one nested form, not loose fields
    fields = schema["definitions"][model.__name__]["properties"]
    defaults = defaults_of(model)
    assert set(fields) == set(defaults)
    shown = validate_and_build(FLOWS[flow_name], {})[parameter]
    assert shown == model()  # the run's value when nobody changes the form
    for name, default in defaults.items():
        if isinstance(default, (int, float, str, bool)):
            assert fields[name]["default"] == default, f"{model.__name__}.{name}"


def validate_and_build(flow: Any, parameters: dict[str, Any]) -> dict[str, Any]:
    return flow.validate_parameters(parameters)


def test_a_nested_override_changes_that_field_and_the_rest_keep_their_defaults() -> None:
    built = validate_and_build(
        retrain_and_release, {"gate": {"max_windows": 3}, "training": {"epochs": 4}}
    )
    assert built["gate"] == dataclasses.replace(CanaryRules(), max_windows=3)
    assert built["training"] == dataclasses.replace(TrainConfig(), epochs=4)
    assert built["data"] == DataLimits()


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ({"gate": {"confidence": 1.0}}, "gate.confidence"),
        ({"training": {"epochs": 0}}, "training.epochs"),
        ({"blessing": {"max_kl": 0}}, "blessing.max_kl"),
        ({"data": {"min_rows": 0}}, "data.min_rows"),
    ],
)
def test_the_api_refuses_a_nested_field_out_of_bounds_naming_it(
    parameters: dict[str, Any], field: str
) -> None:
    # what the server runs on create_flow_run, before any flow run exists
    with pytest.raises(ValidationError, match=f"Validation failed for field '{field}'"):
        validate(parameters, schema_of(retrain_and_release), raise_on_error=True)
    with pytest.raises(ParameterTypeError):
        validate_and_build(retrain_and_release, parameters)


def test_the_guard_and_drift_flows_take_their_limits_whole() -> None:
    assert validate_and_build(release_guard, {"limits": {"min_requests": 40}})[
        "limits"
    ] == dataclasses.replace(GuardLimits(), min_requests=40)
    rules = validate_and_build(drift_watch, {"rules": {"cooldown_hours": 1.5}})["rules"]
    assert rules == dataclasses.replace(DriftRules(), cooldown_hours=1.5)


@pytest.mark.parametrize("flow_name", sorted(MODELS))
def test_no_flow_repeats_a_field_of_its_rules_as_a_parameter_of_its_own(flow_name: str) -> None:
    own = set(schema_of(FLOWS[flow_name])["properties"]) - set(MODELS[flow_name])
    for model in MODELS[flow_name].values():
        assert not own & set(defaults_of(model)), (
            f"{flow_name} copies {own & set(defaults_of(model))}"
        )


def test_the_guard_holds_the_champion_to_the_canarys_slo_and_the_blessings_auc_limit() -> None:
    limits, rules, blessing = GuardLimits(), CanaryRules(), CalibrationThresholds()
    assert (limits.max_p95_ms, limits.max_error_rate) == (rules.max_p95_ms, rules.max_error_rate)
    assert limits.max_auc_drop == blessing.max_auc_drop


def test_every_deployment_is_of_a_known_flow() -> None:
    assert set(DEPLOYMENTS) == set(FLOWS)
    assert set(OVERRIDES) | set(REPEATED) <= set(DEPLOYMENTS)


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_a_deployment_sets_only_declared_parameters_and_they_validate(name: str) -> None:
    set_here = DEPLOYMENTS[name].get("parameters") or {}
    declared = set(OVERRIDES.get(name, {})) | set(REPEATED.get(name, {}))
    assert set(set_here) == declared, (
        f"{name}: prefect.yaml sets {sorted(set_here)}; an override is a decision: declare it "
        "with its reason in OVERRIDES (or drop a value equal to the flow's default)"
    )
    built = validate_and_build(FLOWS[name], set_here)
    defaults = validate_and_build(FLOWS[name], {})
    for parameter, (value, _why) in OVERRIDES.get(name, {}).items():
        assert set_here[parameter] == value and built[parameter] != defaults[parameter]
    for parameter in REPEATED.get(name, {}):
        assert built[parameter] == defaults[parameter], f"{name}: {parameter}"


def test_no_shared_parameter_block_in_definitions() -> None:
    # Anchored parameter blocks merged into several deployments were how defaults got copied.
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert "parameters" not in spec["definitions"]

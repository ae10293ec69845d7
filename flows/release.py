"""retrain_and_release: from events in ClickHouse to a blessed, canaried, gated release.

The body reads like the release checklist. It branches only on typed verdicts; every number is
computed in a task. The canary runs inside a Prefect transaction: a rejected canary raises, and
the deploy task's on_rollback hook takes the canary out of every worker. A run that crashes or is
cancelled takes its canary out in its on_crashed / on_cancellation hook; one killed outright
leaves it to the canary's lease (weight 0 on every worker within one lease) and to the release
guard, which Prefect runs when the run is marked Crashed (tasks/reconcile.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Annotated

from prefect import flow
from prefect.runtime import flow_run
from prefect.transactions import transaction
from pydantic import Field

from core.gate.capacity import CapacityRules, anchor_at_peak
from core.gate.plan import CanaryPlan
from core.impact.types import ImpactOptions
from flows.impact import impact_report
from relay.settings import Settings, get_settings
from relay.types import GateResult, Release, ReleaseOutcome, Verdict
from tasks.attribution import explain_canary_rejection
from tasks.calibration import (
    CalibrationThresholds,
    assess_candidate_calibration,
    ensure_calibration_set,
)
from tasks.canary import (
    CanaryDecision,
    CanaryRejected,
    PlanDecision,
    RefusedBeforeUsers,
    ask_a_person,
    canary_period,
    check_blessing,
    decision_verdict,
    deploy_canary,
    deploy_first_release,
    plan_decision_verdict,
    promote_canary,
    read_fleet_stable,
    record_decision,
    set_canary_weight,
)
from tasks.canary_analysis import CanaryRules, analyse_canary_step
from tasks.canary_plan import anchor_at_history_peak, plan_canary_steps
from tasks.capacity import check_capacity
from tasks.compilation import compile_engines
from tasks.data import (
    DataLimits,
    TrainingWindow,
    read_training_window,
    validate_training_data,
    window_ending,
)
from tasks.export import export_onnx
from tasks.impact import measure_release_experiment, publish_impact_history
from tasks.lineage import compute_lineage
from tasks.reconcile import take_out_canary_of_dead_release
from tasks.registry import Registration, register_candidate
from tasks.rollback import record_rollback
from tasks.shadow import ShadowRules, shadow_candidate
from tasks.summary import ReleaseSummary, finish_release, publish_release_summary
from tasks.tensorrt import request_tensorrt_plan
from tasks.training import TrainConfig, train_ctr_model
from tasks.workdir import run_workdir

# A step's canary share; the baseline takes as many users again, so at most half.
CanaryPercent = Annotated[int, Field(ge=1, le=50)]


@flow(
    name="retrain-and-release",
    log_prints=True,
    # where the process outlives its crash; after a SIGKILL the lease and the guard do it
    on_crashed=[take_out_canary_of_dead_release],
    on_cancellation=[take_out_canary_of_dead_release],
)
def retrain_and_release(
    window_days: Annotated[float, Field(gt=0, le=90)] = 7.0,
    window_end: datetime | None = None,
    train_on_served: bool = False,
    actor: str = "schedule",
    deploy: bool = True,
    canary_steps: Annotated[list[CanaryPercent], Field(min_length=1)] = [5, 25, 50],  # noqa: B006 - pydantic copies
    analysis_window_s: Annotated[float, Field(gt=0, le=3600)] = 20.0,
    approval_timeout_s: Annotated[int, Field(ge=1)] = 3600,
    tensorrt_wait_s: Annotated[float, Field(ge=0, le=7200)] = 900.0,
    impact_report_after: bool = True,
    # The rules and knobs, each the type its stage consumes: the run form shows every field
    # with its default, and a deployment sets only the nested fields it changes.
    data: DataLimits = DataLimits(),  # noqa: B008 - frozen: never mutated
    training: TrainConfig = TrainConfig(),  # noqa: B008
    blessing: CalibrationThresholds = CalibrationThresholds(),  # noqa: B008
    gate: CanaryRules = CanaryRules(),  # noqa: B008
    capacity: CapacityRules = CapacityRules(),  # noqa: B008
    shadow: ShadowRules = ShadowRules(),  # noqa: B008
    impact: ImpactOptions = ImpactOptions(),  # noqa: B008
) -> ReleaseSummary:
    """Validate, train, export, compile, hash, register, bless, canary, gate, promote or roll back."""
    settings = get_settings()
    started = datetime.now(UTC)  # the canary plan's basis is the traffic before this
    window = window_ending(window_end, window_days)
    workdir = run_workdir(settings)

    registration, summary = _build_candidate(
        settings, window, train_on_served, data, training, workdir, actor
    )
    release = Release(
        str(flow_run.id or registration.version), registration.version, registration.lineage_id
    )
    calibration = ensure_calibration_set(settings, workdir, window)
    assess_candidate_calibration(settings, release.version, calibration, blessing, workdir)
    end = partial(finish_release, settings, summary, release)  # the release ends: outcome, why
    blessed = check_blessing(settings, release)
    if blessed.verdict is not Verdict.passed:
        return end(ReleaseOutcome.not_deployed, blessed.reason)
    if not deploy:
        return end(ReleaseOutcome.blessed, "deploy=false: blessed, not deployed")

    request_tensorrt_plan(settings, release.version, wait_s=tensorrt_wait_s)  # needs a gpu pool
    stable = read_fleet_stable(settings)
    if stable is None:
        return _first_release(settings, summary, release)
    if stable == release.version:
        return end(ReleaseOutcome.unchanged, "the fleet already serves this version")

    gate = _anchored(settings, gate, stable, capacity)
    replan = _planner(settings, release, stable, canary_steps, analysis_window_s, started)
    plan = replan(gate)
    if not plan.reachable:  # say so before any traffic moves, and let a person decide
        go = _ask_to_start(settings, release, plan, approval_timeout_s)
        if go.verdict is not Verdict.passed:
            return end(ReleaseOutcome.not_deployed, go.reason)
    outcome, reason = _canary(
        settings,
        release,
        stable,
        (plan, replan),
        canary_steps,
        analysis_window_s,
        approval_timeout_s,
        gate,
        capacity,
        shadow,
    )
    # canary vs baseline: the release's randomized effect, filed before the report shows it
    measure_release_experiment(settings, release, stable, outcome, return_state=True)
    if impact_report_after and outcome is not ReleaseOutcome.refused:  # a refused one had no users
        _report_canary_impact(settings, release, stable, impact)
    return _finish_with_history(settings, summary, release, outcome, reason)


def _anchored(
    settings: Settings, gate: CanaryRules, stable: str, capacity: CapacityRules
) -> CanaryRules:
    """The gate anchored at the champion's P95 at peak from the log store's history, unless the
    capacity check is on: it measures that P95 itself, before the first step."""
    if capacity.enabled:
        return gate
    return anchor_at_history_peak(settings, gate, stable, capacity.history_days)


def _planner(
    settings: Settings,
    release: Release,
    stable: str,
    canary_steps: list[int],
    window_s: float,
    started: datetime,
) -> Callable[[CanaryRules], CanaryPlan]:
    """The canary plan for given rules: once before the canary, again once they are anchored."""
    return partial(
        plan_canary_steps,
        settings,
        release,
        canary_steps,
        window_s,
        release_started=started,
        champion=stable,
    )


def _build_candidate(
    settings: Settings,
    window: TrainingWindow,
    train_on_served: bool,
    data: DataLimits,
    training: TrainConfig,
    workdir: Path,
    actor: str,
) -> tuple[Registration, ReleaseSummary]:
    """Validated window -> trained model -> ONNX -> engines -> lineage -> registered version."""
    frame = read_training_window(settings, window, served=train_on_served)
    validate_training_data(frame, window, data)
    trained = train_ctr_model(frame, training, workdir)
    model_path = export_onnx(trained, workdir)
    compiled = compile_engines(model_path, trained, workdir)
    lineage = compute_lineage(model_path, frame, compiled.engines, str(window))
    registration = register_candidate(settings, trained, compiled, lineage, workdir, actor)
    return registration, publish_release_summary(registration, trained, compiled, lineage)


def _first_release(settings: Settings, summary: ReleaseSummary, release: Release) -> ReleaseSummary:
    """No stable to canary against: the candidate becomes stable everywhere."""
    deploy_first_release(settings, release)
    # filed as "no experiment" (no baseline), so the history lists every release
    measure_release_experiment(settings, release, None, ReleaseOutcome.promoted, return_state=True)
    return _finish_with_history(
        settings,
        summary,
        release,
        ReleaseOutcome.promoted,
        "first release: no stable to canary against, deployed as stable",
    )


def _ask_to_start(
    settings: Settings, release: Release, plan: CanaryPlan, approval_timeout_s: int
) -> GateResult:
    """The plan says the traffic cannot reach a verdict: a person decides whether to start."""
    answer = ask_a_person(
        PlanDecision,
        f"Canary plan for {release.version}: {plan.summary}. Start the canary anyway?",
        approval_timeout_s,
    )
    go = plan_decision_verdict(answer or PlanDecision(), timed_out=answer is None)
    record_decision(settings, release, go, weight=0)
    return go


def _report_canary_impact(
    settings: Settings, release: Release, stable: str, impact: ImpactOptions
) -> None:
    """What the canary's latency cost in GMV, over the canary's own window; attached to the
    candidate. A report that fails never fails the release (`return_state`)."""
    start, end = canary_period(settings, release)
    impact_report(
        start=start,
        end=end,
        model_versions=[stable, release.version],
        attach_to=release.version,
        min_sessions=impact.min_sessions,
        min_sessions_per_slot=impact.min_sessions_per_slot,
        refutation_simulations=impact.refutation_simulations,
        max_refutation_sessions=impact.max_refutation_sessions,
        seed=impact.seed,
        return_state=True,
    )


def _canary(
    settings: Settings,
    release: Release,
    stable: str,
    plans: tuple[CanaryPlan, Callable[[CanaryRules], CanaryPlan]],
    canary_steps: list[int],
    analysis_window_s: float,
    approval_timeout_s: int,
    gate: CanaryRules,
    capacity: CapacityRules,
    shadow: ShadowRules,
) -> tuple[ReleaseOutcome, str]:
    """The candidate beside its baseline: capacity and shadow at weight 0, then the weighted
    steps. Any refusal or rejection raises inside the transaction, so the deploy's on_rollback
    hook takes canary and baseline out of every worker before this returns.

    The capacity check measures the champion's P95 at the fleet's peak; unless the run set
    `gate.peak_p95_ms`, the steps count `tolerance_ms` against it, planned again for that."""
    decided: list[str] = []  # steps a person passed: the outcome says so
    plan, replan = plans
    try:
        with transaction() as txn:
            txn.set("release", release)
            # load and warm the canary, and the stable version again as its baseline, everywhere
            deploy_canary(settings, release, baseline=stable, weight=0)
            if capacity.enabled:  # before any user: a candidate that cannot take the peak
                checked = check_capacity(settings, release, gate.max_p95_ms, capacity)
                if checked.verdict in (Verdict.failed, Verdict.error):  # inconclusive goes on
                    txn.set("verdict_at", time.time())
                    raise RefusedBeforeUsers("capacity check", checked)
                if (anchored := anchor_at_peak(gate, checked)) is not gate:
                    gate, plan = anchored, replan(anchored)
            shadowed = shadow_candidate(settings, release, stable, shadow, gate)
            if shadowed.verdict in (Verdict.failed, Verdict.error):
                txn.set("verdict_at", time.time())
                raise RefusedBeforeUsers("shadow stage", shadowed)
            for weight in canary_steps:
                set_canary_weight(settings, release, weight)
                planned = plan.step(weight)  # a guard step, or a longer last one, at thin traffic
                step = analyse_canary_step(
                    settings,
                    release,
                    stable,
                    weight,
                    gate,
                    analysis_window_s,
                    planned.length(gate) if planned is not None else None,
                )
                # inconclusive, or invalid (a skewed split): hold the weight, a person decides
                if step.verdict in (Verdict.inconclusive, Verdict.invalid):
                    answer = ask_a_person(
                        CanaryDecision,
                        f"Canary {release.version} at {weight}%: {step.reason}. Promote or roll back?",
                        approval_timeout_s,
                    )
                    step = decision_verdict(answer or CanaryDecision(), timed_out=answer is None)
                    record_decision(settings, release, step, weight=weight)
                    decided.append(f"at {weight}% {step.reason}")
                if step.verdict is not Verdict.passed:
                    txn.set("verdict_at", time.time())  # the hook measures verdict -> weight 0
                    raise CanaryRejected(step)
            reason = f"canary passed at {canary_steps[-1]}%: promoted to stable"
            if decided:
                reason = f"promoted to stable after the canary ({'; '.join(decided)})"
            promote_canary(settings, release, reason)
            return ReleaseOutcome.promoted, reason
    except RefusedBeforeUsers as refused:  # nobody saw it: refused, not rolled back
        return ReleaseOutcome.refused, refused.reason
    except CanaryRejected as rejected:
        record_rollback(settings, release, rejected.gate)
        # only now, with the canary out of traffic: why its latency regressed, if it did
        explained = explain_canary_rejection(settings, release, stable, rejected.gate)
        return ReleaseOutcome.rolled_back, explained.reason


def _finish_with_history(
    settings: Settings,
    summary: ReleaseSummary,
    release: Release,
    outcome: ReleaseOutcome,
    reason: str,
) -> ReleaseSummary:
    """Republish the impact history and end the release with its outcome; a history page that
    fails to build never fails the release."""
    history = publish_impact_history(settings, return_state=True)
    return finish_release(
        settings,
        summary,
        release,
        outcome,
        reason,
        history_url=history.result() if history.is_completed() else None,
    )

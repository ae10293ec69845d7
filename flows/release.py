"""retrain_and_release: from events in ClickHouse to a blessed, canaried, gated release.

The body reads like the release checklist. It branches only on typed verdicts; every number is
computed in a task. The canary runs inside a Prefect transaction: a rejected canary raises, and
the deploy task's on_rollback hook takes the canary out of every worker.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated

from prefect import flow
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.runtime import flow_run
from prefect.transactions import transaction
from pydantic import Field

from flows.impact import impact_report
from relay.settings import get_settings
from relay.types import Verdict
from simulation.traffic import LiveTraffic
from tasks.calibration import (
    CalibrationThresholds,
    assess_candidate_calibration,
    ensure_calibration_set,
)
from tasks.canary import (
    CanaryDecision,
    CanaryRejected,
    Release,
    analyse_canary_step,
    canary_period,
    check_blessing,
    decision_verdict,
    deploy_canary,
    deploy_first_release,
    promote_canary,
    read_fleet_stable,
    record_rollback,
    set_canary_weight,
)
from tasks.compilation import compile_engines
from tasks.data import DataLimits, read_training_window, validate_training_data, window_ending
from tasks.export import export_onnx
from tasks.lineage import compute_lineage
from tasks.registry import register_candidate
from tasks.slo import SloThresholds
from tasks.summary import ReleaseSummary, finish_release, publish_release_summary
from tasks.tensorrt import request_tensorrt_plan
from tasks.training import TrainConfig, train_ctr_model
from tasks.workdir import run_workdir

Percent = Annotated[int, Field(ge=1, le=100)]


@flow(name="retrain-and-release", log_prints=True)
def retrain_and_release(
    window_days: Annotated[float, Field(gt=0, le=90)] = 7.0,
    window_end: datetime | None = None,
    epochs: Annotated[int, Field(ge=1, le=50)] = 2,
    batch_size: Annotated[int, Field(ge=32, le=65_536)] = 1024,
    seed: int = 7,
    min_rows: Annotated[int, Field(ge=1)] = 10_000,
    actor: str = "schedule",
    deploy: bool = True,
    max_kl: Annotated[float, Field(gt=0)] = 0.05,
    max_auc_drop: Annotated[float, Field(ge=0, le=1)] = 0.02,
    canary_steps: Annotated[list[Percent], Field(min_length=1)] = [5, 25, 50],  # noqa: B006 - pydantic copies
    analysis_window_s: Annotated[float, Field(gt=0, le=3600)] = 20.0,
    max_windows_per_step: Annotated[int, Field(ge=1, le=100)] = 3,
    slo_p95_ms: Annotated[float, Field(gt=0)] = 300.0,
    slo_error_rate: Annotated[float, Field(gt=0, le=1)] = 0.01,
    canary_p95_ratio: Annotated[float, Field(ge=1)] = 1.2,
    canary_p95_slack_ms: Annotated[float, Field(ge=0)] = 10.0,
    min_requests: Annotated[int, Field(ge=1)] = 200,
    approval_timeout_s: Annotated[int, Field(ge=1)] = 3600,
    simulate_traffic: bool = True,
    traffic_rps: Annotated[float, Field(gt=0, le=5000)] = 40.0,
    tensorrt_wait_s: Annotated[float, Field(ge=0, le=7200)] = 900.0,
    impact_report_after: bool = True,
    impact_min_sessions: Annotated[int, Field(ge=10)] = 500,
) -> ReleaseSummary:
    """Validate, train, export, compile, hash, register, bless, canary, gate, promote or roll back."""
    settings = get_settings()
    window = window_ending(window_end, window_days)
    workdir = run_workdir(settings)

    frame = read_training_window(settings, window)
    validate_training_data(frame, window, DataLimits(min_rows=min_rows))
    trained = train_ctr_model(
        frame, TrainConfig(seed=seed, epochs=epochs, batch_size=batch_size), workdir
    )
    model_path = export_onnx(trained, workdir)
    compiled = compile_engines(model_path, trained, workdir)
    lineage = compute_lineage(model_path, frame, compiled.engines, str(window))
    registration = register_candidate(settings, trained, compiled, lineage, workdir, actor)
    summary = publish_release_summary(registration, trained, compiled, lineage)

    release = Release(
        str(flow_run.id or registration.version), registration.version, registration.lineage_id
    )
    calibration = ensure_calibration_set(settings, workdir, window)
    assess_candidate_calibration(
        settings,
        release.version,
        calibration,
        CalibrationThresholds(max_kl=max_kl, max_auc_drop=max_auc_drop),
        workdir,
    )
    blessing = check_blessing(settings, release)
    if blessing.verdict is not Verdict.passed:
        return finish_release(settings, summary, release, "not_deployed", blessing.reason)
    if not deploy:
        return finish_release(
            settings, summary, release, "blessed", "deploy=false: blessed, not deployed"
        )

    request_tensorrt_plan(
        settings, release.version, wait_s=tensorrt_wait_s
    )  # skipped without a gpu pool
    stable = read_fleet_stable(settings)
    if stable is None:
        deploy_first_release(settings, release)
        return finish_release(
            settings,
            summary,
            release,
            "promoted",
            "first release: no stable to canary against, deployed as stable",
        )
    if stable == release.version:
        return finish_release(
            settings, summary, release, "unchanged", "the fleet already serves this version"
        )

    limits = SloThresholds(
        max_p95_ms=slo_p95_ms,
        max_error_rate=slo_error_rate,
        max_p95_ratio=canary_p95_ratio,
        min_p95_delta_ms=canary_p95_slack_ms,
        min_requests=min_requests,
    )
    traffic = (
        LiveTraffic(rate_rps=traffic_rps, duration_s=analysis_window_s, seed=seed)
        if simulate_traffic
        else None
    )
    outcome, reason = "promoted", f"canary passed at {canary_steps[-1]}%: promoted to stable"
    try:
        with transaction() as txn:
            txn.set("release", release)
            deploy_canary(settings, release, weight=0)  # load and warm everywhere first
            for weight in canary_steps:
                set_canary_weight(settings, release, weight)
                gate = analyse_canary_step(
                    settings,
                    release,
                    weight,
                    limits,
                    analysis_window_s,
                    max_windows_per_step,
                    traffic,
                )
                if gate.verdict is Verdict.inconclusive:
                    try:
                        decision = pause_flow_run(
                            wait_for_input=CanaryDecision.with_initial_data(
                                description=f"Canary {release.version} at {weight}%: {gate.reason}. Promote or roll back?"
                            ),
                            timeout=approval_timeout_s,
                        )
                        gate = decision_verdict(decision, timed_out=False)
                    except FlowPauseTimeout:
                        gate = decision_verdict(CanaryDecision(), timed_out=True)
                if gate.verdict is not Verdict.passed:
                    txn.set("verdict_at", time.time())  # the hook measures verdict -> weight 0
                    raise CanaryRejected(gate)
            promote_canary(settings, release)
    except CanaryRejected as rejected:
        record_rollback(settings, release, rejected.gate)
        outcome, reason = "rolled_back", rejected.gate.reason

    if impact_report_after:  # what the canary's latency cost, over the canary's own window
        start, end = canary_period(settings, release)
        impact_report(
            start=start,
            end=end,
            model_versions=[stable, release.version],
            attach_to=release.version,
            min_sessions=impact_min_sessions,
            return_state=True,
        )
    return finish_release(settings, summary, release, outcome, reason)

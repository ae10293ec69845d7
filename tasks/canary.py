"""Canary release on the serving fleet: deploy (with its baseline), step the weight, promote.

Deploy consumes the stored blessing and refuses anything unblessed. The canary goes out with a
baseline beside it: the stable version loaded fresh into its own slot, taking the same share
of users, so the gate (`tasks.canary_analysis`) compares equals. The deploy task's
`on_rollback` hook takes canary and baseline out of every worker when the enclosing Prefect
transaction fails (a `failed`/`error` verdict, a refusal at the pause, a crash), and records how
long it took from the verdict to weight 0 everywhere. Rollback of a champion lives in
`tasks.rollback`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.events import emit_event
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.states import Running
from prefect.transactions import Transaction

import logstore
from logstore.release_events import (
    ActionVerdict,
    EventKind,
    ReleaseEvent,
    events_of_release,
    record_event,
)
from model_store import open_store
from model_store.calibration import load_report
from relay.errors import GateFailed, ServingError
from relay.settings import Settings, get_settings
from relay.types import CanaryRemoval, GateResult, Release, Verdict
from serving.fleet import FleetClient, FleetResult
from tasks.aliases import move_alias
from tasks.canary_removal import take_canary_out
from tasks.tracing import release_span, release_tracer, traced

CHAMPION = "champion"
Answer = TypeVar("Answer", bound=RunInput)


class CanaryRejected(GateFailed):
    """The canary must not continue; raising it inside the transaction rolls the deploy back."""

    def __init__(self, gate: GateResult) -> None:
        super().__init__(f"canary rejected ({gate.verdict.value}): {gate.reason}")
        self.gate = gate


class RefusedBeforeUsers(CanaryRejected):
    """A stage at weight 0 (the capacity check, the shadow) refused the candidate: the deploy
    rolls back, and no user was ever routed to it, so the release is refused, not rolled back."""

    def __init__(self, stage: str, gate: GateResult) -> None:
        super().__init__(gate)
        self.reason = f"refused by the {stage} before any user: {gate.reason}"


class CanaryDecision(RunInput):
    """What the on-call engineer decides when the evidence is inconclusive."""

    decision: Literal["promote", "roll back"] = "roll back"
    comment: str = ""


class PlanDecision(RunInput):
    """What the on-call engineer decides when the plan says the traffic cannot reach a verdict."""

    decision: Literal["start the canary", "do not deploy"] = "do not deploy"
    comment: str = ""


def ask_a_person(form: type[Answer], question: str, timeout_s: int) -> Answer | None:
    """Pause the release for a person's answer (the form in the UI); None if nobody answered.

    Prefect's server refuses every state change of a run whose pause has expired, so a release
    that rightly takes its no-answer default would end `Failed` ("never resumed") however
    cleanly it finished. The run is alive and going on, so it is put back to Running (forced:
    no orchestration rule admits it) and ends in the state its outcome earns.
    """
    try:
        return pause_flow_run(
            wait_for_input=form.with_initial_data(description=question), timeout=timeout_s
        )
    except FlowPauseTimeout:
        context = FlowRunContext.get()
        if context is not None and context.flow_run is not None:
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(
                    context.flow_run.id,
                    Running(message=f"nobody answered within {timeout_s} s: going on"),
                    force=True,
                )
        return None


def plan_decision_verdict(decision: PlanDecision, timed_out: bool) -> GateResult:
    """A person's answer to an unreachable canary plan, as a verdict (no answer: not deployed)."""
    if timed_out:
        reason = "not deployed: the canary plan could not reach a verdict and nobody answered"
        return GateResult(gate="plan", verdict=Verdict.failed, reason=reason)
    comment = decision.comment or "no comment"
    if decision.decision == "start the canary":
        return GateResult(
            gate="plan", verdict=Verdict.passed, reason=f"canary started by a person: {comment}"
        )
    return GateResult(
        gate="plan", verdict=Verdict.failed, reason=f"not deployed by a person: {comment}"
    )


def record(
    settings: Settings,
    release: Release,
    kind: EventKind,
    verdict: StrEnum,
    reason: str,
    **details: Any,
) -> None:
    """Append one release event to ClickHouse (its kinds and verdicts: logstore.release_events)."""
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    record_event(
        client,
        ReleaseEvent(
            release.release_id, release.version, release.lineage_id, kind, verdict, reason, details
        ),
    )


def fleet_details(result: FleetResult) -> dict[str, Any]:
    return result.details()


def decision_verdict(decision: CanaryDecision, timed_out: bool) -> GateResult:
    """A person's decision (or its absence) as a verdict the flow can branch on."""
    if timed_out:
        return GateResult(
            gate="approval",
            verdict=Verdict.failed,
            reason="no decision before the approval timeout: rolling back",
        )
    if decision.decision == "promote":
        return GateResult(
            gate="approval",
            verdict=Verdict.passed,
            reason=f"promoted by a person: {decision.comment or 'no comment'}",
        )
    return GateResult(
        gate="approval",
        verdict=Verdict.failed,
        reason=f"rolled back by a person: {decision.comment or 'no comment'}",
    )


@task(name="check-blessing", cache_policy=NO_CACHE)
def check_blessing(settings: Settings, release: Release) -> GateResult:
    """Deploy consumes the stored blessing: an unassessed or unblessed version is not deployed."""
    report = load_report(open_store(settings), release.version)
    if report is None or not report.blessed:
        why = (
            "no calibration report stored"
            if report is None
            else "calibration did not bless it: "
            + "; ".join(c.reason for c in report.checks if c.verdict is not Verdict.passed)
        )
        record(settings, release, EventKind.deploy, ActionVerdict.not_deployed, why)
        return GateResult(gate="blessing", verdict=Verdict.failed, reason=f"not deployed: {why}")
    record(
        settings,
        release,
        EventKind.calibration,
        ActionVerdict.blessed,
        "calibration passed",
        baseline=report.baseline_version,
    )
    return GateResult(
        gate="blessing",
        verdict=Verdict.passed,
        reason=f"blessed against {report.baseline_version or 'no baseline (first release)'}",
    )


@task(name="read-fleet-stable", cache_policy=NO_CACHE)
def read_fleet_stable(settings: Settings) -> str | None:
    """The version every worker serves as stable, None if none does (the first release)."""
    with FleetClient.from_settings(settings) as fleet:
        state = fleet.state()
    if not state.ok:
        raise ServingError(f"cannot read the fleet's state: {state.reason}")
    versions = {w.stable_version for w in state.workers}
    if versions == {None}:
        return None
    if len(versions) != 1:
        raise ServingError(f"workers disagree on the stable version: {sorted(map(str, versions))}")
    return versions.pop()


@task(name="deploy-first-release", cache_policy=NO_CACHE)
def deploy_first_release(settings: Settings, release: Release) -> None:
    """No stable anywhere: load the blessed version as stable on every worker and make it champion."""
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.load("stable", release.version)
    record(
        settings,
        release,
        EventKind.deploy,
        Verdict.passed if result.ok else Verdict.error,
        f"first release as stable: {result.reason}",
        **fleet_details(result),
    )
    if not result.ok:
        raise ServingError(f"first release could not be loaded as stable: {result.reason}")
    move_alias.fn(
        settings,
        CHAMPION,
        release.version,
        "retrain_and_release",
        f"first release {release.release_id}",
    )


@task(name="deploy-canary", cache_policy=NO_CACHE)
@traced("deploy canary")
def deploy_canary(settings: Settings, release: Release, baseline: str, weight: int) -> FleetResult:
    """Load and warm the canary and its baseline on every worker, verify, then set the weight.

    If either cannot load anywhere (no room, store error), nothing stays loaded and no traffic
    moved; the error names the worker and why.
    """
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.deploy_canary(release.version, weight, baseline=baseline)
    record(
        settings,
        release,
        EventKind.deploy,
        Verdict.passed if result.ok else Verdict.error,
        result.reason,
        weight=weight,
        baseline=baseline,
        **fleet_details(result),
    )
    if not result.ok:
        raise ServingError(
            f"canary deploy of {release.version} failed in phase {result.phase}: {result.reason}"
        )
    return result


@deploy_canary.on_rollback
def take_canary_out_on_rollback(txn: Transaction) -> None:
    """The transaction failed (a verdict, a refusal, a crash): the canary out, verdict -> weight 0."""
    settings = get_settings()
    release: Release = txn.get("release")
    verdict_at = txn.get("verdict_at", time.time())
    with release_span(release_tracer(settings), release, "take canary out"):
        _, rollback_ms = take_canary_out(
            settings,
            release,
            CanaryRemoval.verdict,
            "the release's transaction rolled back: its canary taken out by the deploy's hook",
            verdict_at=verdict_at,
        )
    txn.set("rollback_ms", rollback_ms)


@task(name="set-canary-weight", cache_policy=NO_CACHE)
@traced("set canary weight")
def set_canary_weight(settings: Settings, release: Release, weight: int) -> FleetResult:
    """Move every worker's canary weight, after checking they all serve the same ready canary."""
    with FleetClient.from_settings(settings) as fleet:
        # leased: it lapses on every worker unless analyse_canary_step renews it
        result = fleet.set_weight(weight, lease_s=settings.serving_canary_lease_s)
    record(
        settings,
        release,
        EventKind.weight,
        Verdict.passed if result.ok else Verdict.error,
        result.reason,
        weight=weight,
        **fleet_details(result),
    )
    if not result.ok:
        raise CanaryRejected(
            GateResult(
                gate="weight",
                verdict=Verdict.error,
                reason=f"could not set weight {weight}: {result.reason}",
            )
        )
    return result


@task(name="read-canary-period", cache_policy=NO_CACHE)
def canary_period(settings: Settings, release: Release) -> tuple[datetime, datetime]:
    """From the canary's deploy to now: the window the impact report analyses."""
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    deploys = [
        e.ts for e in events_of_release(client, release.release_id) if e.kind == EventKind.deploy
    ]
    end = datetime.now(UTC)
    start = deploys[0] if deploys else end
    return (start if start.tzinfo else start.replace(tzinfo=UTC)), end


@task(name="record-decision", cache_policy=NO_CACHE)
def record_decision(settings: Settings, release: Release, gate: GateResult, weight: int) -> None:
    """A person's answer at a pause (the plan's, weight 0, or a step's), kept with the release."""
    record(
        settings,
        release,
        EventKind.decision,
        gate.verdict,
        gate.reason,
        gate=gate.gate,
        weight=weight,
    )


@task(name="promote-canary", cache_policy=NO_CACHE)
@traced("promote canary")
def promote_canary(settings: Settings, release: Release, reason: str) -> FleetResult:
    """Canary becomes stable on every worker; champion moves (with history); an event is emitted."""
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.promote()
    record(
        settings,
        release,
        EventKind.promote,
        Verdict.passed if result.ok else Verdict.error,
        result.reason,
        **fleet_details(result),
    )
    if not result.ok:
        raise CanaryRejected(
            GateResult(
                gate="promote", verdict=Verdict.error, reason=f"promotion failed: {result.reason}"
            )
        )
    move_alias.fn(
        settings,
        CHAMPION,
        release.version,
        "retrain_and_release",
        f"release {release.release_id}: {reason}",
    )
    emit_event(
        event="relay.model.promoted",
        resource={
            "prefect.resource.id": f"relay.model.{release.version}",
            "relay.lineage_id": release.lineage_id,
        },
        payload={"release_id": release.release_id},
    )
    return result

"""Fleet reconciliation: does the serving fleet match what the store and Prefect say it should?

The release flow keeps the fleet right while it runs; when it dies (its process killed, its
host lost) nobody else would look. Argo Rollouts and Flagger reconcile their resources after a
controller restart; Relay's release guard does the same on every run:

- a canary (or baseline) loaded with no live release behind it is taken out (`rollback` on
  those workers: weight 0, both unloaded; stable keeps serving);
- a worker whose stable is not the champion (a restarted worker that loaded nothing, workers that
  disagree) gets the champion loaded as stable;
- what cannot be repaired — a worker that does not answer, workers that disagree with no
  champion to restore — is an `error` naming the worker.

"Live" is Prefect's word: a `retrain-and-release` flow run Pending, Running or Paused. A run whose
process died is marked Crashed by the heartbeat automation (deployments/automations.yaml), and
only then is its canary an orphan here; until then the canary's lease keeps it at weight 0.
While a release is live the guard changes nothing on the fleet: the canary is that release's,
and a stable that differs from the champion may be a promotion between its two writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prefect import Flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, State, StateType

import logstore
from logstore.release_events import ActionVerdict, EventKind, last_release_of
from relay.settings import Settings, get_settings
from relay.types import CanaryRemoval, GateResult, Release, Verdict
from serving.fleet import FleetClient, WorkerResult
from tasks.canary import fleet_details, record
from tasks.canary_removal import take_canary_out

RELEASE_FLOW = "retrain-and-release"
LIVE_STATES = (StateType.PENDING, StateType.RUNNING, StateType.PAUSED)


class Repair(StrEnum):
    """What the guard does to a worker that is off."""

    take_canary_out = "take_canary_out"  # weight 0, canary and baseline unloaded
    restore_stable = "restore_stable"  # the champion loaded as stable


@dataclass(frozen=True)
class WorkerView:
    """What one worker said about itself: reachable or not, and what each slot holds."""

    url: str
    reachable: bool
    error: str = ""  # why it could not be read
    stable: str | None = None
    canary: str | None = None
    baseline: str | None = None
    canary_weight: int = 0

    @classmethod
    def of(cls, answer: WorkerResult) -> WorkerView:
        if not answer.ok:
            return cls(
                answer.url, False, f"{answer.error or answer.status} {answer.detail}".strip()
            )
        return cls(
            answer.url,
            True,
            stable=answer.stable_version,
            canary=answer.canary_version,
            baseline=answer.baseline_version,
            canary_weight=int(answer.state.get("canary_weight", 0)),
        )


@dataclass(frozen=True)
class PlannedRepair:
    action: Repair
    urls: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Reconciliation:
    """The repairs to make, what cannot be repaired (each naming a worker), what was left alone."""

    repairs: tuple[PlannedRepair, ...] = ()
    problems: tuple[str, ...] = ()
    left_alone: tuple[str, ...] = ()
    checked: int = 0
    canary: str | None = None  # the canary version found, if any


def plan_reconciliation(
    workers: Sequence[WorkerView], champion: str | None, live_releases: Sequence[str]
) -> Reconciliation:
    """Decide what to repair on the fleet, given the champion alias and the live release runs."""
    problems = [f"{w.url}: unreachable ({w.error})" for w in workers if not w.reachable]
    seen = [w for w in workers if w.reachable]
    repairs: list[PlannedRepair] = []
    left_alone: list[str] = []

    def repair_unless_live(action: Repair, off: list[WorkerView], found: str, why: str) -> None:
        if live_releases:  # the release owns the fleet while it runs
            left_alone.append(f"{found}: release {', '.join(live_releases)} is live")
        else:
            repairs.append(PlannedRepair(action, tuple(w.url for w in off), found + why))

    with_canary = [w for w in seen if w.canary or w.baseline or w.canary_weight > 0]
    canaries = sorted({w.canary or "(baseline only)" for w in with_canary})
    if with_canary:
        where = ", ".join(f"{w.url} (weight {w.canary_weight})" for w in with_canary)
        found = f"canary {'/'.join(canaries)} on {where}"
        repair_unless_live(Repair.take_canary_out, with_canary, found, " with no live release")

    if champion is None:
        if len({w.stable for w in seen} - {None}) > 1:
            problems.append(
                "workers disagree on stable and there is no champion to restore: "
                + ", ".join(f"{w.url} serves {w.stable or 'nothing'}" for w in seen)
            )
    else:
        off = [w for w in seen if w.stable != champion]
        if off:
            where = ", ".join(f"{w.url} serves {w.stable or 'nothing'}" for w in off)
            found = f"stable is not champion {champion} on {where}"
            repair_unless_live(Repair.restore_stable, off, found, "")
    return Reconciliation(
        tuple(repairs),
        tuple(problems),
        tuple(left_alone),
        checked=len(workers),
        canary=canaries[0] if len(canaries) == 1 else None,
    )


def reconciliation_verdict(plan: Reconciliation, failed_repairs: Sequence[str]) -> GateResult:
    """`error` when anything could not be checked or repaired (naming the worker), else `passed`."""
    done = [r.reason for r in plan.repairs if r.reason not in failed_repairs]
    said = [f"repaired: {why}" for why in done] + [f"left alone: {why}" for why in plan.left_alone]
    measured = {
        "workers": float(plan.checked),
        "repairs": float(len(done)),
        "problems": float(len(plan.problems) + len(failed_repairs)),
    }
    trouble = [*plan.problems, *(f"repair failed: {why}" for why in failed_repairs)]
    if trouble:
        return GateResult(
            gate="fleet",
            verdict=Verdict.error,
            reason="; ".join(trouble + said),
            measurements=measured,
        )
    reason = (
        "; ".join(said) if said else f"all {plan.checked} workers serve the champion, no canary"
    )
    return GateResult(gate="fleet", verdict=Verdict.passed, reason=reason, measurements=measured)


# -- the shell -------------------------------------------------------------------------------------
@task(name="find-live-releases", cache_policy=NO_CACHE)
def find_live_releases() -> list[str]:
    """Names and ids of `retrain-and-release` flow runs Prefect holds Pending, Running or Paused."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[RELEASE_FLOW])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(LIVE_STATES)))
            ),
        )
    return [f"{run.name} ({run.id}, {run.state_name})" for run in runs]


@task(name="reconcile-fleet", cache_policy=NO_CACHE)
def reconcile_fleet(
    settings: Settings, guard: Release, champion: str | None, live_releases: list[str]
) -> GateResult:
    """Read every worker, repair what is safe, record each repair and problem; the fleet verdict.

    A canary taken out is recorded under the release that deployed it (found in release_events),
    so that release's own record says what became of its canary.
    """
    with FleetClient.from_settings(settings) as fleet:
        views = [WorkerView.of(w) for w in fleet.state().workers]
    plan = plan_reconciliation(views, champion, live_releases)
    failed = [r.reason for r in plan.repairs if not _repair(settings, guard, plan, r, champion)]
    for problem in plan.problems:
        record(settings, guard, EventKind.reconcile, Verdict.error, problem)
    gate = reconciliation_verdict(plan, failed)
    create_markdown_artifact(
        key="fleet-reconciliation",
        markdown=_markdown(gate, plan),
        description="What the release guard found on the serving fleet and what it repaired",
    )
    return gate


def take_out_canary_of_dead_release(flow: Flow[Any, Any], flow_run: FlowRun, state: State) -> None:
    """The release flow's on_crashed / on_cancellation hook: its own canary out of every worker.

    Runs only where the dying process lives long enough (SIGTERM, an exception that crashes the
    engine, a cancellation); after a SIGKILL the canary's lease and the guard do the same. A
    canary deployed by another release is not this hook's to take out.
    """
    settings = get_settings()
    with FleetClient.from_settings(settings) as fleet:
        canaries = {v for w in fleet.state().workers if (v := w.canary_version) is not None}
    for canary in sorted(canaries):
        owner = _owner_of(settings, canary)
        if owner is None or owner.release_id != str(flow_run.id):
            continue
        take_canary_out(
            settings,
            owner,
            CanaryRemoval.release_ended,
            f"release run {flow_run.name} ended {state.type.value}"
            f" ({state.message or 'no message'}): its canary {canary} taken out by the "
            f"flow's hook; champion unchanged",
        )


def _repair(
    settings: Settings,
    guard: Release,
    plan: Reconciliation,
    repair: PlannedRepair,
    champion: str | None,
) -> bool:
    """Make one planned repair and record it: an orphan's removal under the release that
    deployed it (its own record says what became of its canary), a stable under the guard."""
    said = f"release guard {guard.release_id}: {repair.action.value}: {repair.reason}"
    if repair.action is Repair.take_canary_out:
        owner = (_owner_of(settings, plan.canary) if plan.canary else None) or guard
        result, _ = take_canary_out(settings, owner, CanaryRemoval.orphaned, said, urls=repair.urls)
        return result.ok
    assert champion is not None  # plan_reconciliation restores stable only to a champion
    with FleetClient.from_settings(settings, repair.urls) as some:
        result = some.load("stable", champion)
    record(
        settings,
        guard,
        EventKind.reconcile,
        ActionVerdict.repaired if result.ok else ActionVerdict.error,
        said + ("" if result.ok else f" (failed: {result.reason})"),
        action=repair.action.value,
        **fleet_details(result),
    )
    return result.ok


def _owner_of(settings: Settings, canary: str) -> Release | None:
    """The release that deployed `canary` to the fleet, from its own `deploy` event."""
    found = last_release_of(
        logstore.connect(settings.resolved_clickhouse_dsn), canary, EventKind.deploy
    )
    return (
        None if found is None else Release(found.release_id, found.model_version, found.lineage_id)
    )


def _markdown(gate: GateResult, plan: Reconciliation) -> str:
    lines: list[str] = [f"# Fleet reconciliation: {gate.verdict.value}", "", gate.reason, ""]
    lines += [f"- repair `{r.action.value}` on {', '.join(r.urls)}" for r in plan.repairs]
    lines += [f"- **cannot repair**: {p}" for p in plan.problems]
    return "\n".join(lines)

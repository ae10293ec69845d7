"""Canary release on the serving fleet: deploy, step the weight, analyse windows, promote or roll back.

Deploy consumes the stored blessing and refuses anything unblessed. The deploy task's
`on_rollback` hook takes the canary out of every worker when the enclosing Prefect transaction
fails (a `failed`/`error` verdict, a refusal at the pause, a crash), and records how long it took
from the verdict to weight 0 everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.input import RunInput
from prefect.transactions import Transaction

import logstore
from logstore.release_events import ReleaseEvent, events_of_release, record_event
from logstore.slo import query_slot_stats
from logstore.spool import connect_for_reading
from model_store import open_store
from relay.errors import GateFailed, ServingError
from relay.settings import Settings, get_settings
from relay.types import GateResult, Verdict
from serving.fleet import FleetClient, FleetResult
from simulation.traffic import LiveTraffic, drive
from tasks.aliases import move_alias
from tasks.calibration import load_report
from tasks.slo import SloThresholds, assess_slo, error_verdict

CHAMPION = "champion"


@dataclass(frozen=True)
class Release:
    """Which release this is: every event it writes carries these."""

    release_id: str
    version: str
    lineage_id: str


class CanaryRejected(GateFailed):
    """The canary must not continue; raising it inside the transaction rolls the deploy back."""

    def __init__(self, gate: GateResult) -> None:
        super().__init__(f"canary rejected ({gate.verdict.value}): {gate.reason}")
        self.gate = gate


class CanaryDecision(RunInput):
    """What the on-call engineer decides when the evidence is inconclusive."""

    decision: Literal["promote", "roll back"] = "roll back"
    comment: str = ""


def record(
    settings: Settings, release: Release, kind: str, verdict: str, reason: str, **details: Any
) -> None:
    """Append one release event to ClickHouse."""
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    record_event(
        client,
        ReleaseEvent(
            release.release_id, release.version, release.lineage_id, kind, verdict, reason, details
        ),
    )


def _fleet_details(result: FleetResult) -> dict[str, Any]:
    return {
        "phase": result.phase,
        "workers": [
            {"url": w.url, "ok": w.ok, "status": w.status, "error": w.error, "detail": w.detail}
            for w in result.workers
        ],
    }


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
        record(settings, release, "deploy", "not_deployed", why)
        return GateResult(gate="blessing", verdict=Verdict.failed, reason=f"not deployed: {why}")
    record(
        settings,
        release,
        "calibration",
        "blessed",
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
        "deploy",
        "passed" if result.ok else "error",
        f"first release as stable: {result.reason}",
        **_fleet_details(result),
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
def deploy_canary(settings: Settings, release: Release, weight: int) -> FleetResult:
    """Load and warm the canary on every worker, verify, then set its first weight."""
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.deploy_canary(release.version, weight)
    record(
        settings,
        release,
        "deploy",
        "passed" if result.ok else "error",
        result.reason,
        weight=weight,
        **_fleet_details(result),
    )
    if not result.ok:
        raise ServingError(
            f"canary deploy of {release.version} failed in phase {result.phase}: {result.reason}"
        )
    return result


@deploy_canary.on_rollback
def take_canary_out(txn: Transaction) -> None:
    """Weight 0 and canary unloaded on every reachable worker; idempotent. Records the latency."""
    settings = get_settings()
    release: Release = txn.get("release")
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.rollback()
    latency_ms = (time.time() - txn.get("verdict_at", time.time())) * 1000
    record(
        settings,
        release,
        "rollback",
        "done" if result.ok else "partial",
        result.reason,
        rollback_ms=latency_ms,
        **_fleet_details(result),
    )
    txn.set("rollback_ms", latency_ms)


@task(name="set-canary-weight", cache_policy=NO_CACHE)
def set_canary_weight(settings: Settings, release: Release, weight: int) -> FleetResult:
    """Move every worker's canary weight, after checking they all serve the same ready canary."""
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.set_weight(weight)
    record(
        settings,
        release,
        "weight",
        "passed" if result.ok else "error",
        result.reason,
        weight=weight,
        **_fleet_details(result),
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


def _window_stats(settings: Settings, start: datetime, end: datetime) -> list:
    client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
    return query_slot_stats(client, start, end)


def unreachable_workers(settings: Settings) -> list[str]:
    """URLs of workers that do not answer their admin API."""
    with FleetClient.from_settings(settings) as fleet:
        return [w.url for w in fleet.state().workers if w.status is None]


@task(name="analyse-canary-step", cache_policy=NO_CACHE)
def analyse_canary_step(
    settings: Settings,
    release: Release,
    weight: int,
    limits: SloThresholds,
    window_s: float,
    max_windows: int,
    traffic: LiveTraffic | None,
) -> GateResult:
    """Run analysis windows at this weight until one is conclusive or `max_windows` pass.

    Each window: (embedded) drive simulated shoppers, ingest the workers' logs, query per-slot
    figures, decide. Query failures count towards `error`; every window is a release event.
    """
    urls = [u.strip() for u in settings.serving_fleet_urls.split(",") if u.strip()]
    rows: list[dict[str, Any]] = []
    consecutive_errors = 0
    gate = GateResult(gate="slo", verdict=Verdict.inconclusive, reason="no window analysed")
    for window in range(1, max_windows + 1):
        start = datetime.now(UTC)
        if traffic is not None:
            report = drive(urls, traffic)
            if not report.sessions.empty:
                from logstore.impact import insert_user_sessions

                insert_user_sessions(
                    logstore.connect(settings.resolved_clickhouse_dsn), report.sessions
                )
        else:
            time.sleep(window_s)
        end = datetime.now(UTC)
        time.sleep(2 * settings.serving_log_flush_ms / 1000)  # let workers write the window's rows
        try:
            stats = _window_stats(settings, start, end)
        except Exception as exc:  # a failed query is evidence of nothing; count it
            consecutive_errors += 1
            gate = error_verdict(consecutive_errors, str(exc), limits) or GateResult(
                gate="slo",
                verdict=Verdict.inconclusive,
                reason=f"log query failed ({consecutive_errors} in a row): {exc}",
            )
        else:
            consecutive_errors = 0
            gate = assess_slo(stats, release.version, limits)
        lost = unreachable_workers(settings)
        if lost:  # a dead worker logs nothing, so its absence must be checked, not inferred
            gate = GateResult(
                gate="fleet",
                verdict=Verdict.error,
                reason=f"worker(s) unreachable mid-canary: {', '.join(lost)}",
                measurements=gate.measurements,
            )
        record(
            settings,
            release,
            "slo_window",
            gate.verdict.value,
            gate.reason,
            weight=weight,
            window=window,
            measurements=gate.measurements,
            thresholds=gate.thresholds,
        )
        rows.append(
            {
                "weight": weight,
                "window": window,
                "verdict": gate.verdict.value,
                "reason": gate.reason,
                **{k: round(v, 3) for k, v in gate.measurements.items()},
            }
        )
        if gate.verdict is not Verdict.inconclusive:
            break
    create_table_artifact(
        key=f"slo-weight-{weight}",
        table=rows,
        description=f"SLO windows of {release.version} at canary weight {weight}%",
    )
    return gate


@task(name="read-canary-period", cache_policy=NO_CACHE)
def canary_period(settings: Settings, release: Release) -> tuple[datetime, datetime]:
    """From the canary's deploy to now: the window the impact report analyses."""
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    deploys = [e.ts for e in events_of_release(client, release.release_id) if e.kind == "deploy"]
    end = datetime.now(UTC)
    start = deploys[0] if deploys else end
    return (start if start.tzinfo else start.replace(tzinfo=UTC)), end


@task(name="promote-canary", cache_policy=NO_CACHE)
def promote_canary(settings: Settings, release: Release) -> FleetResult:
    """Canary becomes stable on every worker; champion moves (with history); an event is emitted."""
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.promote()
    record(
        settings,
        release,
        "promote",
        "passed" if result.ok else "error",
        result.reason,
        **_fleet_details(result),
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
        f"release {release.release_id} passed its canary",
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


@task(name="record-rollback", cache_policy=NO_CACHE)
def record_rollback(settings: Settings, release: Release, gate: GateResult) -> float | None:
    """The release ends rolled back: champion untouched, reason kept, event emitted.

    Returns the rollback latency (verdict -> weight 0 on every worker) the hook recorded.
    """
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rollbacks = [e for e in events_of_release(client, release.release_id) if e.kind == "rollback"]
    rollback_ms = rollbacks[-1].details.get("rollback_ms") if rollbacks else None
    record(
        settings, release, "rolled_back", gate.verdict.value, gate.reason, rollback_ms=rollback_ms
    )
    emit_event(
        event="relay.model.rolled_back",
        resource={
            "prefect.resource.id": f"relay.model.{release.version}",
            "relay.lineage_id": release.lineage_id,
        },
        payload={
            "release_id": release.release_id,
            "verdict": gate.verdict.value,
            "reason": gate.reason,
            "rollback_ms": rollback_ms,
        },
    )
    return rollback_ms


def previous_version(history: list[str | None], current: str | None) -> str | None:
    """The most recent version in an alias's history other than `current`."""
    for version in reversed(history):
        if version is not None and version != current:
            return version
    return None


@task(name="choose-rollback-target", cache_policy=NO_CACHE)
def choose_rollback_target(
    settings: Settings, target_version: str | None, release_id: str
) -> Release | None:
    """The named version, or the champion before the current one; None if there is none.

    Rollback only ever targets a blessed version: a named one without a blessing is refused.
    """
    store = open_store(settings)
    if target_version:
        manifest = store.get_manifest(target_version)  # raises VersionNotFound naming it
        report = load_report(store, target_version)
        if report is None or not report.blessed:
            raise GateFailed(f"refusing to roll back to {target_version}: it was never blessed")
        return Release(release_id, target_version, manifest.lineage_id)
    # Earlier champions were all blessed and all survived a canary; a version that was blessed
    # but then failed its canary never held champion, so it is never a rollback target.
    history = [e.version for e in store.alias_history(CHAMPION)]
    target = previous_version(history, store.get_alias(CHAMPION))
    if target is None:
        return None
    return Release(release_id, target, store.get_manifest(target).lineage_id)


@task(name="roll-back-champion", cache_policy=NO_CACHE)
def roll_back_champion(
    settings: Settings, release: Release, reason: str, actor: str
) -> FleetResult:
    """Serve `release.version` as stable everywhere (canary out), move champion back, emit an event."""
    started = time.perf_counter()
    with FleetClient.from_settings(settings) as fleet:
        fleet.rollback()
        result = fleet.load("stable", release.version)
    elapsed_ms = (time.perf_counter() - started) * 1000
    record(
        settings,
        release,
        "rollback",
        "done" if result.ok else "error",
        reason,
        actor=actor,
        rollback_ms=elapsed_ms,
        **_fleet_details(result),
    )
    if not result.ok:
        raise ServingError(f"could not roll back to {release.version}: {result.reason}")
    move_alias.fn(settings, CHAMPION, release.version, actor, reason)
    emit_event(
        event="relay.model.rolled_back",
        resource={
            "prefect.resource.id": f"relay.model.{release.version}",
            "relay.lineage_id": release.lineage_id,
        },
        payload={"release_id": release.release_id, "reason": reason, "actor": actor},
    )
    return result

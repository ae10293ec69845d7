"""Rolling back: recording a rejected canary, choosing the target, and restoring a champion.

Rollback only ever targets a blessed version that held champion: the canary's own rollback is
the deploy task's `on_rollback` hook (`tasks.canary`); these are what a release records after
it, and what the `rollback` flow and the release guard run.
"""

from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

import logstore
from logstore.release_events import ActionVerdict, EventKind, events_of_release
from model_store import open_store
from model_store.calibration import load_report
from relay.errors import GateFailed, ServingError
from relay.settings import Settings
from relay.types import CanaryRemoval, GateResult, Release
from serving.fleet import FleetClient, FleetResult
from tasks.aliases import move_alias
from tasks.canary import CHAMPION, fleet_details, record
from tasks.canary_removal import take_canary_out


@task(name="record-rollback", cache_policy=NO_CACHE)
def record_rollback(settings: Settings, release: Release, gate: GateResult) -> float | None:
    """The release ends rolled back: champion untouched, reason kept, event emitted.

    Returns the rollback latency (verdict -> weight 0 on every worker) the hook recorded.
    """
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rollbacks = [
        e for e in events_of_release(client, release.release_id) if e.kind == EventKind.rollback
    ]
    rollback_ms = rollbacks[-1].details.get("rollback_ms") if rollbacks else None
    record(
        settings,
        release,
        EventKind.rolled_back,
        gate.verdict,
        gate.reason,
        rollback_ms=rollback_ms,
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
    take_canary_out(
        settings,
        release,
        CanaryRemoval.champion_rollback,
        f"champion rollback to {release.version} by {actor}: any canary out first",
    )
    with FleetClient.from_settings(settings) as fleet:
        result = fleet.load("stable", release.version)
    elapsed_ms = (time.perf_counter() - started) * 1000
    record(
        settings,
        release,
        EventKind.rollback,
        ActionVerdict.done if result.ok else ActionVerdict.error,
        reason,
        actor=actor,
        rollback_ms=elapsed_ms,
        **fleet_details(result),
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

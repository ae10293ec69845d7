"""Taking a canary out of traffic: the one function every path calls, with its reason.

Four paths take a canary out — the deploy's `on_rollback` hook after a failed verdict, the
release flow's crash/cancel hook, the guard's reconciliation of an orphan, a champion rollback —
and all of them call `take_canary_out` here: weight 0, canary and baseline unloaded on every
worker (each told the reason, which it logs and counts in its state), then one release event
under the release that owns the canary. The worker-side counterpart is
`serving.worker.Worker.take_canary_out`, which the lease watchdog calls when a lease runs out.

The release event keeps the kind each path has always written (readers look for them): a
verdict's is `rollback` (with `rollback_ms`, verdict to weight 0 everywhere), a dead release's
`crashed`, an orphan's `reconcile` (action `take_canary_out`), the others `canary_out`; every one
carries `reason`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import logstore
from logstore.release_events import ActionVerdict, EventKind, ReleaseEvent, record_event
from relay.settings import Settings
from relay.types import CanaryRemoval, Release
from serving.fleet import FleetClient, FleetResult

EVENT_KIND = {
    CanaryRemoval.verdict: EventKind.rollback,
    CanaryRemoval.release_ended: EventKind.crashed,
    CanaryRemoval.orphaned: EventKind.reconcile,
    CanaryRemoval.champion_rollback: EventKind.canary_out,
    CanaryRemoval.operator: EventKind.canary_out,
}


def take_canary_out(
    settings: Settings,
    owner: Release,
    reason: CanaryRemoval,
    why: str,
    *,
    urls: Sequence[str] | None = None,
    verdict_at: float | None = None,
    **details: Any,
) -> tuple[FleetResult, float | None]:
    """Take the canary out of every worker (or of `urls`) for `reason`; record it under `owner`.

    Returns the fleet's answer and, given `verdict_at` (epoch seconds, when the decision was
    taken), the milliseconds from then to weight 0 on every worker, measured before anything is
    recorded (the event's `rollback_ms`).
    """
    if reason is CanaryRemoval.lease_expired:
        raise ValueError("a lease runs out on the worker (serving.worker), not through the fleet")
    with FleetClient.from_settings(settings, urls) as fleet:
        result = fleet.take_canary_out(reason)
    rollback_ms = None if verdict_at is None else (time.time() - verdict_at) * 1000
    measured = {} if rollback_ms is None else {"rollback_ms": rollback_ms}
    if reason is CanaryRemoval.orphaned:
        verdict = ActionVerdict.repaired if result.ok else ActionVerdict.error
        details.setdefault("action", "take_canary_out")
    else:
        verdict = ActionVerdict.done if result.ok else ActionVerdict.partial
    said = why if result.ok else f"{why} (failed: {result.reason})"
    event = ReleaseEvent(
        owner.release_id,
        owner.version,
        owner.lineage_id,
        EVENT_KIND[reason],
        verdict,
        said,
        {"reason": reason.value, **measured, **details, **result.details()},
    )
    record_event(logstore.connect(settings.resolved_clickhouse_dsn), event)
    return result, rollback_ms

"""The `release_events` table: every gate measurement, verdict, promotion and rollback.

The one home of what a row can say: `EventKind` names what happened, and its verdict column is
a gate's `Verdict`, a release's `ReleaseOutcome`, an attribution's status or, for an action, an
`ActionVerdict`. Code that reads events matches on these enums, never on string literals.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from clickhouse_connect.driver.client import Client


class EventKind(StrEnum):
    """What a release event records."""

    calibration = "calibration"  # the blessing consumed by deploy
    deploy = "deploy"  # the canary (or a first release) loaded on the fleet, or refused
    weight = "weight"  # the canary's share of users set
    canary_plan = "canary_plan"  # whether the steps can conclude in their windows
    capacity = "capacity"  # the capacity check: candidate against champion under load, weight 0
    slo_window = "slo_window"  # one look of the canary gate
    shadow_window = "shadow_window"  # one look of the shadow stage, before any weight
    decision = "decision"  # a person's answer to a paused release
    promote = "promote"
    rollback = "rollback"  # the canary taken out
    rolled_back = "rolled_back"  # a champion rolled back to an earlier version
    attribution = "attribution"  # why the latency moved
    outcome = "outcome"  # how the release ended (a ReleaseOutcome)
    guard = "guard"
    guard_slo = "guard_slo"
    guard_quality = "guard_quality"
    reconcile = "reconcile"  # the guard brought the fleet back to the store's champion
    crashed = "crashed"  # a dead release's canary taken out
    canary_out = "canary_out"  # a canary taken out for a champion rollback or by an operator
    drift = "drift"
    drift_alert = "drift_alert"


class ActionVerdict(StrEnum):
    """The verdict of an event that records an action rather than a gate."""

    done = "done"
    partial = "partial"  # some workers did not answer
    error = "error"
    repaired = "repaired"
    blessed = "blessed"
    not_deployed = "not_deployed"
    reachable = "reachable"
    unreachable = "unreachable"
    emitted = "emitted"
    suppressed = "suppressed"  # within the cool-down of the last alert


COLUMNS = (
    "ts",
    "release_id",
    "model_version",
    "lineage_id",
    "kind",
    "verdict",
    "reason",
    "details",
)

_BY_RELEASE_SQL = """
SELECT ts, release_id, model_version, lineage_id, kind, verdict, reason, details
FROM release_events WHERE release_id = {release_id:String} ORDER BY ts
"""


@dataclass(frozen=True)
class ReleaseEvent:
    """One thing that happened to a release, with its evidence."""

    release_id: str
    model_version: str
    lineage_id: str
    kind: EventKind
    verdict: str  # a Verdict, ReleaseOutcome, attribution status or ActionVerdict value
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    ts: datetime = field(default_factory=lambda: datetime.now(UTC))


def record_event(client: Client, event: ReleaseEvent) -> None:
    """Append one event."""
    client.insert(
        "release_events",
        [
            [
                event.ts,
                event.release_id,
                event.model_version,
                event.lineage_id,
                event.kind,
                event.verdict,
                event.reason,
                json.dumps(event.details, default=str, sort_keys=True),
            ]
        ],
        column_names=list(COLUMNS),
    )


def events_of_release(client: Client, release_id: str) -> list[ReleaseEvent]:
    """A release's events, oldest first."""
    rows = client.query(_BY_RELEASE_SQL, parameters={"release_id": release_id}).result_rows
    return [_event(row) for row in rows]


_LAST_OF_VERSION_SQL = """
SELECT ts, release_id, model_version, lineage_id, kind, verdict, reason, details
FROM release_events WHERE model_version = {version:String} AND kind = {kind:String}
ORDER BY ts DESC LIMIT 1
"""


def last_release_of(client: Client, version: str, kind: EventKind) -> ReleaseEvent | None:
    """The latest `kind` event of `version` (e.g. the deploy that put it on the fleet), or None."""
    rows = client.query(
        _LAST_OF_VERSION_SQL, parameters={"version": version, "kind": kind}
    ).result_rows
    return _event(rows[0]) if rows else None


def _event(row: Sequence[Any]) -> ReleaseEvent:
    ts, release_id, version, lineage, kind, verdict, reason, details = row
    return ReleaseEvent(
        ts=ts,
        release_id=release_id,
        model_version=version,
        lineage_id=lineage,
        kind=_kind(kind),
        verdict=verdict,
        reason=reason,
        details=json.loads(details),
    )


def _kind(value: str) -> EventKind:
    try:
        return EventKind(value)
    except ValueError:
        known = ", ".join(k.value for k in EventKind)
        raise ValueError(f"release_events row of unknown kind {value!r} (known: {known})") from None

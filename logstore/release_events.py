"""The `release_events` table: every gate measurement, verdict, promotion and rollback."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

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
    kind: str  # "calibration", "deploy", "slo_window", "promote", "rollback", "guard", ...
    verdict: str
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


def last_release_of(client: Client, version: str, kind: str) -> ReleaseEvent | None:
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
        kind=kind,
        verdict=verdict,
        reason=reason,
        details=json.loads(details),
    )

"""Garbage collection's plan and report: which orphaned blobs a gc run may delete, and what it did.

Pure: `ModelStore.gc` lists the blobs, the references and the leases, and acts on the plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from model_store.backend import ObjectInfo


def _digest_of(key: str) -> str:
    return key.rsplit("/", 1)[1]


@dataclass(frozen=True)
class GcPlan:
    """What gc may delete: blobs no manifest references, written and leased before the cutoff."""

    delete: list[ObjectInfo]
    spared_recent: list[ObjectInfo]  # unreferenced, but a writer may be about to publish them
    referenced: int


def plan_gc(
    blobs: Iterable[ObjectInfo],
    referenced: set[str],
    leased_at: dict[str, datetime],
    cutoff: datetime,
) -> GcPlan:
    """Split stored blobs into deletable orphans and orphans too recent to touch."""
    delete, spared, kept = [], [], 0
    for blob in blobs:
        digest = _digest_of(blob.key)
        if digest in referenced:
            kept += 1
        elif blob.modified >= cutoff or leased_at.get(digest, blob.modified) >= cutoff:
            spared.append(blob)
        else:
            delete.append(blob)
    return GcPlan(delete=delete, spared_recent=spared, referenced=kept)


@dataclass(frozen=True)
class GcReport:
    """What a gc run removed (or, with dry_run, would remove) and what it left alone."""

    dry_run: bool
    cutoff: datetime
    deleted: list[str] = field(default_factory=list)  # blob digests
    freed_bytes: int = 0
    spared_recent: list[str] = field(default_factory=list)
    referenced: int = 0
    leases_removed: int = 0
    incomplete_uploads: list[str] = field(default_factory=list)

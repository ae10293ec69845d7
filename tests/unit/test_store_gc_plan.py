"""gc's decision (which orphans go, which are spared) and alias look-ups at a point in time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from model_store.backend import ObjectInfo
from model_store.store import blob_key, plan_gc, version_at
from relay.types import AliasEvent

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
CUTOFF = NOW - timedelta(hours=1)


def blob(digest: str, age: timedelta) -> ObjectInfo:
    return ObjectInfo(key=blob_key(digest), size=100, modified=NOW - age)


def test_unreferenced_old_blob_is_deleted_and_referenced_ones_never_are():
    blobs = [blob("aa" * 32, timedelta(days=30)), blob("bb" * 32, timedelta(days=30))]
    plan = plan_gc(blobs, referenced={"aa" * 32}, leased_at={}, cutoff=CUTOFF)
    assert [b.key for b in plan.delete] == [blob_key("bb" * 32)]
    assert plan.referenced == 1 and plan.spared_recent == []


def test_referenced_blob_is_kept_however_old_and_however_leased():
    old = blob("aa" * 32, timedelta(days=365))
    plan = plan_gc([old], {"aa" * 32}, {"aa" * 32: NOW - timedelta(days=300)}, CUTOFF)
    assert plan.delete == [] and plan.referenced == 1


def test_recent_orphan_is_spared_because_its_writer_may_not_have_published_yet():
    plan = plan_gc([blob("cc" * 32, timedelta(minutes=5))], set(), {}, CUTOFF)
    assert plan.delete == [] and [b.key for b in plan.spared_recent] == [blob_key("cc" * 32)]


def test_old_orphan_with_a_fresh_lease_is_spared_and_with_an_old_lease_is_not():
    old = blob("dd" * 32, timedelta(days=2))
    fresh = plan_gc([old], set(), {"dd" * 32: NOW - timedelta(minutes=1)}, CUTOFF)
    stale = plan_gc([old], set(), {"dd" * 32: NOW - timedelta(hours=3)}, CUTOFF)
    assert fresh.delete == [] and fresh.spared_recent == [old]
    assert stale.delete == [old]


def event(version: str | None, minutes: int) -> AliasEvent:
    return AliasEvent(
        alias="champion",
        version=version,
        previous=None,
        actor="a",
        reason="r",
        at=NOW + timedelta(minutes=minutes),
    )


def test_version_at_answers_who_held_the_alias_then():
    history = [event("v1", 0), event("v2", 10), event(None, 20), event("v3", 30)]
    assert version_at(history, NOW - timedelta(seconds=1)) is None
    assert version_at(history, NOW) == "v1"
    assert version_at(history, NOW + timedelta(minutes=15)) == "v2"
    assert version_at(history, NOW + timedelta(minutes=25)) is None  # cleared
    assert version_at(history, NOW + timedelta(days=1)) == "v3"
    assert version_at([], NOW) is None

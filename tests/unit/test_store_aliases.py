"""The pure parts of moving an alias: names MLflow accepts, the mirror tags, the version filter."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from relay.types import AliasEvent
from tasks.aliases import check_alias_name, mirror_tags, version_filter

LINEAGE = "aaaaaaaaaaaa_bbbbbbbbbbbb_cccccccccccc_dddddddddddd"


@pytest.mark.parametrize("alias", ["champion", "candidate", "shadow-2", "team_a"])
def test_usable_alias_names_pass(alias):
    check_alias_name(alias)


@pytest.mark.parametrize(
    "alias", ["", "v2", "V10", "latest", "LATEST", "has space", "a.b", "x" * 256]
)
def test_names_mlflow_would_refuse_are_refused_before_anything_is_written(alias):
    with pytest.raises(ValueError, match="not usable in MLflow"):
        check_alias_name(alias)


def test_mirror_tags_carry_the_latest_move_who_and_why():
    event = AliasEvent(
        alias="champion",
        version="v2",
        previous="v1",
        actor="release-flow",
        reason="canary passed",
        at=datetime(2026, 11, 8, 9, 30, tzinfo=UTC),
    )
    assert mirror_tags(event) == {
        "relay.alias.champion.version": "v2",
        "relay.alias.champion.previous": "v1",
        "relay.alias.champion.moved_by": "release-flow",
        "relay.alias.champion.reason": "canary passed",
        "relay.alias.champion.moved_at": "2026-11-08T09:30:00+00:00",
    }
    cleared = event.model_copy(update={"version": None, "previous": "v2"})
    assert mirror_tags(cleared)["relay.alias.champion.version"] == ""


def test_version_filter_accepts_only_lineage_ids_so_quotes_cannot_be_injected():
    assert version_filter("relay-ctr", LINEAGE) == (
        f"name='relay-ctr' and tags.lineage_id='{LINEAGE}'"
    )
    with pytest.raises(ValueError):
        version_filter("relay-ctr", "x' or name='other")
    with pytest.raises(ValueError, match="quote"):
        version_filter("relay'ctr", LINEAGE)

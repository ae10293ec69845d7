"""Lineage questions: a version's four parts with their sources, and what changed between two."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.lineage.queries import (
    ATTRIBUTION,
    compare_lineage,
    flatten_sources,
    headline,
    lineage_view,
)
from relay.types import LINEAGE_PARTS, LineageId, VersionManifest

BASE = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)
SOURCES = {
    "model": {"onnx_sha256": "a" * 64},
    "data": {
        "window": "2026-11-01..2026-11-08",
        "rows": 200_000,
        "window_sha256": "1" * 64,
        "feature_pipeline_sha256": "2" * 64,
        "schema_sha256": "3" * 64,
    },
    "env": {"python": "3.11.9", "packages": {"torch": "2.13.0", "onnxruntime": "1.31.1"}},
    "build": {"engines": {"ort-fp32": "4" * 64}, "options": {"ort-fp32": {"opt_level": 99}}},
}


def manifest(
    version: str, lineage: LineageId = BASE, sources: dict | None = None
) -> VersionManifest:
    return VersionManifest(
        version=version,
        created_at=datetime(2026, 11, 8, tzinfo=UTC),
        lineage=lineage,
        lineage_id=str(lineage),
        lineage_sources=SOURCES if sources is None else sources,
    )


def with_source(part: str, field: str, value: object) -> dict:
    changed = {p: dict(s) for p, s in SOURCES.items()}
    changed[part][field] = value
    return changed


def test_view_lists_the_four_parts_in_order_with_full_hashes_and_sources():
    view = lineage_view(manifest("v1"), aliases=["champion", "candidate"])
    assert [p.name for p in view.parts] == list(LINEAGE_PARTS)
    assert [p.digest for p in view.parts] == ["a" * 64, "b" * 64, "c" * 64, "d" * 64]
    assert view.parts[1].sources["window"] == "2026-11-01..2026-11-08"
    assert view.aliases == ["candidate", "champion"]
    assert view.lineage_id == str(BASE)


def test_view_of_a_manifest_without_sources_still_shows_the_parts():
    view = lineage_view(manifest("old", sources={}))
    assert [p.sources for p in view.parts] == [{}, {}, {}, {}]


@pytest.mark.parametrize("part", LINEAGE_PARTS)
def test_diff_names_the_one_changed_dimension_with_the_seed_attribution(part):
    other = manifest("v2", BASE.model_copy(update={part: "e" * 64}))
    comparison = compare_lineage(manifest("v1"), other)
    assert comparison.changed == [part]
    assert comparison.headline == f"only {part} changed: {ATTRIBUTION[part]}"
    assert comparison.explanation == [f"{part} changed -> {ATTRIBUTION[part]}"]


def test_diff_points_at_the_data_window_rather_than_the_pipeline_when_only_it_moved():
    other = manifest(
        "v2",
        BASE.model_copy(update={"data": "f" * 64}),
        with_source("data", "window", "2026-11-08..2026-11-15"),
    )
    comparison = compare_lineage(manifest("v1"), other)
    assert [(c.part, c.field) for c in comparison.source_changes] == [("data", "window")]
    change = comparison.source_changes[0]
    assert (change.base, change.other) == ("2026-11-01..2026-11-08", "2026-11-08..2026-11-15")


def test_diff_reports_nested_package_upgrades_by_dotted_name():
    sources = with_source("env", "packages", {"torch": "2.14.0", "onnxruntime": "1.31.1"})
    other = manifest("v2", BASE.model_copy(update={"env": "9" * 64}), sources)
    comparison = compare_lineage(manifest("v1"), other)
    assert comparison.headline == f"only env changed: {ATTRIBUTION['env']}"
    assert [(c.field, c.base, c.other) for c in comparison.source_changes] == [
        ("packages.torch", "2.13.0", "2.14.0")
    ]


def test_diff_of_several_parts_says_there_is_no_single_cause_and_explains_each():
    other = manifest("v2", BASE.model_copy(update={"model": "0" * 64, "build": "0" * 64}))
    comparison = compare_lineage(manifest("v1"), other)
    assert comparison.changed == ["model", "build"]
    assert comparison.headline.startswith("2 parts changed (model, build)")
    assert len(comparison.explanation) == 2


def test_identical_lineage_says_nothing_changed():
    comparison = compare_lineage(manifest("v1"), manifest("v1-copy"))
    assert comparison.changed == [] and comparison.source_changes == []
    assert comparison.headline == headline([]) and "identical" in comparison.headline


def test_flatten_sources_uses_dotted_names_and_keeps_scalars():
    assert flatten_sources({"a": 1, "b": {"c": {"d": 2}, "e": []}, "f": {}}) == {
        "a": 1,
        "b.c.d": 2,
        "b.e": [],
        "f": {},
    }

"""Questions an engineer asks of lineage: what is this version made of, and what changed?

The pure core reads manifests; `show_lineage` and `diff_versions` fetch them from a store by
version or alias. The attribution texts are written here, once. This module imports only the
store and the domain types: the `relay lineage` commands start without Prefect or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from model_store import ModelStore
from relay.types import LINEAGE_PARTS, LineageId, VersionManifest

# Which change each part points at, when it alone differs between two versions.
ATTRIBUTION = {
    "model": "the model itself (weights, architecture or training settings)",
    "data": "the feature pipeline or the data window",
    "env": "a dependency or driver change",
    "build": "the compiler or engine settings",
}


@dataclass(frozen=True)
class LineageDiff:
    """Which parts changed between two versions, and what each change points at."""

    changed: list[str]

    def explain(self) -> list[str]:
        if not self.changed:
            return ["identical lineage: the same model, data, environment and build"]
        return [f"{part} changed -> {ATTRIBUTION[part]}" for part in self.changed]


def diff_lineage(a: LineageId, b: LineageId) -> LineageDiff:
    """The parts that differ between two lineage ids, in the id's order."""
    return LineageDiff(changed=[p for p in LINEAGE_PARTS if p in a.differing_parts(b)])


class LineagePart(BaseModel):
    """One of the four parts: its full hash and the inputs it was computed from."""

    name: str
    digest: str
    sources: dict[str, Any]


class LineageView(BaseModel):
    """A version's lineage id, its four parts and where each came from."""

    version: str
    lineage_id: str
    created_at: datetime
    mlflow_run_id: str | None
    aliases: list[str]
    parts: list[LineagePart]


class SourceChange(BaseModel):
    """One input that differs between two versions, e.g. data.window or env.packages.torch."""

    part: str
    field: str
    base: Any
    other: Any


class LineageComparison(BaseModel):
    """Which parts changed between two versions, what that points at, and the inputs that moved."""

    base: str
    other: str
    base_lineage_id: str
    other_lineage_id: str
    changed: list[str]
    headline: str
    explanation: list[str]
    source_changes: list[SourceChange]


def lineage_view(manifest: VersionManifest, aliases: list[str] | None = None) -> LineageView:
    """The four parts of a manifest's lineage with their recorded sources, in the id's order."""
    return LineageView(
        version=manifest.version,
        lineage_id=manifest.lineage_id,
        created_at=manifest.created_at,
        mlflow_run_id=manifest.mlflow_run_id,
        aliases=sorted(aliases or []),
        parts=[
            LineagePart(
                name=part,
                digest=getattr(manifest.lineage, part),
                sources=manifest.lineage_sources.get(part, {}),
            )
            for part in LINEAGE_PARTS
        ],
    )


def flatten_sources(sources: Any, prefix: str = "") -> dict[str, Any]:
    """Nested source records as dotted field names, e.g. {'packages.torch': '2.13.0'}."""
    if not isinstance(sources, dict):
        return {prefix: sources} if prefix else {}
    flat: dict[str, Any] = {}
    for key in sorted(sources):
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(sources[key], dict) and sources[key]:
            flat.update(flatten_sources(sources[key], name))
        else:
            flat[name] = sources[key]
    return flat


def headline(changed: list[str]) -> str:
    """One line naming the dimension that changed and what such a change points at."""
    if not changed:
        return "identical lineage: nothing changed between these versions"
    if len(changed) == 1:
        return f"only {changed[0]} changed: {ATTRIBUTION[changed[0]]}"
    return f"{len(changed)} parts changed ({', '.join(changed)}): no single cause; see each below"


def compare_lineage(base: VersionManifest, other: VersionManifest) -> LineageComparison:
    """The changed parts between two manifests with the seed's attribution and the moved inputs."""
    diff = diff_lineage(base.lineage, other.lineage)
    changes = []
    for part in LINEAGE_PARTS:
        before = flatten_sources(base.lineage_sources.get(part, {}))
        after = flatten_sources(other.lineage_sources.get(part, {}))
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) != after.get(name):
                changes.append(
                    SourceChange(
                        part=part, field=name, base=before.get(name), other=after.get(name)
                    )
                )
    return LineageComparison(
        base=base.version,
        other=other.version,
        base_lineage_id=base.lineage_id,
        other_lineage_id=other.lineage_id,
        changed=diff.changed,
        headline=headline(diff.changed),
        explanation=diff.explain(),
        source_changes=changes,
    )


def show_lineage(store: ModelStore, ref: str) -> LineageView:
    """The lineage of a version, named by version or alias, with the aliases now pointing at it."""
    manifest = store.resolve(ref)
    aliases = [
        alias for alias, version in store.current_aliases().items() if version == manifest.version
    ]
    return lineage_view(manifest, aliases)


def diff_versions(store: ModelStore, base_ref: str, other_ref: str) -> LineageComparison:
    """What changed from one version (or alias) to another."""
    return compare_lineage(store.resolve(base_ref), store.resolve(other_ref))

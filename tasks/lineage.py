"""Prefect shell of the lineage id: hash this run's candidate (core.lineage.hashing)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.lineage.hashing import (
    LineageRecord,
    build_hash,
    compute_lineage_record,
    data_hash,
    environment,
    hash_frame,
    schema_fingerprint,
)

# Comparing two ids is a read-only question (the `relay lineage` commands ask it without Prefect
# or torch), so it is answered in core.lineage.queries; re-exported for this module's callers.
from core.lineage.queries import ATTRIBUTION, LineageDiff, diff_lineage
from model_store.hashing import sha256_file
from tasks.compilation import CompiledEngine


@task(name="compute-lineage", cache_policy=NO_CACHE)
def compute_lineage(
    model_path: Path, frame: pd.DataFrame, engines: list[CompiledEngine], window: str
) -> LineageRecord:
    """The four-part lineage id of this run's candidate."""
    return compute_lineage_record(model_path, frame, engines, window)


__all__ = [
    "ATTRIBUTION",
    "LineageDiff",
    "LineageRecord",
    "build_hash",
    "compute_lineage",
    "compute_lineage_record",
    "data_hash",
    "diff_lineage",
    "environment",
    "hash_frame",
    "schema_fingerprint",
    "sha256_file",
]

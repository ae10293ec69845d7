"""Prefect shell of the blessing: score the candidate and the last blessed version on the fixed
calibration set, decide (core.calibration.assessment), file the report beside the version
(model_store.calibration) and show it as an artifact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

import logstore

# The assessment is pure core and the records live beside the store; re-exported for callers.
from core.calibration.assessment import (
    CalibrationThresholds,
    assess_calibration,
    expected_calibration_error,
    holdout_period,
    score_distribution_kl,
    score_metrics,
)
from core.data.validation import DataLimits, TrainingWindow, failure_message, validate_frame
from logstore.events import sample_window
from model_store import ModelStore, open_store
from model_store.calibration import (
    CALIBRATION_SET_KIND,
    CALIBRATION_SET_NAME,
    REPORT_KIND,
    REPORT_NAME,
    CalibrationReport,
    ScoreMetrics,
    current_calibration_set,
    fix_calibration_set,
    load_report,
    save_report,
)
from relay.errors import GateFailed
from relay.features import LABEL, to_model_input
from relay.settings import Settings
from relay.types import BlobRef, VersionManifest
from tasks.aliases import move_alias
from tasks.compilation import run_engine

__all__ = [
    "BLESSED",
    "CALIBRATION_SET_KIND",
    "CALIBRATION_SET_NAME",
    "REPORT_KIND",
    "REPORT_NAME",
    "CalibrationReport",
    "CalibrationThresholds",
    "ScoreMetrics",
    "assess_calibration",
    "assess_candidate_calibration",
    "current_calibration_set",
    "ensure_calibration_set",
    "expected_calibration_error",
    "fix_calibration_set",
    "holdout_period",
    "load_report",
    "save_report",
    "score_distribution_kl",
    "score_metrics",
    "score_version",
]

BLESSED = "blessed"


def sample_calibration_frame(settings: Settings, window: TrainingWindow, rows: int) -> pd.DataFrame:
    """A deterministic sample of labelled events from the window's holdout period."""
    period = holdout_period(window)
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    return sample_window(client, period.start, period.end, rows)


def score_version(
    store: ModelStore, manifest: VersionManifest, x: np.ndarray, workdir: Path
) -> np.ndarray:
    """Scores of a version's fp32 engine (downloaded and hash-checked) on x."""
    engine = next(e for e in manifest.engines if e.name == "ort-fp32")
    path = store.fetch_blob(engine.blob, workdir / f"{manifest.version}-{engine.name}.onnx")
    return run_engine(path, x)


def _validated(frame: pd.DataFrame, window: TrainingWindow) -> pd.DataFrame:
    report = validate_frame(frame, DataLimits(min_rows=min(len(frame), 1_000) or 1))
    if not report.success:
        message = failure_message(report, window)
        raise GateFailed(message.replace("training window", "calibration set from window"))
    return frame


@task(name="ensure-calibration-set", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def ensure_calibration_set(
    settings: Settings, workdir: Path, window: TrainingWindow, rows: int = 20_000
) -> tuple[BlobRef, pd.DataFrame]:
    """The fixed calibration set: sampled once from events, then reused by hash every release.

    Great Expectations validates the set on creation and on every use.
    """
    store = open_store(settings)
    ref = current_calibration_set(store)
    if ref is None:
        path = workdir / "calibration.parquet"
        frame = _validated(sample_calibration_frame(settings, window, rows), window)
        frame.to_parquet(path, index=False)
        ref = fix_calibration_set(store, store.put_blob(path))
    path = store.fetch_blob(ref, workdir / f"calibration-{ref.sha256[:12]}.parquet")
    return ref, _validated(pd.read_parquet(path), window)


@task(name="assess-calibration", cache_policy=NO_CACHE)
def assess_candidate_calibration(
    settings: Settings,
    version: str,
    calibration: tuple[BlobRef, pd.DataFrame],
    limits: CalibrationThresholds,
    workdir: Path,
) -> CalibrationReport:
    """Score candidate and last blessed version, decide the blessing, store it, show it."""
    store = open_store(settings)
    existing = load_report(store, version)
    if existing is not None:
        return existing
    ref, frame = calibration
    x, labels = to_model_input(frame), frame[LABEL].to_numpy().astype(np.int64)
    manifest = store.get_manifest(version)
    baseline_version = store.get_alias(BLESSED)
    if baseline_version == version:
        baseline_version = None
    candidate_scores = score_version(store, manifest, x, workdir)
    baseline_scores = (
        score_version(store, store.get_manifest(baseline_version), x, workdir)
        if baseline_version
        else None
    )
    report = save_report(
        store,
        assess_calibration(
            version, labels, candidate_scores, baseline_version, baseline_scores, ref, limits
        ),
    )
    if report.blessed:
        # through the one path that moves an alias: the store's history, then the MLflow mirror
        move_alias.fn(settings, BLESSED, version, "retrain_and_release", "passed calibration")
    create_table_artifact(
        key="calibration",
        table=[
            {
                "check": c.gate,
                "verdict": c.verdict.value,
                "value": next(iter(c.measurements.values())),
                "limit": next(iter(c.thresholds.values())),
                "reason": c.reason,
            }
            for c in report.checks
        ],
        description=f"Calibration of {version} vs {report.baseline_version or 'no baseline'}: "
        + ("BLESSED" if report.blessed else "NOT blessed")
        + ("; " + "; ".join(report.notes) if report.notes else ""),
    )
    return report

"""The blessing: does the candidate predict like a model we can ship, on a fixed calibration set?

Absolute floors always apply. Relative checks compare against the last *blessed* version (the
`blessed` alias, not merely what is serving); on the first release there is none, and the report
says the relative checks were skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import Field

import logstore
from logstore.events import sample_window
from model_store import ModelStore, open_store
from model_store.attachments import AttachmentExists
from relay.errors import GateFailed
from relay.features import LABEL, to_model_input
from relay.settings import Settings
from relay.types import BlobRef, GateResult, Stored, Verdict, VersionManifest
from tasks.compilation import run_engine
from tasks.data import DataLimits, TrainingWindow, failure_message, validate_frame
from tasks.training import auc, logloss

BLESSED = "blessed"
# Attachments (model_store.attachments): the report beside each version it assesses, and the
# one calibration set beside the store that every release is assessed on.
REPORT_KIND, REPORT_NAME = "calibration", "report"
CALIBRATION_SET_KIND, CALIBRATION_SET_NAME = "calibration-set", "current"


@dataclass(frozen=True)
class CalibrationThresholds:
    """Limits of the blessing (their defaults' one home). Relative limits compare with the last blessed version."""

    max_kl: float = 0.05
    max_auc_drop: float = 0.02
    max_logloss_increase: float = 0.01
    min_auc: float = 0.60
    max_logloss: float = 0.35
    max_ece: float = 0.02
    min_score_std: float = 1e-3  # below this the model predicts one number for everyone


class ScoreMetrics(Stored):
    auc: float
    logloss: float
    ece: float
    mean_score: float
    score_std: float
    finite: bool


class CalibrationReport(Stored):
    """The blessing record stored next to a version; deploy consumes it."""

    version: str
    baseline_version: str | None
    calibration_set: BlobRef
    candidate: ScoreMetrics
    baseline: ScoreMetrics | None
    kl_divergence: float | None
    checks: list[GateResult]
    blessed: bool
    notes: list[str] = Field(default_factory=list)
    assessed_at: datetime


def expected_calibration_error(labels: np.ndarray, scores: np.ndarray, bins: int = 15) -> float:
    """ECE over equal-count bins (CTRs cluster near zero, so equal-width bins would be empty)."""
    order = np.argsort(scores, kind="stable")
    total = 0.0
    for chunk in np.array_split(order, bins):
        if len(chunk):
            total += len(chunk) * abs(float(scores[chunk].mean()) - float(labels[chunk].mean()))
    return total / len(scores)


def score_distribution_kl(
    candidate: np.ndarray, baseline: np.ndarray, bins: int = 20, alpha: float = 1.0
) -> float:
    """KL(candidate || baseline) of predicted CTRs over the baseline's quantile bins.

    Bins on the baseline's quantiles so each holds mass; add-alpha smoothing keeps empty bins finite.
    """
    edges = np.unique(np.quantile(baseline, np.linspace(0, 1, bins + 1)[1:-1]))
    p = np.bincount(np.searchsorted(edges, candidate), minlength=len(edges) + 1) + alpha
    q = np.bincount(np.searchsorted(edges, baseline), minlength=len(edges) + 1) + alpha
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(p * np.log(p / q)))


def score_metrics(labels: np.ndarray, scores: np.ndarray) -> ScoreMetrics:
    finite = bool(np.isfinite(scores).all())
    if not finite:
        return ScoreMetrics(
            auc=float("nan"),
            logloss=float("inf"),
            ece=float("inf"),
            mean_score=float("nan"),
            score_std=0.0,
            finite=False,
        )
    return ScoreMetrics(
        auc=auc(labels, scores),
        logloss=logloss(labels, scores),
        ece=expected_calibration_error(labels, scores),
        mean_score=float(scores.mean()),
        score_std=float(scores.std()),
        finite=True,
    )


def _check(name: str, ok: bool, value: float, limit: float, text: str) -> GateResult:
    return GateResult(
        gate=name,
        verdict=Verdict.passed if ok else Verdict.failed,
        reason=text,
        measurements={name: value},
        thresholds={name: limit},
    )


def assess_calibration(
    version: str,
    labels: np.ndarray,
    candidate_scores: np.ndarray,
    baseline_version: str | None,
    baseline_scores: np.ndarray | None,
    calibration_set: BlobRef,
    limits: CalibrationThresholds,
) -> CalibrationReport:
    """Bless or refuse a candidate: absolute floors, then checks relative to the baseline."""
    cand = score_metrics(labels, candidate_scores)
    checks = [
        _check(
            "finite_scores",
            cand.finite,
            float(cand.finite),
            1.0,
            "every score is a finite probability",
        ),
        _check(
            "score_std",
            cand.score_std >= limits.min_score_std,
            cand.score_std,
            limits.min_score_std,
            "scores are not degenerate",
        ),
        _check("auc", cand.auc >= limits.min_auc, cand.auc, limits.min_auc, "AUC above the floor"),
        _check(
            "logloss",
            cand.logloss <= limits.max_logloss,
            cand.logloss,
            limits.max_logloss,
            "logloss below the ceiling",
        ),
        _check(
            "ece",
            cand.ece <= limits.max_ece,
            cand.ece,
            limits.max_ece,
            "expected calibration error below the ceiling",
        ),
    ]
    notes: list[str] = []
    base: ScoreMetrics | None = None
    kl: float | None = None
    if baseline_version is None or baseline_scores is None:
        notes.append(
            "first release: no blessed baseline, relative checks (KL, AUC drop, logloss) skipped"
        )
    elif not cand.finite:
        notes.append("candidate scores are not finite: relative checks not computed")
    else:
        base = score_metrics(labels, baseline_scores)
        kl = score_distribution_kl(candidate_scores, baseline_scores)
        drop = base.auc - cand.auc
        rise = cand.logloss - base.logloss
        checks += [
            _check(
                "kl_divergence",
                kl <= limits.max_kl,
                kl,
                limits.max_kl,
                f"predicted-CTR distribution close to {baseline_version}",
            ),
            _check(
                "auc_drop",
                drop <= limits.max_auc_drop,
                drop,
                limits.max_auc_drop,
                f"AUC no worse than {baseline_version} by more than the limit",
            ),
            _check(
                "logloss_increase",
                rise <= limits.max_logloss_increase,
                rise,
                limits.max_logloss_increase,
                f"logloss no worse than {baseline_version} by more than the limit",
            ),
        ]
    return CalibrationReport(
        version=version,
        baseline_version=baseline_version,
        calibration_set=calibration_set,
        candidate=cand,
        baseline=base,
        kl_divergence=kl,
        checks=checks,
        blessed=all(c.verdict is Verdict.passed for c in checks),
        notes=notes,
        assessed_at=datetime.now(UTC),
    )


def load_report(store: ModelStore, version: str) -> CalibrationReport | None:
    """The stored blessing record of a version, if it was assessed."""
    raw = store.get_attachment(version, REPORT_KIND, REPORT_NAME)
    return None if raw is None else CalibrationReport.model_validate_json(raw)


def save_report(store: ModelStore, report: CalibrationReport) -> CalibrationReport:
    """Store the report next to the version, once: a version is assessed against one baseline.

    If another run stored one first, that one stands and is returned.
    """
    data = report.model_dump_json(indent=2).encode()
    blobs = {"calibration-set": report.calibration_set}
    try:
        store.put_attachment(report.version, REPORT_KIND, REPORT_NAME, data, blobs=blobs)
    except AttachmentExists as exc:
        return CalibrationReport.model_validate_json(store.read_attachment(exc.existing))
    return report


def current_calibration_set(store: ModelStore) -> BlobRef | None:
    """The calibration set every release is assessed on, if a release has fixed one."""
    raw = store.get_attachment(None, CALIBRATION_SET_KIND, CALIBRATION_SET_NAME)
    return None if raw is None else BlobRef.model_validate_json(raw)


def fix_calibration_set(store: ModelStore, ref: BlobRef) -> BlobRef:
    """Make `ref` the calibration set unless one is fixed already; the set that stands."""
    try:
        store.put_attachment(
            None,
            CALIBRATION_SET_KIND,
            CALIBRATION_SET_NAME,
            ref.model_dump_json().encode(),
            blobs={"calibration-set": ref},
        )
    except AttachmentExists as exc:  # a concurrent first release fixed it first
        return BlobRef.model_validate_json(store.read_attachment(exc.existing))
    return ref


def holdout_period(window: TrainingWindow, fraction: float = 0.1) -> TrainingWindow:
    """The latest `fraction` of a window: the part the first model did not train on."""
    return TrainingWindow(start=window.end - (window.end - window.start) * fraction, end=window.end)


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
        store.set_alias(BLESSED, version, actor="retrain_and_release", reason="passed calibration")
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

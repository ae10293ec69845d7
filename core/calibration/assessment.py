"""The blessing: does the candidate predict like a model we can ship, on a fixed calibration set?

Absolute floors always apply. Relative checks compare against the last *blessed* version (the
`blessed` alias, not merely what is serving); on the first release there is none, and the report
says the relative checks were skipped. Pure: scores in, a `CalibrationReport` out. Its record
and the calibration set are kept beside the store (`model_store.calibration`); the Prefect shell
that scores versions and files the report is `tasks.calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
from pydantic import Field

from core.data.validation import TrainingWindow
from core.training.model import auc, logloss
from model_store.calibration import CalibrationReport, ScoreMetrics
from relay.types import BlobRef, GateResult, Verdict


@dataclass(frozen=True)
class CalibrationThresholds:
    """Limits of the blessing (their defaults' one home). Relative limits compare with the last blessed version."""

    max_kl: Annotated[float, Field(gt=0)] = 0.05
    max_auc_drop: Annotated[float, Field(ge=0, le=1)] = 0.02
    max_logloss_increase: Annotated[float, Field(ge=0)] = 0.01
    min_auc: Annotated[float, Field(ge=0, le=1)] = 0.60
    max_logloss: Annotated[float, Field(gt=0)] = 0.35
    max_ece: Annotated[float, Field(gt=0, le=1)] = 0.02
    # below this the model predicts one number for everyone
    min_score_std: Annotated[float, Field(ge=0)] = 1e-3


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


def absolute_checks(cand: ScoreMetrics, limits: CalibrationThresholds) -> list[GateResult]:
    """The floors every candidate meets, baseline or not."""
    return [
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


def relative_checks(
    cand: ScoreMetrics,
    base: ScoreMetrics,
    kl: float,
    baseline_version: str,
    limits: CalibrationThresholds,
) -> list[GateResult]:
    """The checks against the last blessed version: score distribution, AUC drop, logloss rise."""
    drop = base.auc - cand.auc
    rise = cand.logloss - base.logloss
    return [
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
    checks = absolute_checks(cand, limits)
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
        checks += relative_checks(cand, base, kl, baseline_version, limits)
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


def holdout_period(window: TrainingWindow, fraction: float = 0.1) -> TrainingWindow:
    """The latest `fraction` of a window: the part the first model did not train on."""
    return TrainingWindow(start=window.end - (window.end - window.start) * fraction, end=window.end)

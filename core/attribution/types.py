"""What an attribution says: its status, its settings, each cause's contribution with an interval."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from core.attribution.graph import CAUSES

METHOD = (
    "distribution-change attribution (Budhathoki et al. 2021): exact Shapley contributions of "
    "each node's mechanism to the change in mean latency, over a linear SCM of the request "
    "(load/rows/input bytes/batch size -> preprocess/compute -> queue -> latency); "
    "normal-approximation bootstrap intervals over resampled rows"
)


class AttributionStatus(StrEnum):
    attributed = "attributed"  # one or more causes named, each with an established share
    cannot_separate = "cannot_separate"  # a real change, but no cause's share is established
    no_change = "no_change"  # the latency change's own interval includes 0
    too_few_rows = "too_few_rows"
    failed = "failed"  # the analysis raised; the verdict it explains stands


@dataclass(frozen=True)
class AttributionConfig:
    """How much data and time one attribution may use. The one home of these defaults."""

    max_rows: int = 5_000  # per population, sampled uniformly from the window
    min_rows: int = 200  # per population, below which nothing is attributed
    min_change_ms: float = 0.5  # a smaller change in mean latency is no change to explain
    resamples: int = 200  # bootstrap resamples, always all of them ...
    min_resamples: int = 200  # ... and never fewer: below this no interval is stated
    budget_s: float = 8.0  # for the bootstrap; rows are subsampled to fit it
    confidence: float = 0.9
    min_share: float = 0.25  # a cause is named when its share's lower bound reaches this
    seed: int = 0


@dataclass(frozen=True)
class Contribution:
    """One cause's part of the latency change: milliseconds, and its share with an interval."""

    cause: str  # a key of CAUSES
    ms: float
    share: float  # of the total change (the contributions sum to it)
    share_low: float = math.nan
    share_high: float = math.nan
    ms_low: float = math.nan
    ms_high: float = math.nan

    @property
    def name(self) -> str:
        return CAUSES[self.cause]


@dataclass(frozen=True)
class LatencyAttribution:
    """The change in latency between two populations, split into its causes, with its evidence."""

    status: AttributionStatus
    statement: str
    change_ms: float = math.nan  # mean latency, after minus before
    change_low_ms: float = math.nan
    change_high_ms: float = math.nan
    p95_change_ms: float = math.nan
    contributions: tuple[Contribution, ...] = ()  # largest first
    named: tuple[str, ...] = ()  # the causes the data names (attributed)
    candidates: tuple[str, ...] = ()  # what it cannot separate (cannot_separate)
    rows_before: int = 0
    rows_after: int = 0
    population_before: int = 0
    population_after: int = 0
    resamples: int = 0
    resample_rows: int = 0  # rows per population in each resample (m of the m-out-of-n)
    seconds: float = 0.0
    method: str = METHOD
    config: AttributionConfig = field(default_factory=AttributionConfig)

    @property
    def top_causes(self) -> tuple[str, ...]:
        """The named causes, largest first; empty unless attributed."""
        return self.named if self.status is AttributionStatus.attributed else ()

    @property
    def top_cause(self) -> str | None:
        """The largest named cause, None when none is named."""
        return self.top_causes[0] if self.top_causes else None

    def measurements(self) -> dict[str, float]:
        """Flat figures for a verdict's measurements: the change and each cause's share."""
        out = {
            "attribution_change_ms": self.change_ms,
            "attribution_p95_change_ms": self.p95_change_ms,
            "attribution_resamples": float(self.resamples),
            "attribution_seconds": self.seconds,
        }
        for c in self.contributions:
            out[f"attribution_{c.cause}_share"] = c.share
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for release events and artifacts."""
        return {
            "status": self.status.value,
            "statement": self.statement,
            "top_cause": self.top_cause,
            "top_causes": list(self.top_causes),
            "candidates": list(self.candidates),
            "change_ms": _finite(self.change_ms),
            "change_interval_ms": [_finite(self.change_low_ms), _finite(self.change_high_ms)],
            "p95_change_ms": _finite(self.p95_change_ms),
            "contributions": [
                {
                    "cause": c.cause,
                    "name": c.name,
                    "ms": round(c.ms, 3),
                    "ms_interval": [_finite(c.ms_low), _finite(c.ms_high)],
                    "share": round(c.share, 4),
                    "share_interval": [_finite(c.share_low), _finite(c.share_high)],
                }
                for c in self.contributions
            ],
            "rows": [self.rows_before, self.rows_after],
            "population": [self.population_before, self.population_after],
            "resamples": self.resamples,
            "resample_rows": self.resample_rows,
            "confidence": self.config.confidence,
            "seconds": round(self.seconds, 3),
            "method": self.method,
        }


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


@dataclass(frozen=True)
class Bootstrap:
    """Resampled estimates: each cause's ms and share, and the change, one entry per resample."""

    ms: dict[str, np.ndarray]
    shares: dict[str, np.ndarray]
    changes: np.ndarray
    rows: int  # per population, per resample
    scale: float  # sqrt(m / n): turns the m-row spread into the full sample's


DEFAULT_CONFIG = AttributionConfig()

"""The impact report's data types: window, options, estimates, the report and its stored record.

Shared by the analyses (core/impact/estimation.py, core/impact/analysis.py), the renderings
(core/impact/report.py), storage (core/impact/storage.py) and the task shells (tasks/impact.py),
so none of those needs another to name what it takes or returns.

Effects are in GMV per session per millisecond of the session's mean request latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from logstore.impact import JoinCoverage

# The stored record and the two types in it live beside the store (model_store.impact_records);
# re-exported here so the analyses, renderings and shells import their types from one place.
from model_store.impact_records import ImpactFinding as ImpactFinding
from model_store.impact_records import ImpactWindow as ImpactWindow
from model_store.impact_records import StoredImpactReport as StoredImpactReport
from relay.types import Stored

# The per-session columns the analyses read (logstore.impact.SESSION_OUTCOME_COLUMNS).
TREATMENT = "latency_mean_ms"
OUTCOME = "gmv"
MEDIATOR = "session_length_s"
COVARIATES = ("device_type", "user_age")
CANARY = "canary"
STABLE = "stable"


class ImpactOptions(BaseModel, frozen=True):
    """Run knobs of the analysis, suited to a day of traffic. The one home of their defaults."""

    min_sessions: int = Field(default=500, ge=10)
    min_sessions_per_slot: int = Field(default=100, ge=2)
    refutation_simulations: int = Field(default=10, ge=2, le=200)
    max_refutation_sessions: int = Field(default=50_000, ge=100)
    latency_bins: int = Field(default=10, ge=2, le=50)
    subset_fraction: float = Field(default=0.8, gt=0.1, lt=1.0)
    max_session: timedelta = timedelta(hours=1)
    seed: int = 0


class Correlation(Stored):
    """Pearson's r between two per-session columns, with p-value (H0: r = 0) and 95 % CI."""

    x: str
    y: str
    r: float
    p_value: float
    ci_low: float
    ci_high: float
    n: int


class EffectEstimate(Stored):
    """An effect of +1 ms mean latency on an outcome, per session, with its 95 % interval."""

    key: str
    label: str
    outcome: str
    unit: str
    value: float
    ci_low: float
    ci_high: float
    std_error: float
    p_value: float | None
    n: int
    interval_method: str

    def covers(self, value: float) -> bool:
        return self.ci_low <= value <= self.ci_high

    def excludes_zero(self) -> bool:
        return not self.covers(0.0)


class Refutation(Stored):
    """One DoWhy refutation: the re-estimate, what a sound analysis would give, pass or fail."""

    key: str
    label: str
    expected: float
    new_effect: float
    tolerance: float
    passed: bool
    dowhy_p_value: float | None
    simulations: int
    sessions: int
    criterion: str


class BusinessTranslation(Stored):
    """The causal effect at the observed traffic: GMV per day per ms of mean latency."""

    sessions_per_day: float
    gmv_per_day: float
    gmv_per_day_per_ms: float
    ci_low: float
    ci_high: float

    @property
    def gmv_per_day_per_100ms(self) -> float:
        return 100 * self.gmv_per_day_per_ms


class SlotComparison(Stored):
    """Canary versus stable: the latency difference and the GMV it implies, per release."""

    available: bool
    reason: str
    stable_version: str | None = None
    canary_version: str | None = None
    stable_sessions: int = 0
    canary_sessions: int = 0
    stable_latency_ms: float | None = None
    canary_latency_ms: float | None = None
    latency_diff_ms: float | None = None
    latency_diff_ci: tuple[float, float] | None = None
    implied_gmv_per_session: float | None = None
    implied_gmv_per_session_ci: tuple[float, float] | None = None
    implied_gmv_per_day: float | None = None
    implied_gmv_per_day_ci: tuple[float, float] | None = None
    measured_gmv_diff: float | None = None
    measured_gmv_diff_ci: tuple[float, float] | None = None


class LatencyBin(Stored):
    """Mean of an outcome among sessions whose mean latency falls in [low_ms, high_ms]."""

    low_ms: float
    high_ms: float
    mid_ms: float
    sessions: int
    mean: float
    ci_low: float
    ci_high: float


class ImpactReport(Stored):
    """Everything the report shows; the HTML, JSON and markdown are renderings of this."""

    window: ImpactWindow
    versions: list[str]
    generated_at: datetime
    finding: ImpactFinding
    headline: str
    caveats: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    assumptions: dict[str, list[str]] = Field(default_factory=dict)
    coverage: dict[str, int] = Field(default_factory=dict)
    sessions: int = 0
    covariates: list[str] = Field(default_factory=list)
    correlations: list[Correlation] = Field(default_factory=list)
    estimates: list[EffectEstimate] = Field(default_factory=list)
    session_length_estimate: EffectEstimate | None = None
    refutations: list[Refutation] = Field(default_factory=list)
    identification: str = ""
    graph_edges: list[tuple[str, str]] = Field(default_factory=list)
    translation: BusinessTranslation | None = None
    slots: SlotComparison | None = None
    latency_profile: list[dict[str, Any]] = Field(default_factory=list)
    latency_histogram: list[dict[str, Any]] = Field(default_factory=list)
    histogram_bin_ms: float = 0.0
    gmv_by_latency: list[LatencyBin] = Field(default_factory=list)
    length_by_latency: list[LatencyBin] = Field(default_factory=list)

    def estimate(self, key: str) -> EffectEstimate | None:
        return next((e for e in self.estimates if e.key == key), None)

    @property
    def causal(self) -> EffectEstimate | None:
        """The headline causal estimate: DoWhy back-door with a cluster-robust interval."""
        return self.estimate("dowhy_backdoor")


@dataclass(frozen=True)
class ImpactData:
    """What ClickHouse returned for a window: per-session rows and small summaries."""

    window: ImpactWindow
    versions: list[str]
    sessions: pd.DataFrame
    coverage: JoinCoverage
    latency_profile: pd.DataFrame
    latency_histogram: pd.DataFrame
    histogram_bin_ms: float

"""The release experiment's data types: per-cohort moments in, per-metric effects and a finding out.

Canary and baseline users are hashed sticky into cohorts of equal share, so comparing them is a
randomized experiment. ClickHouse reduces each cohort's per-user sums to their first and second
moments (logstore/experiment.py: `CohortMoments`, `ExperimentData`); the estimator
(core/impact/experiment.py) works from those alone, so nothing per user leaves the database.
This module imports neither ClickHouse nor pandas: the CLI reads stored experiments with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from relay.types import Stored

# The cohorts' slot names, as serving/routing.py names them (logstore.experiment reads them).
CANARY = "canary"
BASELINE = "baseline"
COHORTS = (CANARY, BASELINE)


@dataclass(frozen=True)
class MetricSpec:
    """A metric as a ratio of two per-user sums; its CUPED covariate is the same ratio, pre-canary."""

    key: str
    label: str
    unit: str
    numerator: str
    denominator: str
    business: bool  # part of the headline "what did this release do to the business"

    @property
    def pre_numerator(self) -> str:
        return f"pre_{self.numerator}"

    @property
    def pre_denominator(self) -> str:
        return "one" if self.denominator == "one" else f"pre_{self.denominator}"


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "click_through", "click-through", "clicked / impression", "clicked", "impressions", True
    ),
    MetricSpec("orders_per_user", "orders per user", "orders / user", "orders", "one", True),
    MetricSpec("gmv_per_user", "GMV per user", "GMV / user", "gmv", "one", True),
    MetricSpec("latency_ms", "latency", "ms / request", "latency_sum", "requests", False),
)


class ExperimentFinding(StrEnum):
    """What the experiment concludes about the release, strongest claim last."""

    no_experiment = "no_experiment"
    not_valid = "not_valid"
    no_detectable_effect = "no_detectable_effect"
    effect_detected = "effect_detected"


class ExperimentOptions(Stored):
    """Knobs of the estimate. The one home of their defaults."""

    model_config = ConfigDict(frozen=True)  # merged with Stored's

    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    power: float = Field(default=0.8, gt=0.5, lt=1.0)
    srm_alpha: float = Field(default=0.001, gt=0.0, lt=0.5)
    min_users_per_cohort: int = Field(default=20, ge=2)
    canary_share: float = Field(default=0.5, gt=0.0, lt=1.0)  # canary / (canary + baseline)
    # The covariate period before the canary's deploy: a day covers the daily cycle.
    pre_period_h: float = Field(default=24.0, gt=0.0, le=24 * 28)
    # CUPED's covariates: every metric's pre-canary value ("all"), or the metric's own ("own").
    covariates: Literal["all", "own"] = "all"


class MetricEffect(Stored):
    """Canary minus baseline on one metric, CUPED-adjusted, clustered by user."""

    key: str
    label: str
    unit: str
    measured: bool
    reason: str = ""
    canary_mean: float | None = None
    baseline_mean: float | None = None
    effect: float | None = None  # absolute, canary − baseline, CUPED-adjusted
    ci_low: float | None = None
    ci_high: float | None = None
    relative: float | None = None  # effect / baseline
    relative_ci_low: float | None = None
    relative_ci_high: float | None = None
    p_value: float | None = None
    mde: float | None = None  # absolute minimum detectable effect at this sample size
    relative_mde: float | None = None
    raw_effect: float | None = None  # without CUPED
    raw_std_error: float | None = None
    std_error: float | None = None
    theta: list[float] = Field(default_factory=list)  # per covariate, own metric's first
    variance_reduction: float | None = None  # 1 − Var(CUPED) / Var(raw)
    detected: bool = False  # significant after Holm's correction across the business metrics

    def covers_relative(self, value: float) -> bool:
        low, high = self.relative_ci_low, self.relative_ci_high
        return low is not None and high is not None and low <= value <= high


class SampleRatio(Stored):
    """The users-per-cohort check against the configured split (chi-square, 1 df)."""

    canary_users: int
    baseline_users: int
    expected_canary_share: float
    chi2: float
    p_value: float
    passed: bool
    source: str  # "estimator" or "release events"
    reason: str


class ReleaseExperiment(Stored):
    """The stored experiment of one release: what the history page and the report show."""

    release_id: str
    version: str
    lineage_id: str
    baseline_version: str | None
    outcome: str
    generated_at: datetime
    start: datetime | None = None
    end: datetime | None = None
    pre_start: datetime | None = None
    finding: ExperimentFinding
    headline: str
    statements: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    canary_users: int = 0
    baseline_users: int = 0
    crossed_users: int = 0
    sample_ratio: SampleRatio | None = None
    metrics: list[MetricEffect] = Field(default_factory=list)
    method: str = ""
    options: ExperimentOptions = Field(default_factory=ExperimentOptions)

    @property
    def canary_seconds(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return (self.end - self.start).total_seconds()

    def metric(self, key: str) -> MetricEffect | None:
        return next((m for m in self.metrics if m.key == key), None)

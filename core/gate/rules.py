"""The canary gate's rules: when a step passes, fails, needs a person or is `invalid`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

MIN_USERS = 20  # fewer users than this and the per-user variance estimate is itself noise


@dataclass(frozen=True)
class CanaryRules:
    """When a canary step passes, fails or needs a person. The one home of these defaults."""

    # The Field bounds are __post_init__'s checks as the run form and the API state them, so a
    # bad value is refused before a flow run exists; __post_init__ still guards direct use.

    max_p95_ms: Annotated[float, Field(gt=0)] = 300.0  # absolute SLOs, on the canary alone
    max_error_rate: Annotated[float, Field(gt=0, le=1)] = 0.01
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = (
        0.95  # of the always-valid intervals, across every look of a step
    )
    rollback_confidence: Annotated[float, Field(gt=0.5, lt=1)] = (
        0.99  # a step fails only this sure: a false rollback costs a release and a person
    )
    tolerance_pct: Annotated[float, Field(ge=0, le=1000)] = (
        10.0  # practical tolerance: +10 % of the baseline's P95 ...
    )
    tolerance_ms: Annotated[float, Field(ge=0, le=60_000)] = (
        5.0  # ... or +5 ms of the P95 at peak (`peak_p95_ms`), whichever is larger
    )
    # The champion's P95 at the fleet's peak, which anchors tolerance_ms: a canary x1.5 at a light
    # hour (+2.7 ms on 5.5 ms) is x1.5 at peak too (+17 ms on 34 ms). None: the release takes the
    # capacity check's `champion_p95_at_peak_ms`, or with the check off the champion's P95 in the
    # busiest ten minutes of the log store's history; without either, the observed baseline P95.
    peak_p95_ms: Annotated[float, Field(gt=0)] | None = None
    error_tolerance_pt: Annotated[float, Field(ge=0, le=100)] = (
        0.5  # errors: +0.5 percentage points over the baseline
    )
    min_requests: Annotated[int, Field(ge=1)] = 200  # per cohort over the step before any verdict
    max_windows: Annotated[int, Field(ge=1, le=100)] = (
        10  # per step; still undecided then -> inconclusive, a person decides
    )
    consecutive_error_limit: Annotated[int, Field(ge=1)] = (
        4  # failed log queries in a row before `error`
    )
    ctr_tolerance_pct: Annotated[float, Field(gt=0, lt=100)] = (
        10.0  # clicks: a canary losing more than 10 % of them fails
    )
    min_impressions: Annotated[int, Field(ge=1)] = (
        2_000  # per cohort, over the canary so far, before clicks are judged
    )
    power: Annotated[float, Field(gt=0, lt=1)] = (
        0.8  # what the plan aims for: a canary equal to its baseline passes
    )
    p99_min_requests: Annotated[int, Field(ge=100)] = (
        2_000  # per cohort before the P99 is tested too (20 rows above it)
    )
    srm_p: Annotated[float, Field(gt=0, lt=0.5)] = (
        0.001  # the split itself: an always-valid p below this -> `invalid`
    )
    plan_max_windows: Annotated[int, Field(ge=1)] = (
        40  # the longest the plan may make a thin last step (40 windows)
    )

    def __post_init__(self) -> None:
        checks = {
            "confidence": 0.5 < self.confidence < 1,
            "rollback_confidence": 0.5 < self.rollback_confidence < 1,
            "tolerance_pct": self.tolerance_pct >= 0,
            "tolerance_ms": self.tolerance_ms >= 0,
            "error_tolerance_pt": self.error_tolerance_pt >= 0,
            "max_windows": self.max_windows >= 1,
            "min_requests": self.min_requests >= 1,
            "max_p95_ms": self.max_p95_ms > 0,
            "max_error_rate": 0 < self.max_error_rate <= 1,
            "consecutive_error_limit": self.consecutive_error_limit >= 1,
            "power": 0 < self.power < 1,
            "ctr_tolerance_pct": 0 < self.ctr_tolerance_pct < 100,
            "min_impressions": self.min_impressions >= 1,
            "p99_min_requests": self.p99_min_requests >= 100,
            "srm_p": 0 < self.srm_p < 0.5,
            "plan_max_windows": self.plan_max_windows >= 1,
            "peak_p95_ms": self.peak_p95_ms is None or self.peak_p95_ms > 0,
        }
        bad = [f"{name}={getattr(self, name)!r}" for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid canary rules: {', '.join(bad)}")
        if self.rollback_confidence < self.confidence:
            raise ValueError(
                f"invalid canary rules: rollback_confidence={self.rollback_confidence!r} is below "
                f"confidence={self.confidence!r}: a step would fail on less evidence than it passes"
            )
        if self.tolerance_pct == 0 and self.tolerance_ms == 0:
            raise ValueError("invalid canary rules: tolerance_pct and tolerance_ms are both 0")

    @property
    def alpha(self) -> float:
        return 1 - self.confidence

    @property
    def rollback_alpha(self) -> float:
        return 1 - self.rollback_confidence

    def anchored(self, peak_p95_ms: float | None) -> CanaryRules:
        """These rules with `peak_p95_ms` set to a measured champion P95 at peak; these rules
        themselves where the run already set one or the figure is missing or not a latency."""
        if self.peak_p95_ms is not None or peak_p95_ms is None:
            return self
        if not math.isfinite(peak_p95_ms) or peak_p95_ms <= 0:
            return self
        return dataclasses.replace(self, peak_p95_ms=round(float(peak_p95_ms), 3))

    def latency_tolerance(self, baseline_p95_ms: float) -> float:
        """The largest canary/baseline latency ratio that is not a regression.

        `tolerance_ms` is counted against the P95 at peak where it is known (`peak_p95_ms`), or
        the baseline's here if that is higher: a slowdown is a ratio, and what +5 ms means is
        what it means where latency matters most, not at whatever hour the release runs.
        """
        anchor = max(baseline_p95_ms, self.peak_p95_ms or 0.0)
        relative = self.tolerance_ms / anchor if anchor > 0 else math.inf
        return 1 + max(self.tolerance_pct / 100, relative)

    @property
    def ctr_tolerance(self) -> float:
        """The lowest canary/baseline click-through ratio that is not a loss."""
        return 1 - self.ctr_tolerance_pct / 100

    def thresholds(self) -> dict[str, float]:
        return {
            "max_p95_ms": self.max_p95_ms,
            "max_error_rate": self.max_error_rate,
            "confidence": self.confidence,
            "rollback_confidence": self.rollback_confidence,
            "tolerance_pct": self.tolerance_pct,
            "tolerance_ms": self.tolerance_ms,
            "error_tolerance_pt": self.error_tolerance_pt,
            "min_requests": float(self.min_requests),
            "max_windows": float(self.max_windows),
            "ctr_tolerance_pct": self.ctr_tolerance_pct,
            "min_impressions": float(self.min_impressions),
            "p99_min_requests": float(self.p99_min_requests),
            "srm_p": self.srm_p,
            **({"peak_p95_ms": self.peak_p95_ms} if self.peak_p95_ms is not None else {}),
        }


@dataclass(frozen=True)
class ShadowRules:
    """The shadow stage before the first canary weight. The one home of these defaults.

    The latency tolerance, the error tolerance and the confidence are the canary gate's
    (`CanaryRules`): the shadow judges the same regression, on pairs instead of cohorts.
    """

    enabled: bool = True
    share: Annotated[float, Field(gt=0, le=1)] = 0.2  # of stable's requests, mirrored
    max_queue: Annotated[int, Field(ge=1)] = 32  # mirrors in flight per worker; more: dropped
    window_s: Annotated[float, Field(gt=0, le=600)] = 10.0  # between two looks
    max_windows: Annotated[int, Field(ge=1, le=100)] = 6  # still undecided: inconclusive (1 min)
    min_pairs: Annotated[int, Field(ge=1)] = 200  # scored pairs before any verdict
    max_drop_share: Annotated[float, Field(ge=0, lt=1)] = (
        0.2  # of chosen requests dropped (queue full): more, and the pairs are biased
    )
    agreement_k: Annotated[int, Field(ge=1, le=100)] = 5  # the parity gate's k
    min_agreement: Annotated[float, Field(ge=0, le=1)] = (
        0.5  # top-k overlap with stable's answers below this, with confidence: failed
    )

    def __post_init__(self) -> None:
        checks = {
            "share": 0 < self.share <= 1,
            "max_queue": self.max_queue >= 1,
            "window_s": 0 < self.window_s <= 600,
            "max_windows": self.max_windows >= 1,
            "min_pairs": self.min_pairs >= 1,
            "max_drop_share": 0 <= self.max_drop_share < 1,
            "agreement_k": 1 <= self.agreement_k <= 100,
            "min_agreement": 0 <= self.min_agreement <= 1,
        }
        bad = [f"{name}={getattr(self, name)!r}" for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid shadow rules: {', '.join(bad)}")

    def thresholds(self) -> dict[str, float]:
        return {
            "min_pairs": float(self.min_pairs),
            "max_windows": float(self.max_windows),
            "max_drop_share": self.max_drop_share,
            "agreement_k": float(self.agreement_k),
            "min_agreement": self.min_agreement,
        }

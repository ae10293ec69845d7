"""What one canary step's looks see and carry: the log store's figures, the running evidence."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.gate.sequential import Estimate, Interval
from logstore.feedback import ClickSums
from logstore.slo import CohortSums, PairedSeconds, RankTest

_OPEN = Interval(-math.inf, math.inf, 1.0)


@dataclass(frozen=True)
class StepFigures:
    """What the log store says about one canary step: over the step so far, and its last window."""

    canary: CohortSums | None
    baseline: CohortSums | None
    paired: PairedSeconds | None = None  # None: treat the cohorts' moments as unrelated
    stable: CohortSums | None = None
    rank: RankTest | None = None
    window_canary: CohortSums | None = None
    window_baseline: CohortSums | None = None
    window_rank: RankTest | None = None
    clicks_canary: ClickSums | None = None  # over the canary so far, all its steps
    clicks_baseline: ClickSums | None = None


def _meet(a: Interval, b: Interval) -> Interval:
    return Interval(max(a.low, b.low), min(a.high, b.high), min(a.p_value, b.p_value))


@dataclass(frozen=True)
class StepEvidence:
    """What the step has established so far: intervals intersected over looks, running p-values."""

    looks: int = 0
    latency: Interval = _OPEN
    errors: Interval = _OPEN
    clicks: Interval = _OPEN
    p95: Interval = _OPEN
    p99: Interval = _OPEN
    split_log_bf: float = -math.inf  # the users' test: the largest Bayes factor so far
    split_p_requests: float = 1.0  # the requests' test: its running always-valid p

    def after(
        self,
        latency: Interval,
        errors: Interval,
        clicks: Interval | None = None,
        p95: Interval | None = None,
        p99: Interval | None = None,
    ) -> StepEvidence:
        """Each interval holds at every look at once, so their running intersection does too."""
        return StepEvidence(
            self.looks + 1,
            _meet(self.latency, latency),
            _meet(self.errors, errors),
            self.clicks if clicks is None else _meet(self.clicks, clicks),
            self.p95 if p95 is None else _meet(self.p95, p95),
            self.p99 if p99 is None else _meet(self.p99, p99),
            self.split_log_bf,
            self.split_p_requests,
        )

    def with_split(self, log_bf: float, p_requests: float) -> StepEvidence:
        return StepEvidence(
            self.looks,
            self.latency,
            self.errors,
            self.clicks,
            self.p95,
            self.p99,
            max(self.split_log_bf, log_bf),
            min(self.split_p_requests, p_requests),
        )


@dataclass(frozen=True)
class Shifts:
    """The look's estimates, canary against baseline, on their comparison scales."""

    latency: Estimate
    errors: Estimate
    p95: Estimate
    p99: Estimate | None  # None: too few requests for the P99's tail
    clicks: Estimate | None  # None: clicks not judged yet
    canary_p95: Estimate | None = None  # log of the canary's own P95, for the absolute SLO

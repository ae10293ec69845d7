"""The canary verdict's sentences: each figure with its interval and sample size."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.gate.evidence import Shifts, StepEvidence, StepFigures
from core.gate.rules import MIN_USERS, CanaryRules
from logstore.feedback import ClickSums


def ratio(x: float) -> float:
    return math.exp(min(x, 700.0))


@dataclass(frozen=True)
class Texts:
    """The verdict's sentences, each with its figures, interval and sample size."""

    latency: str
    tolerance: str
    p95: str
    errors: str
    clicks: str

    @classmethod
    def of(
        cls,
        figures: StepFigures,
        rules: CanaryRules,
        shifts: Shifts,
        evidence: StepEvidence,
        tolerance: float,
    ) -> Texts:
        canary, baseline = figures.canary, figures.baseline
        assert canary is not None and baseline is not None
        lat, err, p95 = evidence.latency, evidence.errors, evidence.p95
        pct = f"{rules.confidence:.0%}"
        latency = (
            f"canary latency x{math.exp(shifts.latency.value):.2f} of baseline's (geometric mean; "
            f"always-valid {pct} interval x{math.exp(lat.low):.2f}-x{ratio(lat.high):.2f}, "
            f"p={lat.p_value:.3g}; P95 {canary.p95_ms:.1f} vs {baseline.p95_ms:.1f} ms; "
            f"{canary.requests:.0f} vs {baseline.requests:.0f} requests from "
            f"{canary.users} vs {baseline.users} users)"
        )
        ratio95 = canary.p95_ms / baseline.p95_ms if baseline.p95_ms > 0 else math.nan
        p95_text = (
            f"P95 ratio x{ratio95:.2f} (always-valid {pct} interval "
            f"x{ratio(max(p95.low, -700)):.2f}-x{ratio(p95.high):.2f}, p={p95.p_value:.3g})"
        )
        tolerance_text = (
            f"tolerance x{tolerance:.2f} (+{rules.tolerance_pct:g} % of baseline P95 or "
            f"+{rules.tolerance_ms:g} ms, whichever is larger)"
        )
        errors = (
            f"canary errors {_pct(canary.errors, canary.requests)} vs baseline "
            f"{_pct(baseline.errors, baseline.requests)} (difference "
            f"{shifts.errors.value * 100:+.2f} pt, interval {err.low * 100:+.2f} to "
            f"{err.high * 100:+.2f} pt, p={err.p_value:.3g})"
        )
        return cls(
            latency,
            tolerance_text,
            p95_text,
            errors,
            _clicks_text(figures, rules, shifts, evidence),
        )


def _clicks_text(
    figures: StepFigures, rules: CanaryRules, shifts: Shifts, evidence: StepEvidence
) -> str:
    c, b = figures.clicks_canary, figures.clicks_baseline
    if shifts.clicks is None or c is None or b is None:
        return _clicks_not_judged(figures, rules)
    ctr = evidence.clicks
    return (
        f"click-through canary {c.rate:.2%} vs baseline {b.rate:.2%} "
        f"(x{1 + shifts.clicks.value:.2f}; always-valid {rules.confidence:.0%} interval "
        f"x{max(1 + ctr.low, 0.0):.2f}-x{1 + ctr.high:.2f}, "
        f"p={ctr.p_value:.3g}; {c.impressions:.0f} vs {b.impressions:.0f} "
        f"impressions from {c.users} vs {b.users} users over the canary so far)"
    )


def clicks_judged(figures: StepFigures, rules: CanaryRules) -> tuple[ClickSums, ClickSums] | None:
    """Canary and baseline click sums when both are large enough to judge, else None."""
    c, b = figures.clicks_canary, figures.clicks_baseline
    if c is None or b is None:
        return None
    enough = min(c.impressions, b.impressions) >= rules.min_impressions
    if not enough or min(c.users, b.users) < MIN_USERS or b.clicked == 0:
        return None
    return c, b


def _clicks_not_judged(figures: StepFigures, rules: CanaryRules) -> str:
    c, b = figures.clicks_canary, figures.clicks_baseline
    if c is None and b is None:
        return "clicks not judged: no impressions logged for canary or baseline (feedback off?)"
    counts = ", ".join(
        f"{name} {x.impressions:.0f} impressions from {x.users} users, {x.clicked:.0f} clicked"
        if x is not None
        else f"{name} none"
        for name, x in (("canary", c), ("baseline", b))
    )
    return (
        f"clicks not judged yet: {counts} over the canary so far (needs {rules.min_impressions} "
        f"impressions from {MIN_USERS} users each, and a baseline click)"
    )


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.2%}" if whole else "n/a"

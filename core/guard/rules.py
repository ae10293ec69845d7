"""The release guard's rules, pure: the champion's live SLO, the seed's quality rule, and the
verdict that combines them with the fleet's reconciliation.

The limits are `GuardLimits`, the one home of the guard's defaults: its SLO defaults are the
canary gate's (`core.gate.rules.CanaryRules`), its AUC drop the blessing's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from core.calibration.assessment import CalibrationThresholds
from core.gate.rules import CanaryRules
from logstore.slo import SlotStats
from relay.types import GateResult, Verdict


@dataclass(frozen=True)
class GuardLimits:
    """When the guard acts. The one home of the guard's defaults; the flow's signature reads them."""

    # One product SLO: the champion is held live to the absolute SLO its canary was held to.
    max_p95_ms: Annotated[float, Field(gt=0)] = CanaryRules.max_p95_ms
    max_error_rate: Annotated[float, Field(gt=0, le=1)] = CanaryRules.max_error_rate
    # served by the champion in the live window before any verdict
    min_requests: Annotated[int, Field(ge=1)] = 200
    # The quality rule's AUC drop is the blessing's relative limit, re-checked on fresh events.
    max_auc_drop: Annotated[float, Field(ge=0, le=1)] = CalibrationThresholds.max_auc_drop
    min_traffic_share: Annotated[float, Field(ge=0, le=1)] = 0.3
    min_labelled_events: Annotated[int, Field(ge=1)] = 2_000


def assess_live_slo(stats: list[SlotStats], champion: str, limits: GuardLimits) -> GateResult:
    """The champion's live latency and errors (stable slot) against the absolute SLOs."""
    rows = [s for s in stats if s.slot == "stable" and s.model_version == champion]
    served = sum(s.requests for s in rows)
    total = sum(s.requests for s in stats)
    measured = {"requests": float(served), "window_requests": float(total)}
    # A share of a near-empty window is noise, and of an empty one is no measurement at all: left
    # out, so that the quality rule sees "not measured" rather than a share of 0.
    if total >= limits.min_requests:
        measured["traffic_share"] = served / total
    thresholds = {
        "max_p95_ms": limits.max_p95_ms,
        "max_error_rate": limits.max_error_rate,
        "min_requests": float(limits.min_requests),
    }
    if served < limits.min_requests:
        return GateResult(
            gate="live_slo",
            verdict=Verdict.inconclusive,
            reason=f"champion served {served} requests, fewer than {limits.min_requests}",
            measurements=measured,
            thresholds=thresholds,
        )
    top = max(rows, key=lambda s: s.requests)
    measured |= {"p95_ms": top.p95_ms, "error_rate": top.error_rate}
    breaches = []
    if top.p95_ms > limits.max_p95_ms:
        breaches.append(f"live P95 {top.p95_ms:.1f} ms > {limits.max_p95_ms:g} ms")
    if top.error_rate > limits.max_error_rate:
        breaches.append(f"live error rate {top.error_rate:.2%} > {limits.max_error_rate:.2%}")
    if breaches:
        return GateResult(
            gate="live_slo",
            verdict=Verdict.failed,
            reason="; ".join(breaches),
            measurements=measured,
            thresholds=thresholds,
        )
    return GateResult(
        gate="live_slo",
        verdict=Verdict.passed,
        reason=f"live P95 {top.p95_ms:.1f} ms, errors {top.error_rate:.2%}",
        measurements=measured,
        thresholds=thresholds,
    )


def _compared(holds: bool | None) -> str:
    return ">" if holds else "<="


def quality_rule(
    auc_drop: float | None,
    traffic_share: float | None,
    calibration_blessed: bool,
    limits: GuardLimits,
) -> GateResult:
    """Failed when all three seed conditions hold, passed when a measured one does not, else inconclusive."""
    # None is "not measured": such a condition neither holds nor fails, so it cannot pass the rule.
    dropped = None if auc_drop is None else auc_drop > limits.max_auc_drop
    carries = None if traffic_share is None else traffic_share > limits.min_traffic_share
    conditions = (dropped, carries, not calibration_blessed)
    evidence = ", ".join(
        (
            "AUC drop not measured"
            if auc_drop is None
            else f"AUC drop {auc_drop:.3f} {_compared(dropped)} {limits.max_auc_drop:g}",
            "traffic share not measured"
            if traffic_share is None
            else f"traffic share {traffic_share:.0%} {_compared(carries)} {limits.min_traffic_share:.0%}",
            f"calibration {'passes' if calibration_blessed else 'fails'}",
        )
    )
    measured = {"calibration_blessed": float(calibration_blessed)}
    if auc_drop is not None:
        measured["auc_drop"] = auc_drop
    if traffic_share is not None:
        measured["traffic_share"] = traffic_share
    if all(c is True for c in conditions):
        verdict, reason = Verdict.failed, f"{evidence}: all rollback conditions hold"
    elif any(c is False for c in conditions):
        # One measured condition that does not hold settles the conjunction, whatever is missing.
        verdict, reason = Verdict.passed, f"{evidence}: not all rollback conditions hold"
    else:
        missing = []
        if auc_drop is None:
            missing.append("no AUC drop (no baseline AUC to compare with)")
        if traffic_share is None:
            missing.append(
                f"no traffic share (fewer than {limits.min_requests} requests in the live window)"
            )
        verdict = Verdict.inconclusive
        reason = f"{' and '.join(missing)}; the measured conditions hold ({evidence})"
    return GateResult(
        gate="quality",
        verdict=verdict,
        reason=reason,
        measurements=measured,
        thresholds={
            "max_auc_drop": limits.max_auc_drop,
            "min_traffic_share": limits.min_traffic_share,
        },
    )


def missing_quality_evidence(
    baseline: str | None, labelled: int, clicks: int, recent_hours: float, limits: GuardLimits
) -> str | None:
    """Why the quality rule cannot be measured on the labelled impressions, or None if it can."""
    if baseline is None:
        return "no previous champion to compare with"
    if labelled < limits.min_labelled_events:
        return (
            f"{labelled} labelled impressions (served, joined with feedback) in the last "
            f"{recent_hours:g} h, fewer than {limits.min_labelled_events}"
        )
    if clicks == 0 or clicks == labelled:
        return f"the {labelled} labelled impressions hold {clicks} clicks: AUC is undefined"
    return None


def decide(live: GateResult, quality: GateResult, fleet: GateResult | None = None) -> GateResult:
    """The guard's verdict: error, else failed (roll back), else passed only if every rule passed.

    `fleet` is the reconciliation's verdict (`tasks.reconcile`): its error (a worker that cannot
    be read or repaired) is the guard's error, and no champion rollback starts on such a fleet.
    """
    rules = (live, quality) if fleet is None else (fleet, live, quality)
    for verdict in (Verdict.error, Verdict.failed):
        hit = [g for g in rules if g.verdict is verdict]
        if hit:
            return GateResult(
                gate="guard",
                verdict=verdict,
                reason="; ".join(f"{g.gate} {verdict.value}: {g.reason}" for g in hit),
            )
    if all(g.verdict is Verdict.passed for g in rules):
        return GateResult(
            gate="guard",
            verdict=Verdict.passed,
            reason="; ".join(f"{g.gate} passed: {g.reason}" for g in rules),
        )
    said = [
        f"{g.gate} passed: {g.reason}"
        if g.verdict is Verdict.passed
        else f"{g.gate} lacked evidence: {g.reason}"
        for g in rules
    ]
    return GateResult(
        gate="guard",
        verdict=Verdict.inconclusive,
        reason="; ".join(said) + "; inconclusive, so the guard changes nothing",
    )

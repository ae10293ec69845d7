"""The canary gate's judge: canary against its equal-share baseline, one look at a time.

`judge_window` is the pure core: from the step's cumulative per-user sums (and the latest
window's, for the record) it returns a typed verdict and the evidence carried to the next look.

- Split: the observed shares of users and requests against the configured weights
  (`core.gate.srm`). A mismatch is `invalid`: every comparison below would be biased, so none
  decides; the weights are held and a person asked.
- Two confidences: a step passes when every interval at `confidence` (95 %) is within its
  tolerance, and fails only at `rollback_confidence` (99 %): for the tail and the absolute SLOs,
  when the interval at that confidence is wholly past the limit; for the mean, the errors and
  the clicks, when the change is clear at that confidence and its estimate is past the
  tolerance (below). The second is not "past the tolerance with 99 % confidence": a canary
  exactly at the tolerance has its estimate past it at about half the looks, so over a step's
  looks it is usually rolled back (bench.gate, `uniform x1.10` against a x1.10 tolerance:
  rolled back in 81-99 % of replays, never promoted).
- Latency, the mean: the ratio of geometric-mean latencies canary/baseline, exp(Δ mean log
  latency), with an always-valid confidence sequence (`core.gate.sequential`). A regression
  counts only when it is statistically clear (its always-valid p below 1 - rollback_confidence)
  *and* its estimate exceeds the practical tolerance (+`tolerance_pct` % of the baseline's P95 or
  +`tolerance_ms`, whichever is larger, as a ratio).
- Latency, the tail: the P95 ratio canary/baseline (and the P99 once both cohorts have
  `p99_min_requests`), its own always-valid interval (`core.gate.quantile`). It fails the step
  when the interval's low end is above the tolerance: the tail exceeds it with confidence.
- The step passes only when the mean's and the P95's intervals are both below the tolerance
  and the errors' below theirs.
- Errors: the difference of 5xx rates, the same way, against `error_tolerance_pt`.
- The absolute SLOs (P95, error rate) apply to the canary: a step fails when one is exceeded
  with confidence, and a canary over one, not yet surely, does not pass.
- Clicks: with feedback flowing, the ratio of click-through rates canary/baseline over the whole
  canary so far, with the same kind of always-valid interval: a harm detector, not a pass
  condition (clicks accrue far more slowly than latency samples).
- A per-user Mann-Whitney U test is reported beside it, never decided on (it is fixed-sample).
"""

from __future__ import annotations

import math

from core.gate.evidence import Shifts, StepEvidence, StepFigures
from core.gate.quantile import TailQuantiles, design_effect, log_quantile, quantile_shift
from core.gate.reasons import Texts, clicks_judged, ratio
from core.gate.rules import MIN_USERS, CanaryRules
from core.gate.sequential import (
    METHOD,
    Estimate,
    Interval,
    click_through_shift,
    confidence_sequence,
    error_rate,
    error_shift,
    latency_shift,
    mean_log_latency,
)
from core.gate.srm import SplitCheck, check_split, combined_p
from logstore.slo import CohortSums
from relay.types import GateResult, Verdict

JUDGE_METHOD = (
    f"{METHOD}; P95 (and P99) ratio: log sample quantiles from ClickHouse, Siddiqui-Bloch-"
    "Gastwirth sparsity, variance scaled by the mean test's design effect, the same confidence "
    "sequence (cf. Howard & Ramdas 2022); split: Dirichlet-multinomial anytime-valid test on "
    "users (Lindon & Malek 2022) and clustered request shares"
)


def _describe(prefix: str, c: CohortSums | None) -> dict[str, float]:
    if c is None:
        return {f"{prefix}_requests": 0.0}
    return {
        f"{prefix}_users": float(c.users),
        f"{prefix}_requests": c.requests,
        f"{prefix}_p50_ms": c.p50_ms,
        f"{prefix}_p95_ms": c.p95_ms,
        f"{prefix}_p99_ms": c.p99_ms,
        f"{prefix}_error_rate": c.errors / c.requests if c.requests else 0.0,
    }


def _measured(figures: StepFigures) -> dict[str, float]:
    measured = _describe("canary", figures.canary) | _describe("baseline", figures.baseline)
    measured |= _describe("stable", figures.stable)
    measured |= {
        f"window_{k}": v
        for k, v in (
            _describe("canary", figures.window_canary)
            | _describe("baseline", figures.window_baseline)
        ).items()
    }
    for name, rank in (("mwu", figures.rank), ("window_mwu", figures.window_rank)):
        if rank is not None:
            measured |= {f"{name}_p": rank.p_value, f"{name}_users": float(rank.users)}
    return measured


def tail_of(c: CohortSums, level: float) -> TailQuantiles:
    """The cohort's P95 (or P99) with the neighbours its variance needs."""
    if level == 0.99:
        return TailQuantiles(0.99, c.q985_ms, c.p99_ms, c.q995_ms, c.answered, 0.005)
    return TailQuantiles(0.95, c.q93_ms, c.p95_ms, c.q97_ms, c.answered, 0.02)


def _request_level(c: CohortSums) -> float:
    """The mean log latency's variance as if every request were independent."""
    n = c.answered
    if n < 2:
        return math.inf
    mean = c.log_sum / n
    return max(c.log_sq / n - mean * mean, 0.0) / n


def _shifts(
    figures: StepFigures, rules: CanaryRules, canary: CohortSums, baseline: CohortSums
) -> Shifts:
    shift = latency_shift(canary, baseline, figures.paired)
    deff = design_effect(shift.variance, _request_level(canary) + _request_level(baseline))
    p95 = quantile_shift(tail_of(canary, 0.95), tail_of(baseline, 0.95), deff)
    enough_for_p99 = min(canary.answered, baseline.answered) >= rules.p99_min_requests
    p99 = (
        quantile_shift(tail_of(canary, 0.99), tail_of(baseline, 0.99), deff)
        if enough_for_p99
        else None
    )
    clicks = clicks_judged(figures, rules)
    own = log_quantile(tail_of(canary, 0.95))
    own_deff = design_effect(mean_log_latency(canary).variance, _request_level(canary))
    return Shifts(
        shift,
        error_shift(canary, baseline, figures.paired),
        p95,
        p99,
        click_through_shift(*clicks) if clicks is not None else None,
        Estimate(own.value, own.variance * own_deff),
    )


def judge_window(
    figures: StepFigures, rules: CanaryRules, evidence: StepEvidence, weight: int | None = None
) -> tuple[GateResult, StepEvidence]:
    """passed | failed | inconclusive | invalid after this look, and the evidence carried on.

    `weight` is the step's configured canary share: with it, the split is checked first.
    """
    canary, baseline = figures.canary, figures.baseline
    measured = _measured(figures) | {"look": float(evidence.looks + 1)}

    def verdict(v: Verdict, reason: str, carried: StepEvidence) -> tuple[GateResult, StepEvidence]:
        gate = GateResult(
            gate="canary",
            verdict=v,
            reason=reason,
            method=JUDGE_METHOD,
            measurements=measured,
            thresholds=rules.thresholds(),
        )
        return gate, carried

    if canary is None or baseline is None:
        return verdict(Verdict.inconclusive, _missing(canary, baseline), evidence)
    if weight is not None:
        mismatch, evidence, split_measured = _split_verdict(figures, weight, evidence, rules)
        measured |= split_measured
        if mismatch is not None:
            return verdict(Verdict.invalid, mismatch, evidence)
    fewest = min(canary.requests, baseline.requests)
    if fewest < rules.min_requests or min(canary.users, baseline.users) < MIN_USERS:
        return verdict(
            Verdict.inconclusive,
            f"canary {canary.requests:.0f} requests from {canary.users} users, baseline "
            f"{baseline.requests:.0f} from {baseline.users}: fewer than the "
            f"{rules.min_requests} requests and {MIN_USERS} users each needed",
            evidence,
        )
    shifts = _shifts(figures, rules, canary, baseline)
    tolerance = rules.latency_tolerance(baseline.p95_ms)
    tolerance_99 = rules.latency_tolerance(baseline.p99_ms)
    error_tol = max(rules.error_tolerance_pt / 100, 1e-4)

    def cs(e: Estimate | None, tau: float) -> Interval | None:
        return None if e is None else confidence_sequence(e, tau, rules.alpha)

    evidence = evidence.after(
        confidence_sequence(shifts.latency, math.log(tolerance), rules.alpha),
        confidence_sequence(shifts.errors, error_tol, rules.alpha),
        cs(shifts.clicks, 1 - rules.ctr_tolerance),
        cs(shifts.p95, math.log(tolerance)),
        cs(shifts.p99, math.log(tolerance_99)),
    )
    measured |= _shift_measured(figures, shifts, evidence, tolerance, tolerance_99)
    if measured["ctr_judged"]:
        measured["ctr_tolerance_ratio"] = rules.ctr_tolerance
    text = Texts.of(figures, rules, shifts, evidence, tolerance)
    failures = _failures(rules, canary, shifts, evidence, text, (tolerance, tolerance_99))
    if failures:
        return verdict(Verdict.failed, "; ".join(failures), evidence)
    within = math.log(tolerance)
    if (
        evidence.latency.high < within
        and evidence.p95.high < within
        and evidence.errors.high < error_tol
        and canary.p95_ms <= rules.max_p95_ms  # over the SLO, but not yet surely: not a pass
        and canary.errors <= rules.max_error_rate * canary.requests  # the same for errors
    ):
        return verdict(
            Verdict.passed,
            f"no regression beyond tolerance: {text.latency}, within the {text.tolerance}; "
            f"{text.p95}, within it too; {text.errors}, within +{rules.error_tolerance_pt:g} pt; "
            f"{text.clicks}",
            evidence,
        )
    return verdict(
        Verdict.inconclusive,
        f"not yet conclusive after look {evidence.looks}: {text.latency}, {text.tolerance}; "
        f"{text.p95}; {text.errors}; {text.clicks}",
        evidence,
    )


def _over_the_slo(rules: CanaryRules, canary: CohortSums, shifts: Shifts) -> float | None:
    """The low end of the canary P95's interval, in ms, when it is above the absolute SLO.

    A point P95 over 50 requests is noisy: a fleet whose own P95 sits near the SLO would fail
    equal canaries by chance. The SLO fails the step when the P95 exceeds it with confidence.
    """
    own = shifts.canary_p95
    if canary.p95_ms <= rules.max_p95_ms or own is None or not math.isfinite(own.variance):
        return None
    tau = math.log(1 + rules.tolerance_pct / 100) or 0.1
    excess = _surely_above(own, math.log(rules.max_p95_ms), tau, rules.rollback_alpha)
    return None if excess is None else rules.max_p95_ms * math.exp(excess)


def _errors_over_the_slo(rules: CanaryRules, canary: CohortSums) -> float | None:
    """The low end of the canary's 5xx rate interval when it is above `max_error_rate`.

    As for the P95: three errors in 250 requests is 1.2 %, but a user whose requests fail
    together (a bad client, one cold path) makes that a chance a fleet at 0.1 % meets at thin
    traffic. The SLO fails the step when the rate exceeds it with confidence: the error rate's
    two-way clustered variance (`core.gate.sequential.error_rate`) in the same always-valid
    confidence sequence as every other figure.
    """
    if canary.requests <= 0 or canary.errors / canary.requests <= rules.max_error_rate:
        return None
    tau = max(rules.max_error_rate, 1e-4)
    excess = _surely_above(error_rate(canary), rules.max_error_rate, tau, rules.rollback_alpha)
    return None if excess is None else rules.max_error_rate + excess


def _surely_above(own: Estimate, limit: float, tau: float, alpha: float) -> float | None:
    """How far the always-valid interval of `own` lies above `limit` (its low end minus the
    limit), when all of it does; None otherwise. The absolute SLOs' one test."""
    low = confidence_sequence(Estimate(own.value - limit, own.variance), tau, alpha).low
    return low if low > 0 else None


def _missing(canary: CohortSums | None, baseline: CohortSums | None) -> str:
    cohorts = (("canary", canary), ("baseline", baseline))
    return f"no {' and '.join(s for s, c in cohorts if c is None)} requests yet"


def _p_of(log_bf: float) -> float:
    return 1.0 if log_bf <= 0 else math.exp(-log_bf)


def _split_verdict(
    figures: StepFigures, weight: int, evidence: StepEvidence, rules: CanaryRules
) -> tuple[str | None, StepEvidence, dict[str, float]]:
    """The split's reason when it mismatches (else None), the evidence, and its figures."""
    split, evidence = _split(figures, weight, evidence)
    measured = _split_measured(split, evidence)
    p = combined_p(_p_of(evidence.split_log_bf), evidence.split_p_requests)  # the step so far
    if p >= rules.srm_p:
        return None, evidence, measured
    reason = (
        f"sample-ratio mismatch at {weight} %: {split.describe()}; over the step so far the "
        f"two tests' combined p={p:.3g} (Bonferroni) is below {rules.srm_p:g}: "
        "every comparison would be biased, so the weights hold and a person decides"
    )
    return reason, evidence, measured


def _split(
    figures: StepFigures, weight: int, evidence: StepEvidence
) -> tuple[SplitCheck, StepEvidence]:
    cohorts = {"canary": figures.canary, "baseline": figures.baseline, "stable": figures.stable}
    present = {k: v for k, v in cohorts.items() if v is not None}
    split, log_bf = check_split(present, weight, evidence.split_log_bf)
    return split, evidence.with_split(log_bf, split.p_requests)


def _split_measured(split: SplitCheck, evidence: StepEvidence) -> dict[str, float]:
    measured = {
        "split_p_users": _p_of(evidence.split_log_bf),
        "split_p_requests": evidence.split_p_requests,
    }
    for slot, e, u, r in zip(
        split.slots, split.expected, split.user_shares, split.request_shares, strict=True
    ):
        measured |= {
            f"{slot}_expected_share": e,
            f"{slot}_user_share": u,
            f"{slot}_request_share": r,
        }
    return measured


def _shift_measured(
    figures: StepFigures,
    shifts: Shifts,
    evidence: StepEvidence,
    tolerance: float,
    tolerance_99: float,
) -> dict[str, float]:
    canary, baseline = figures.canary, figures.baseline
    assert canary is not None and baseline is not None
    lat, err, p95 = evidence.latency, evidence.errors, evidence.p95
    measured = {
        "latency_ratio": math.exp(shifts.latency.value),
        "latency_ratio_low": math.exp(lat.low),
        "latency_ratio_high": ratio(lat.high) if lat.high < 700 else math.inf,
        "latency_tolerance_ratio": tolerance,
        "latency_p_always_valid": lat.p_value,
        "error_diff": shifts.errors.value,
        "error_diff_low": err.low,
        "error_diff_high": err.high,
        "error_p_always_valid": err.p_value,
        "p95_ratio": canary.p95_ms / baseline.p95_ms if baseline.p95_ms > 0 else math.nan,
        "p95_ratio_low": ratio(p95.low) if p95.low > -700 else 0.0,
        "p95_ratio_high": ratio(p95.high) if p95.high < 700 else math.inf,
        "p95_p_always_valid": p95.p_value,
    }
    if shifts.p99 is not None:
        measured |= {
            "p99_ratio": canary.p99_ms / baseline.p99_ms if baseline.p99_ms > 0 else math.nan,
            "p99_ratio_low": ratio(evidence.p99.low) if evidence.p99.low > -700 else 0.0,
            "p99_ratio_high": ratio(evidence.p99.high) if evidence.p99.high < 700 else math.inf,
            "p99_tolerance_ratio": tolerance_99,
        }
    if shifts.clicks is not None and figures.clicks_canary and figures.clicks_baseline:
        ctr, c, b = evidence.clicks, figures.clicks_canary, figures.clicks_baseline
        measured |= {
            "ctr_judged": 1.0,
            "canary_impressions": c.impressions,
            "baseline_impressions": b.impressions,
            "canary_ctr": c.rate,
            "baseline_ctr": b.rate,
            "ctr_ratio": 1 + shifts.clicks.value,
            "ctr_ratio_low": max(1 + ctr.low, 0.0),
            "ctr_ratio_high": 1 + ctr.high,
            "ctr_p_always_valid": ctr.p_value,
        }
    else:
        measured["ctr_judged"] = 0.0
    return measured


def _failures(
    rules: CanaryRules,
    canary: CohortSums,
    shifts: Shifts,
    evidence: StepEvidence,
    text: Texts,
    tolerances: tuple[float, float],
) -> list[str]:
    """Every reason this look fails the step; empty when none holds."""
    tolerance, tolerance_99 = tolerances
    failures = []
    over = _over_the_slo(rules, canary, shifts)
    if over is not None:
        failures.append(
            f"absolute SLO: canary P95 {canary.p95_ms:.1f} ms > {rules.max_p95_ms:g} ms "
            f"(always-valid {rules.rollback_confidence:.0%} low end {over:.1f} ms)"
        )
    errors_low = _errors_over_the_slo(rules, canary)
    if errors_low is not None:
        failures.append(
            f"absolute SLO: canary error rate {canary.errors / canary.requests:.2%} > "
            f"{rules.max_error_rate:.2%} (always-valid {rules.rollback_confidence:.0%} low end "
            f"{errors_low:.2%}, clustered by user and second)"
        )
    # A step fails only at `rollback_confidence`. For the mean, the errors and the clicks: the
    # running always-valid p (the smallest alpha whose sequence excluded no change at some look;
    # two-sided) below its alpha, with this look's estimate past the tolerance in the harmful
    # direction. For the tail and the absolute SLOs: this look's sequence at that alpha wholly
    # past the limit.
    sure = rules.rollback_alpha
    lat, err = evidence.latency, evidence.errors
    if lat.p_value < sure and shifts.latency.value > math.log(tolerance):
        failures.append(f"relative to baseline: {text.latency}, beyond the {text.tolerance}")
    p95_low = confidence_sequence(shifts.p95, math.log(tolerance), sure).low
    if p95_low > math.log(tolerance):
        failures.append(
            f"tail relative to baseline: {text.p95}, beyond the {text.tolerance} with "
            f"{rules.rollback_confidence:.0%} confidence (low end x{ratio(p95_low):.2f})"
        )
    p99 = (
        confidence_sequence(shifts.p99, math.log(tolerance_99), sure)
        if shifts.p99 is not None
        else None
    )
    if p99 is not None and p99.low > math.log(tolerance_99):
        failures.append(
            f"tail relative to baseline: P99 ratio {rules.rollback_confidence:.0%} interval "
            f"x{ratio(p99.low):.2f}-x{ratio(p99.high):.2f}, beyond its tolerance "
            f"x{tolerance_99:.2f}"
        )
    error_tol = rules.error_tolerance_pt / 100
    if err.p_value < sure and shifts.errors.value > error_tol:
        failures.append(
            f"relative to baseline: {text.errors}, beyond the +{rules.error_tolerance_pt:g} pt "
            "tolerance"
        )
    ctr = evidence.clicks
    if (
        shifts.clicks is not None
        and ctr.p_value < sure
        and 1 + shifts.clicks.value < rules.ctr_tolerance
    ):
        failures.append(
            f"fewer clicks than baseline: {text.clicks}, beyond the "
            f"-{rules.ctr_tolerance_pct:g} % click-through tolerance"
        )
    return failures


def latency_regressed(gate: GateResult) -> bool:
    """Whether a failed canary verdict rests on latency (its P95 SLO or the ratio to baseline)."""
    m, t = gate.measurements, gate.thresholds
    if gate.verdict is not Verdict.failed:
        return False
    over_slo = m.get("canary_p95_ms", 0.0) > t.get("max_p95_ms", math.inf)
    over_baseline = m.get("latency_ratio_low", 0.0) > 1 and m.get("latency_ratio", 0.0) > m.get(
        "latency_tolerance_ratio", math.inf
    )
    return over_slo or over_baseline

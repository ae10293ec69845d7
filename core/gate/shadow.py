"""The shadow judge: the candidate against stable on the same requests, before any user sees it.

Each pair is one request stable answered and the canary slot also scored in shadow
(`serving.shadow`), so host noise, the request's size and the moment are shared: the
per-request log-latency difference shadow minus stable carries the candidate's own cost.

- Mean: exp(mean of the differences), the ratio of geometric means shadow/stable, its variance
  by the delta method clustered by user (Deng et al., KDD 2018; a user's requests are
  correlated), in the normal-mixture mSPRT confidence sequence of `core.gate.sequential`
  (Johari et al. 2022), valid at every look.
- Tail: the P95 ratio shadow/stable (and the P99 once `p99_min_requests` pairs are in), from
  ClickHouse's exact quantiles, Siddiqui-Bloch-Gastwirth variance scaled by the mean's design
  effect (`core.gate.quantile`). Its two sides are the same requests, so treating them as
  independent (the variances add) overstates the variance: the interval is conservative.
- Errors: a shadow error is the candidate's error (stable answered that request), the rate
  against the gate's `error_tolerance_pt`, variance floored at the binomial of (e+1)/(n+2).
- Agreement: the top-k overlap of the two answers, the offline parity gate's measure
  (`tasks.compilation.topk_overlap`, k = 5). Parity promised the candidate's engine ranks as
  its own reference does (≥ 0.99 for ORT fp32); a retrained candidate may legitimately rank
  differently from the champion, so the live floor (`ShadowRules.min_agreement`, 0.5) catches
  a candidate whose live rankings are not the task's any more (reversed, shuffled, a skew),
  not a better model. Failed when the interval's high end is below the floor.

The tolerances and the confidence are the canary gate's (`CanaryRules`); intervals are
intersected across looks. A mirror queue that dropped more than `max_drop_share` of the chosen
requests leaves pairs biased toward the candidate's fast requests (drops happen when it is
slow), so no pass is given on them.

How shadow evidence carries into the canary: it does not enter the canary step's confidence
sequences. The shadow measures the candidate beside stable on the same requests, the canary
against its baseline on different users with clicks; pooling the two would mix estimands. A
`passed` shadow is recorded and a `failed` one ends the release before any weight; either way
the canary steps start from no evidence, as planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from core.gate.quantile import P95_BANDWIDTH, P99_BANDWIDTH, TailQuantiles, quantile_shift
from core.gate.rules import MIN_USERS, CanaryRules, ShadowRules
from core.gate.sequential import Estimate, Interval, _ratio_variance, confidence_sequence
from logstore.shadow import LEVELS, ShadowSums
from relay.types import GateResult, Verdict

SHADOW_METHOD = (
    "paired per request (shadow vs stable on the same request): mean log-latency difference, "
    "delta method clustered by user, mSPRT normal-mixture confidence sequence valid at every "
    "look (Johari et al. 2022); P95/P99 ratio from ClickHouse exact quantiles, Siddiqui-Bloch-"
    "Gastwirth variance times the design effect; shadow errors as the candidate's; top-k "
    "overlap (the parity gate's measure) against a floor"
)
_WIDE = Interval(-math.inf, math.inf, 1.0)


@dataclass(frozen=True)
class MirrorCounts:
    """What the fleet's workers counted since the shadow began: mirrored and dropped."""

    mirrored: int
    dropped: int

    @property
    def drop_share(self) -> float:
        chosen = self.mirrored + self.dropped
        return self.dropped / chosen if chosen else 0.0


@dataclass(frozen=True)
class ShadowEvidence:
    """The intersected intervals after each look (log scale for latency)."""

    looks: int = 0
    latency: Interval = _WIDE
    p95: Interval = _WIDE
    errors: Interval = _WIDE
    agreement: Interval = _WIDE

    def after(self, **now: Interval | None) -> ShadowEvidence:
        def meet(old: Interval, new: Interval | None) -> Interval:
            if new is None:
                return old
            return Interval(max(old.low, new.low), min(old.high, new.high), min(new.p_value, 1.0))

        fields = {name: meet(getattr(self, name), new) for name, new in now.items()}
        return replace(self, looks=self.looks + 1, **fields)


def _tail(sums: ShadowSums, side: tuple[float, ...], level: float, n: float) -> TailQuantiles:
    at = {lv: q for lv, q in zip(LEVELS, side, strict=True)}
    h = P95_BANDWIDTH if level == 0.95 else P99_BANDWIDTH
    return TailQuantiles(level, at[round(level - h, 3)], at[level], at[round(level + h, 3)], n, h)


def shadow_shifts(
    sums: ShadowSums, users: int, rules: CanaryRules
) -> tuple[Estimate, Estimate, Estimate | None, Estimate, Estimate]:
    """(mean log ratio, P95 log ratio, P99 log ratio or None, error rate, agreement)."""
    lat = sums.latency
    mean = Estimate(
        lat.x / lat.n if lat.n else math.nan,
        _ratio_variance(users, lat.x, lat.n, lat.x_sq, lat.n_sq, lat.cross),
    )
    request_var = (
        (sums.latency_request_sq / lat.n - mean.value**2) / lat.n if lat.n > 1 else math.inf
    )
    deff = max(mean.variance / request_var, 1.0) if request_var > 0 else 1.0
    p95 = quantile_shift(
        _tail(sums, sums.shadow_quantiles_ms, 0.95, lat.n),
        _tail(sums, sums.stable_quantiles_ms, 0.95, lat.n),
        deff,
    )
    p99 = (
        quantile_shift(
            _tail(sums, sums.shadow_quantiles_ms, 0.99, lat.n),
            _tail(sums, sums.stable_quantiles_ms, 0.99, lat.n),
            deff,
        )
        if lat.n >= rules.p99_min_requests
        else None
    )
    e = sums.errors
    rate = e.x / e.n if e.n else math.nan
    floor_p = (e.x + 1) / (e.n + 2)
    err_var = max(
        _ratio_variance(users, e.x, e.n, e.x_sq, e.n_sq, e.cross),
        floor_p * (1 - floor_p) / max(e.n, 1),
    )
    a = sums.agreement
    agreement = Estimate(
        a.x / a.n if a.n else math.nan,
        max(
            _ratio_variance(users, a.x, a.n, a.x_sq, a.n_sq, a.cross),
            0.25 / max(a.n, 1) / 100,  # a floor: all-equal overlaps are not certainty
        ),
    )
    return mean, p95, p99, Estimate(rate, err_var), agreement


def judge_shadow(
    sums: ShadowSums,
    counts: MirrorCounts,
    shadow: ShadowRules,
    gate: CanaryRules,
    evidence: ShadowEvidence,
) -> tuple[GateResult, ShadowEvidence]:
    """passed | failed | inconclusive after this look at the pairs so far, and the evidence."""
    measured: dict[str, float] = {
        "look": float(evidence.looks + 1),
        "pairs": float(sums.pairs),
        "scored_pairs": sums.latency.n,
        "users": float(sums.users),
        "mirrored": float(counts.mirrored),
        "dropped": float(counts.dropped),
        "drop_share": counts.drop_share,
    }

    def verdict(v: Verdict, reason: str, ev: ShadowEvidence) -> tuple[GateResult, ShadowEvidence]:
        limits = shadow.thresholds() | gate.thresholds()
        return GateResult(gate="shadow", verdict=v, reason=reason, method=SHADOW_METHOD,
                          measurements=measured, thresholds=limits), ev  # fmt: skip

    if sums.pairs < shadow.min_pairs or sums.users < MIN_USERS:
        return verdict(
            Verdict.inconclusive,
            f"{sums.pairs} pairs ({sums.latency.n:.0f} scored) from {sums.users} users: fewer "
            f"than the {shadow.min_pairs} pairs and {MIN_USERS} users needed "
            f"({counts.mirrored} mirrored, {counts.dropped} dropped)",
            evidence,
        )
    mean, p95, p99, errors, agreement = shadow_shifts(sums, max(sums.users, 2), gate)
    stable_p95 = sums.stable_quantiles_ms[LEVELS.index(0.95)]
    tolerance = gate.latency_tolerance(stable_p95)
    within = math.log(tolerance)
    error_tol = max(gate.error_tolerance_pt / 100, 1e-4)
    cs = confidence_sequence
    evidence = evidence.after(
        latency=cs(mean, within, gate.alpha) if math.isfinite(mean.variance) else None,
        p95=cs(p95, within, gate.alpha) if math.isfinite(p95.variance) else None,
        errors=cs(errors, error_tol, gate.alpha),
        agreement=cs(agreement, 0.1, gate.alpha) if math.isfinite(agreement.value) else None,
    )
    ev = evidence
    text = _Texts(ev, mean, p95, errors, agreement, sums, tolerance)
    measured |= text.measured()
    failures = _failures(ev, (mean, p95, p99), text, shadow, gate, tolerance, measured)
    if failures:
        return verdict(Verdict.failed, "candidate refused in shadow: " + "; ".join(failures), ev)
    if counts.drop_share > shadow.max_drop_share:
        return verdict(
            Verdict.inconclusive,
            f"mirror queue full: {counts.dropped} of {counts.mirrored + counts.dropped} chosen "
            f"requests dropped ({counts.drop_share:.0%}, over {shadow.max_drop_share:.0%}); the "
            f"pairs left favour the candidate's fast requests, so no pass: {text.mean}; {text.p95}",
            ev,
        )
    if (
        ev.latency.high < within
        and ev.p95.high < within
        and ev.errors.high < error_tol
        and (ev.agreement.low >= shadow.min_agreement or sums.agreement.n == 0)
    ):
        return verdict(
            Verdict.passed,
            f"no regression beyond tolerance in shadow: {text.mean}; {text.p95}, within the "
            f"tolerance x{tolerance:.2f}; {text.errors}; {text.agreement}",
            ev,
        )
    return verdict(
        Verdict.inconclusive,
        f"not yet conclusive after look {ev.looks}: {text.mean}; {text.p95}; tolerance "
        f"x{tolerance:.2f}; {text.errors}; {text.agreement}",
        ev,
    )


def _failures(
    ev: ShadowEvidence,
    latency: tuple[Estimate, Estimate, Estimate | None],
    text: _Texts,
    shadow: ShadowRules,
    gate: CanaryRules,
    tolerance: float,
    measured: dict[str, float],
) -> list[str]:
    """Each figure beyond its tolerance with confidence, as the reason states it."""
    mean, _, p99 = latency
    within = math.log(tolerance)
    error_tol = max(gate.error_tolerance_pt / 100, 1e-4)
    cs = confidence_sequence
    failures = []
    if ev.errors.low > error_tol:
        failures.append(f"{text.errors}, beyond +{gate.error_tolerance_pt:g} pt")
    if ev.latency.low > 0 and mean.value > within:
        failures.append(f"{text.mean}, beyond the tolerance x{tolerance:.2f}")
    if ev.p95.low > within:
        failures.append(f"{text.p95}, beyond the tolerance x{tolerance:.2f} with confidence")
    if p99 is not None:
        p99_cs = cs(p99, within, gate.alpha)
        measured["p99_ratio"] = math.exp(p99.value)
        if p99_cs.low > within:
            failures.append(
                f"shadow P99 x{math.exp(p99.value):.2f} of stable's (always-valid interval "
                f"x{math.exp(p99_cs.low):.2f}-x{math.exp(p99_cs.high):.2f}), beyond x{tolerance:.2f}"
            )
    if ev.agreement.high < shadow.min_agreement:
        failures.append(f"{text.agreement}, below the floor {shadow.min_agreement:g}")
    return failures


@dataclass(frozen=True)
class _Texts:
    """Each figure as the reason states it: estimate, always-valid interval, sample size."""

    ev: ShadowEvidence
    mean_e: Estimate
    p95_e: Estimate
    errors_e: Estimate
    agreement_e: Estimate
    sums: ShadowSums
    tolerance: float

    @property
    def mean(self) -> str:
        lo, hi = self.ev.latency.low, self.ev.latency.high
        return (
            f"shadow latency x{math.exp(self.mean_e.value):.2f} of stable's on the same requests "
            f"(geometric mean; always-valid interval x{math.exp(lo):.2f}-x{math.exp(hi):.2f}; "
            f"{self.sums.latency.n:.0f} pairs from {self.sums.users} users)"
        )

    @property
    def p95(self) -> str:
        q = LEVELS.index(0.95)
        lo, hi = self.ev.p95.low, self.ev.p95.high
        return (
            f"P95 {self.sums.shadow_quantiles_ms[q]:.1f} vs {self.sums.stable_quantiles_ms[q]:.1f} "
            f"ms, x{_exp(self.p95_e.value):.2f} (interval x{_exp(lo):.2f}-x{_exp(hi):.2f})"
        )

    @property
    def errors(self) -> str:
        e = self.sums.errors
        return (
            f"shadow errors {e.x:.0f} of {e.n:.0f} ({self.errors_e.value:.2%}; interval "
            f"{max(self.ev.errors.low, 0):.2%}-{self.ev.errors.high:.2%})"
        )

    @property
    def agreement(self) -> str:
        a = self.sums.agreement
        if a.n == 0:
            return "agreement not judged: no scored pair with more than k candidates"
        return (
            f"top-k overlap with stable's answers {self.agreement_e.value:.2f} (interval "
            f"{max(self.ev.agreement.low, 0):.2f}-{min(self.ev.agreement.high, 1):.2f}, "
            f"{a.n:.0f} pairs)"
        )

    def measured(self) -> dict[str, float]:
        return {
            "mean_ratio": _exp(self.mean_e.value),
            "mean_ratio_low": _exp(self.ev.latency.low),
            "mean_ratio_high": _exp(self.ev.latency.high),
            "p95_ratio": _exp(self.p95_e.value),
            "p95_ratio_low": _exp(self.ev.p95.low),
            "p95_ratio_high": _exp(self.ev.p95.high),
            "tolerance_ratio": self.tolerance,
            "shadow_error_rate": self.errors_e.value,
            "agreement": self.agreement_e.value,
            "agreement_low": self.ev.agreement.low,
        }


def _exp(x: float) -> float:
    return math.exp(x) if math.isfinite(x) else (0.0 if x < 0 else math.inf)


def shadow_unavailable(answers: list[tuple[str, int | None, str, str]]) -> GateResult | None:
    """Why the fleet cannot run the shadow, from each worker's (url, status, error, detail), or None.

    A worker that answers 404 to /admin/shadow predates it: `inconclusive` (no evidence, no
    fault of the candidate's; the canary steps judge without it). One that holds no canary
    (the candidate did not load into its slot), refuses the call or does not answer: `error`.
    """
    failed = [a for a in answers if a[1] != 200]
    if not failed:
        return None
    named = "; ".join(f"{url}: {error} {detail}".strip() for url, _, error, detail in failed)
    if all(status == 404 for _, status, _, _ in failed):
        return GateResult(
            gate="shadow",
            verdict=Verdict.inconclusive,
            reason=f"{len(failed)} of {len(answers)} workers too old for the shadow (404 on "
            f"/admin/shadow): no shadow evidence, the canary steps judge without it ({named})",
        )
    if any(error == "no_canary" for _, _, error, _ in failed):
        why = "the candidate is not loaded into the canary slot"
    else:
        why = "workers refused or did not answer the shadow call"
    return GateResult(
        gate="shadow", verdict=Verdict.error, reason=f"shadow not started: {why} ({named})"
    )

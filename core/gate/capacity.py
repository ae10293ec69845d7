"""The capacity check's decision: candidate against champion, from paired load-test rounds.

Before any user sees the candidate, one worker is driven at a ladder of offered rates, champion
and candidate alternating in short rounds (tasks/capacity.py), so drift in the host's load falls
on both alike. This module turns those rounds into a verdict and says nothing about I/O.

Method. A bracketing ladder (the fleet's peak, doubling, one champion/candidate pair per rate)
stops once both versions miss the SLO. Each version's own bracket is then the last ladder rate
it held and the first it missed; `refine_rates` rates inside *each* version's bracket (both
versions' crossings, not only the first one's) get `pairs_per_rate` pairs each, both versions at
every refined rate. Per version and offered rate, the rounds' latencies are pooled and their P95
taken (exact empirical quantile over every request scheduled in the rounds, answered late or
not: an unanswered one counts as over the SLO). Near saturation short rounds give a P95 curve
that is not monotone in the offered rate (one run measured 360 ms at 2,240 req/s and 161 ms at
2,560), although a queue's P95 cannot fall as its load rises; the crossing is read from the
curve's monotone (isotonic) fit instead: the pool-adjacent-violators fit of P95 on the offered
rate, each rate weighted by its requests (Barlow et al. 1972), so one short round below its
neighbours no longer decides where the curve crosses. A rate "holds the SLO" when that fitted
P95 is within it and the error share within the limit. The throughput at the SLO is the highest
offered rate that holds, linearly interpolated in the fitted P95 between it and the first rate
that does not (the rate where the curve crosses the SLO); when every rate holds it is censored at
the highest rate tried (">="), and when none does it is below the lowest. The candidate fails
when its throughput at the SLO is more than `tolerance_pct` below the champion's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field

from core.gate.rules import CanaryRules
from relay.types import GateResult, Verdict

CHAMPION = "champion"
CANDIDATE = "candidate"
METHOD = (
    "paired alternating load-test rounds, refined around each version's own SLO crossing; "
    "pooled empirical P95 per version and offered rate, fitted monotone in the rate "
    "(isotonic, weighted by requests); throughput at the SLO = highest offered rate holding it, "
    "linearly interpolated in the fitted P95 to the SLO crossing"
)


@dataclass(frozen=True)
class CapacityRules:
    """How the capacity check loads one worker and when a candidate fails. The defaults' one home."""

    # Off by default: it saturates one serving worker of the fleet for up to a minute while that
    # worker answers users too (docs/gate.md), and its flag rates meet their targets only at the
    # boundary, over 20 runs (docs/benchmarks.md, `gate` row). A deployment with headroom or a
    # spare worker turns it on per run.
    enabled: bool = False
    tolerance_pct: Annotated[float, Field(gt=0, lt=100)] = (
        10.0  # candidate's throughput at the SLO more than 10 % below the champion's -> failed
    )
    rate_growth: Annotated[float, Field(gt=1, le=10)] = 2.0  # the bracketing ladder: peak x 2^k
    # then this many rates inside each version's bracket (its last held, first missed rate)
    refine_rates: Annotated[int, Field(ge=0, le=10)] = 3
    # No offered rate above this. It must lie above the champion's crossing, or the champion's
    # throughput is only a lower bound: on 2026-12-07 a worker here answered 6,000 req/s flat
    # out and an earlier cap of 4,000 left both versions holding the SLO at every rate.
    max_rate_rps: Annotated[float, Field(gt=0)] = 16000.0
    # one round: one version at one rate; every round the same length, so the curves compare
    round_s: Annotated[float, Field(gt=0, le=30)] = 0.75
    pairs_per_rate: Annotated[int, Field(ge=1, le=10)] = 2  # champion/candidate pairs per rate
    wall_budget_s: Annotated[float, Field(gt=0, le=600)] = 120.0  # the whole check, hard
    max_error_rate: Annotated[float, Field(ge=0, lt=1)] = 0.01  # more errors: the rate fails
    connections: Annotated[int, Field(ge=1, le=256)] = 32  # load-test connections to the worker
    floor_rps: Annotated[float, Field(gt=0)] = 20.0  # the peak per worker when there is no history
    # where the fleet's peak is read; with the check off, also where a release reads the
    # champion's P95 at peak to anchor the gate (tasks.canary_plan.anchor_at_history_peak)
    history_days: Annotated[float, Field(gt=0, le=90)] = 7.0
    # The peak per worker to start the ladder from, when the operator knows it (a planned sale,
    # a fleet resized since): None reads the busiest second of the last `history_days`.
    peak_rps: Annotated[float, Field(gt=0)] | None = None

    def __post_init__(self) -> None:
        if not self.rate_growth > 1:
            raise ValueError(f"rate_growth must be above 1, got {self.rate_growth!r}")
        if not 0 < self.tolerance_pct < 100:
            raise ValueError(f"tolerance_pct must be in (0, 100), got {self.tolerance_pct!r}")

    def bracket_rates(self, peak_rps: float) -> list[float]:
        """The bracketing ladder: the fleet's peak, then x rate_growth each step, up to the cap."""
        rates, rate = [], peak_rps
        while rate < self.max_rate_rps:
            rates.append(round(rate, 1))
            rate *= self.rate_growth
        return [*rates, self.max_rate_rps]

    def refined_rates(self, held_rps: float, missed_rps: float) -> list[float]:
        """`refine_rates` rates evenly inside (held, missed): where the SLO crossing lies."""
        step = (missed_rps - held_rps) / (self.refine_rates + 1)
        return [round(held_rps + step * (k + 1), 1) for k in range(self.refine_rates)]


@dataclass(frozen=True)
class Round:
    """One load-test round: one version at one offered rate."""

    version: str  # CHAMPION or CANDIDATE
    offered_rps: float
    latencies_ms: tuple[float, ...]  # every request scheduled in the round; inf = never answered
    errors: int  # answered with an error or never answered
    achieved_rps: float  # answered OK per second of the round


@dataclass(frozen=True)
class CurvePoint:
    offered_rps: float
    requests: int
    p95_ms: float
    error_rate: float
    achieved_rps: float

    def holds(self, slo_p95_ms: float, max_error_rate: float) -> bool:
        return self.requests > 0 and self.p95_ms <= slo_p95_ms and self.error_rate <= max_error_rate


@dataclass(frozen=True)
class Throughput:
    """A version's throughput at the SLO, with whether it is censored at either end of the ladder."""

    rps: float
    censored: str = ""  # "" (a crossing), "above" (every rate held), "below" (none did)

    def __str__(self) -> str:
        sign = {"above": ">= ", "below": "< "}.get(self.censored, "")
        return f"{sign}{self.rps:.0f} req/s"


def curve(rounds: Sequence[Round], version: str) -> list[CurvePoint]:
    """The version's points, one per offered rate, its rounds pooled."""
    out = []
    for rate in sorted({r.offered_rps for r in rounds if r.version == version}):
        mine = [r for r in rounds if r.version == version and r.offered_rps == rate]
        lat = np.array([x for r in mine for x in r.latencies_ms], dtype=float)
        n = int(lat.size)
        errors = sum(r.errors for r in mine)
        p95 = float(np.percentile(lat, 95, method="higher")) if n else math.inf
        achieved = float(np.mean([r.achieved_rps for r in mine]))
        out.append(CurvePoint(rate, n, p95, errors / n if n else 1.0, achieved))
    return out


def monotone(points: Sequence[CurvePoint]) -> list[CurvePoint]:
    """`points` (ascending rate) with P95 replaced by its isotonic fit, non-decreasing in the rate:
    pool adjacent violators, each rate weighted by its requests (module docstring)."""
    blocks: list[list[float]] = []  # [pooled P95, weight, how many points]
    for p in points:
        blocks.append([p.p95_ms, float(max(p.requests, 1)), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (y1, w1, k1), (y2, w2, k2) = blocks[-2], blocks.pop()
            # an unanswered request's inf P95 pools to inf: never fitted below the SLO
            pooled = math.inf if math.isinf(y1) else (y1 * w1 + y2 * w2) / (w1 + w2)
            blocks[-1] = [pooled, w1 + w2, k1 + k2]
    fitted = [y for y, _, k in blocks for _ in range(int(k))]
    return [dataclasses.replace(p, p95_ms=y) for p, y in zip(points, fitted, strict=True)]


def throughput_at_slo(
    points: Sequence[CurvePoint], slo_ms: float, max_error_rate: float
) -> Throughput:
    """The highest offered rate holding the SLO on the monotone fit of `points`, interpolated to
    the crossing (module docstring)."""
    if not points:
        return Throughput(0.0, "below")
    points = monotone(points)
    held = [p.holds(slo_ms, max_error_rate) for p in points]
    if not held[0]:
        return Throughput(points[0].offered_rps, "below")
    k = held.index(False) if False in held else len(points)
    if k == len(points):
        return Throughput(points[-1].offered_rps, "above")
    low, high = points[k - 1], points[k]
    if not math.isfinite(high.p95_ms) or high.p95_ms <= low.p95_ms:
        return Throughput(low.offered_rps)  # failed on errors: no P95 to interpolate in
    share = (slo_ms - low.p95_ms) / (high.p95_ms - low.p95_ms)
    return Throughput(low.offered_rps + share * (high.offered_rps - low.offered_rps))


def ladder_done(
    rounds: Sequence[Round], rate: float, slo_p95_ms: float, rules: CapacityRules
) -> bool:
    """Whether both versions missed the SLO at `rate`: higher rates can tell nothing more."""
    at = [r for r in rounds if r.offered_rps == rate]
    points = [p for v in (CHAMPION, CANDIDATE) for p in curve(at, v)]
    return len(points) == 2 and not any(p.holds(slo_p95_ms, rules.max_error_rate) for p in points)


def brackets(
    rounds: Sequence[Round], slo_p95_ms: float, rules: CapacityRules
) -> dict[str, tuple[float, float]]:
    """Per version: (the last rate it held before its first miss, that first missed rate), read
    from the rounds so far (the ladder's). A version that missed at its lowest rate, or never
    missed, has no bracket: there is no crossing inside the ladder to refine."""
    out = {}
    for version in (CHAMPION, CANDIDATE):
        points = curve(rounds, version)
        for low, high in zip(points, points[1:], strict=False):
            if not low.holds(slo_p95_ms, rules.max_error_rate):
                break  # missed at its lowest rate
            if not high.holds(slo_p95_ms, rules.max_error_rate):
                out[version] = (low.offered_rps, high.offered_rps)
                break
    return out


def refined_plan(rounds: Sequence[Round], slo_p95_ms: float, rules: CapacityRules) -> list[float]:
    """The refined rates, ascending: `refine_rates` inside each version's bracket, both versions'
    (each refined rate is run for both versions, in pairs)."""
    found = brackets(rounds, slo_p95_ms, rules).values()
    return sorted({rate for held, missed in found for rate in rules.refined_rates(held, missed)})


def round_order(pair: int) -> tuple[str, str]:
    """Champion first on even pairs, candidate first on odd ones (ABBA: a linear drift cancels)."""
    return (CHAMPION, CANDIDATE) if pair % 2 == 0 else (CANDIDATE, CHAMPION)


def p95_at(points: Sequence[CurvePoint], rate: float) -> float:
    """The P95 at the offered rate nearest `rate` (the ladder starts at the fleet's peak)."""
    if not points:
        return math.inf
    return min(points, key=lambda p: abs(p.offered_rps - rate)).p95_ms


def judge_capacity(
    rounds: Sequence[Round],
    peak_rps: float,
    slo_p95_ms: float,
    rules: CapacityRules,
    fault: str = "",
) -> GateResult:
    """passed / failed / inconclusive / error for the candidate's capacity against the champion's."""
    thresholds = {
        "slo_p95_ms": slo_p95_ms,
        "tolerance_pct": rules.tolerance_pct,
        "max_error_rate": rules.max_error_rate,
        "peak_rps": peak_rps,
    }

    def verdict(v: Verdict, reason: str, **measured: float) -> GateResult:
        return GateResult(
            gate="capacity",
            verdict=v,
            reason=reason,
            measurements=measured,
            thresholds=thresholds,
            method=METHOD,
        )

    if fault:
        return verdict(Verdict.error, f"capacity check could not run: {fault}")
    champ, cand = curve(rounds, CHAMPION), curve(rounds, CANDIDATE)
    if not champ or not cand:
        return verdict(
            Verdict.inconclusive,
            f"capacity check has no rounds for the {'champion' if not champ else 'candidate'}",
        )
    low_rate = min(p.offered_rps for p in cand)
    first = next(p for p in cand if p.offered_rps == low_rate)
    if first.achieved_rps == 0:
        return verdict(
            Verdict.error,
            f"the candidate answered nothing at {low_rate:.0f} req/s "
            f"({first.error_rate:.0%} errors of {first.requests} requests)",
        )
    t_champ = throughput_at_slo(champ, slo_p95_ms, rules.max_error_rate)
    t_cand = throughput_at_slo(cand, slo_p95_ms, rules.max_error_rate)
    measured, figures = _figures(champ, cand, t_champ, t_cand, peak_rps, slo_p95_ms)
    measured["rounds"] = float(len(rounds))
    decided, text, extra = compare(t_champ, t_cand, rules)
    return verdict(decided, f"{text}: {figures}", **extra, **measured)


def compare(
    t_champ: Throughput, t_cand: Throughput, rules: CapacityRules
) -> tuple[Verdict, str, dict[str, float]]:
    """The verdict on two throughputs at the SLO, its reason's first words, and any extra figure."""
    if t_champ.censored == "below":
        return (
            Verdict.inconclusive,
            "the champion itself misses the SLO at the lowest rate tried",
            {},
        )
    if t_champ.censored == "above" and t_cand.censored == "above":
        return (
            Verdict.passed,
            f"both hold the SLO at every rate tried (up to {t_champ.rps:.0f} req/s)",
            {},
        )
    floor = t_champ.rps * (1 - rules.tolerance_pct / 100)
    within = t_cand.censored == "above" or t_cand.rps >= floor
    if within and t_champ.censored == "above":
        # the champion's figure is a lower bound: the candidate's shortfall is at least
        # 1 - cand / champ, and may be beyond the tolerance
        return (
            Verdict.inconclusive,
            (
                f"the champion held the SLO at every rate tried, up to {t_champ.rps:.0f} req/s "
                f"(max_rate_rps), and the candidate crossed it within {rules.tolerance_pct:g} % "
                "of that: its shortfall cannot be told; raise max_rate_rps"
            ),
            {},
        )
    if within:
        return (
            Verdict.passed,
            f"candidate's capacity within {rules.tolerance_pct:g} % of the champion's",
            {},
        )
    shortfall = (1 - t_cand.rps / t_champ.rps) * 100 if t_champ.rps > 0 else 100.0
    return (
        Verdict.failed,
        (
            f"candidate's throughput at the SLO is {shortfall:.0f} % below the champion's "
            f"(tolerance {rules.tolerance_pct:g} %)"
        ),
        {"shortfall_pct": shortfall},
    )


def _figures(
    champ: Sequence[CurvePoint],
    cand: Sequence[CurvePoint],
    t_champ: Throughput,
    t_cand: Throughput,
    peak_rps: float,
    slo_p95_ms: float,
) -> tuple[dict[str, float], str]:
    """The verdict's measurements, and the sentence every reason ends with."""
    measured = {
        "champion_throughput_rps": t_champ.rps,
        "candidate_throughput_rps": t_cand.rps,
        "champion_p95_at_peak_ms": p95_at(champ, peak_rps),
        "candidate_p95_at_peak_ms": p95_at(cand, peak_rps),
        "requests": float(sum(p.requests for p in [*champ, *cand])),
    }
    figures = (
        f"throughput at P95 <= {slo_p95_ms:g} ms: candidate {t_cand}, champion {t_champ}; "
        f"P95 at the peak {peak_rps:.0f} req/s: "
        f"candidate {measured['candidate_p95_at_peak_ms']:.1f} ms, "
        f"champion {measured['champion_p95_at_peak_ms']:.1f} ms"
    )
    return measured, figures


def anchor_at_peak(gate: CanaryRules, checked: GateResult) -> CanaryRules:
    """`gate` with `peak_p95_ms` from the capacity check (the champion's P95 at the fleet's peak),
    unless the run set it or the check did not measure it; `gate` itself when unchanged."""
    return gate.anchored(checked.measurements.get("champion_p95_at_peak_ms"))

"""The canary plan: before the first step, how many windows each step should need.

From the champion's recent traffic before the release began (its clustered variance of log
latency, its P95 and its 5xx rate, in the stable or baseline slot) and the rate the canary will see, the plan finds for each step the fewest windows after which a
canary equal to its baseline passes (`judge_window`'s rule: latency *and* errors within their
tolerances) with the target power. Errors often set the length: with no 5xx at all the error
interval still narrows only as 1/n (its Agresti-Caffo floor), so showing "within +0.5 pt" takes
some 900 requests per cohort, far more than latency needs. When a step cannot get there within
the rules' maximum windows, the release says so before any traffic moves.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from statistics import NormalDist

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from core.gate.sequential import half_width, mean_log_latency_by_user
from logstore.release_events import ActionVerdict, EventKind
from logstore.slo import CohortSums, RequestRate, query_cohorts, query_request_rate
from relay.settings import Settings
from relay.types import Release
from tasks.canary import record
from tasks.canary_analysis import LOG_STORE_ERRORS, MIN_USERS, CanaryRules, reader

log = logging.getLogger("relay.canary")

# The slots that serve the champion: stable, and during a canary its equal-share baseline.
BASIS_SLOTS = ("stable", "baseline")


@dataclass(frozen=True)
class StepPlan:
    """How long one step should take: windows for an equal canary to pass with the target power."""

    weight: int
    requests_per_window: float  # per cohort (canary, and baseline alike)
    windows: int | None  # None: not within the rules' max windows


@dataclass(frozen=True)
class CanaryPlan:
    """The canary's expected length per step, from recent traffic; `reachable` False warns a person."""

    steps: list[StepPlan]
    window_s: float
    basis: str
    reachable: bool
    summary: str


def windows_needed(
    per_request_variance: float,
    requests_per_window: float,
    tolerance_log: float,
    rules: CanaryRules,
    error_rate: float = 0.0,
) -> int | None:
    """Fewest windows after which a canary equal to its baseline passes with `rules.power`.

    Both of the step's intervals must get below their tolerances: latency's (from the stable
    traffic's per-request variance) and errors' (at the stable traffic's 5xx rate, with the
    judge's Agresti-Caffo floor).
    """
    if requests_per_window <= 0 or not math.isfinite(per_request_variance):
        return None
    z = NormalDist().inv_cdf(rules.power)
    error_tol = rules.error_tolerance_pt / 100

    def clears(interval_variance: float, noise_variance: float, tolerance: float) -> bool:
        """The interval's half-width plus the estimate's own noise at `power` fits the tolerance."""
        h = half_width(interval_variance, tolerance, rules.alpha)
        return h + z * math.sqrt(noise_variance) <= tolerance

    for k in range(1, rules.max_windows + 1):
        n = k * requests_per_window
        if n < rules.min_requests:
            continue
        latency = 2 * per_request_variance / n  # canary and baseline, equal shares
        # errors: the estimate's noise is binomial (none at all without 5xx), but the judge's
        # interval never uses less than the Agresti-Caffo floor
        noise = 2 * error_rate * (1 - error_rate) / n
        adjusted = (error_rate * n + 1) / (n + 2)
        interval = max(2 * adjusted * (1 - adjusted) / n, noise)
        if clears(latency, latency, tolerance_log) and clears(
            interval, noise, max(error_tol, 1e-4)
        ):
            return k
    return None


def plan_canary(
    recent: CohortSums | None,
    rate_rps: float,
    steps: list[int],
    window_s: float,
    rules: CanaryRules,
) -> CanaryPlan:
    """Windows each step should need, from the per-user variance of recent traffic and the rate."""
    if recent is None or recent.answered < rules.min_requests or recent.users < MIN_USERS:
        return CanaryPlan(
            [StepPlan(w, rate_rps * w / 100 * window_s, None) for w in steps],
            window_s,
            "no recent traffic to plan from",
            True,
            "no recent traffic of the champion before this release: each step runs until its "
            "evidence is conclusive, "
            f"at most {rules.max_windows} windows of {window_s:g} s",
        )
    per_request = mean_log_latency_by_user(recent).variance * recent.answered
    tolerance_log = math.log(rules.latency_tolerance(recent.p95_ms))
    error_rate = recent.errors / recent.requests if recent.requests else 0.0
    plans = []
    for w in steps:
        per_window = rate_rps * w / 100 * window_s
        windows = windows_needed(per_request, per_window, tolerance_log, rules, error_rate)
        plans.append(StepPlan(w, per_window, windows))
    reachable = all(p.windows is not None for p in plans)
    parts = [
        f"{p.weight} %: ~{p.windows} window{'s' if p.windows != 1 else ''}"
        if p.windows is not None
        else f"{p.weight} %: not within {rules.max_windows} windows"
        for p in plans
    ]
    total_s = sum((p.windows or rules.max_windows) * window_s for p in plans)
    summary = f"{', '.join(parts)} - about {_duration(total_s)}"
    if not reachable:
        summary += (
            f"; at {rate_rps:.3g} req/s a step marked 'not within' cannot show 'no regression "
            f"beyond x{math.exp(tolerance_log):.2f}' in latency and +{rules.error_tolerance_pt:g} "
            f"pt in errors with {rules.power:.0%} power before its {rules.max_windows} windows "
            "end, and would pause for a person"
        )
    basis = (
        f"{recent.answered:.0f} recent {recent.slot} requests from {recent.users} users, P95 "
        f"{recent.p95_ms:.1f} ms, 5xx {error_rate:.2%}, at {rate_rps:.3g} req/s"
    )
    return CanaryPlan(plans, window_s, basis, reachable, summary)


def _duration(seconds: float) -> str:
    """'40 s' under a minute and a half, '2.5 minutes' above: never 'about 0.0 minutes'."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} minutes"


@task(name="plan-canary", cache_policy=NO_CACHE)
def plan_canary_steps(
    settings: Settings,
    release: Release,
    steps: list[int],
    window_s: float,
    rules: CanaryRules,
    release_started: datetime | None = None,
    champion: str | None = None,
    lookback_minutes: float = 60.0,
    rate_minutes: float = 5.0,
) -> CanaryPlan:
    """Plan the canary from the last hour of the champion's traffic; a markdown artifact shows it.

    The variance comes from the busiest stable or baseline cohort of `champion` (the version the
    canary is compared with) in the hour before the release began (`release_started`): traffic served while this release trained is left out, since where
    training shares the fleet's cores (the embedded setup) its latency is not what the canary
    will see. The rate the canary will see is the fleet's over the last `rate_minutes`, measured
    over the span that traffic covers.
    """
    end = datetime.now(UTC)
    basis_end = min(release_started or end, end)
    try:
        client = reader(settings)
        cohorts = query_cohorts(
            client, basis_end - timedelta(minutes=lookback_minutes), basis_end, BASIS_SLOTS
        )
        current = query_request_rate(client, end - timedelta(minutes=rate_minutes), end)
    except LOG_STORE_ERRORS as exc:  # planning is advice: the gate itself reports a dead store
        log.warning("cannot read recent traffic to plan the canary: %s", exc)
        cohorts, current = [], RequestRate(0, 0.0)
    if champion is not None:  # a version promoted or rolled back within the hour is not the basis
        cohorts = [c for c in cohorts if c.model_version == champion]
    recent = max(cohorts, key=lambda c: c.answered) if cohorts else None
    rate = current.rps
    plan = plan_canary(recent, rate, steps, window_s, rules)
    record(
        settings,
        release,
        EventKind.canary_plan,
        ActionVerdict.reachable if plan.reachable else ActionVerdict.unreachable,
        plan.summary,
        basis=plan.basis,
        steps=[p.__dict__ for p in plan.steps],
    )
    create_markdown_artifact(
        key="canary-plan",
        markdown="\n".join(
            [
                f"# Canary plan for {release.version}",
                "",
                plan.summary,
                "",
                f"Basis: {plan.basis}. Windows of {window_s:g} s; a step ends as soon as it is "
                f"conclusive. Power {rules.power:.0%} for a canary equal to its baseline to pass "
                f"(confidence {rules.confidence:.0%}).",
                "",
                "| weight | requests per window (each cohort) | windows needed |",
                "|---|---|---|",
                *[
                    f"| {p.weight} % | {p.requests_per_window:.0f} | "
                    f"{p.windows if p.windows is not None else 'not within max'} |"
                    for p in plan.steps
                ],
            ]
        ),
        description=plan.summary,
    )
    print(f"canary plan: {plan.summary}")
    return plan

"""The canary plan: before the first step, what each step can decide at the current rate, and when.

From the champion's recent traffic before the release began (its per-user variance of log
latency, the variance of its log P95, its P95 and its 5xx rate, in the stable or baseline slot)
and the rate the canary will see, the plan finds for each step the fewest windows after which a
canary equal to its baseline passes (`judge_window`'s rule: the mean, the P95 *and* the errors
within their tolerances) with the target power. Errors often set the length at low traffic:
with no 5xx at all the error interval still narrows only as 1/n (its Agresti-Caffo floor), so
showing "within +0.5 pt" takes some 900 requests per cohort; the P95 takes a few thousand.

Where traffic is thin, a step that cannot show that within `rules.max_windows` becomes a *guard*
step (`core.gate.step`): it runs until its cohorts have `min_requests` each and passes unless it
sees harm, a failed query or a skewed split. The last step is always full, and may run up to
`rules.plan_max_windows` windows to show equivalence; so an equal release at 50 req/s is decided
without a person. Only when even that is out of reach is the plan unreachable, and the release
asks a person before any traffic moves, saying why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from core.gate.judge import tail_of
from core.gate.quantile import design_effect, log_quantile
from core.gate.rules import MIN_USERS, CanaryRules
from core.gate.sequential import half_width, mean_log_latency_by_user
from core.gate.step import StepLength
from logstore.slo import CohortSums


@dataclass(frozen=True)
class StepPlan:
    """How long one step should take: windows for an equal canary to pass with the target power."""

    weight: int
    requests_per_window: float  # per cohort (canary, and baseline alike)
    windows: int | None  # None: not within the rules' max windows
    guard: bool = False  # too thin to show equivalence in time: harm-only (core.gate.step)
    max_windows: int | None = None  # how long the step may look; None: the rules' max windows

    def length(self, rules: CanaryRules) -> StepLength:
        """What the step loop runs: its window limit and kind.

        A step the plan could not make reachable runs the rules' own windows (a person chose
        to start it): the plan's longer limit is only for a last step it expects to conclude.
        """
        if self.windows is None:
            return StepLength(rules.max_windows)
        return StepLength(self.max_windows or rules.max_windows, self.guard)


@dataclass(frozen=True)
class CanaryPlan:
    """The canary's expected length per step, from recent traffic; `reachable` False warns a person."""

    steps: list[StepPlan]
    window_s: float
    basis: str
    reachable: bool
    summary: str

    def step(self, weight: int) -> StepPlan | None:
        return next((s for s in self.steps if s.weight == weight), None)


@dataclass(frozen=True)
class Noise:
    """Per-request variances the judge will see (log latency mean, log P95), and the 5xx rate."""

    mean: float
    p95: float = 0.0
    error_rate: float = 0.0


def windows_needed(
    per_request_variance: float,
    requests_per_window: float,
    tolerance_log: float,
    rules: CanaryRules,
    error_rate: float = 0.0,
    p95_variance: float = 0.0,
    limit: int | None = None,
) -> int | None:
    """Fewest windows (up to `limit`, default the rules' max) after which an equal canary passes.

    Every interval the judge requires must get below its tolerance with `rules.power`: the
    mean's (from the per-request variance), the P95's (its per-request variance, 0 to leave it
    out) and the errors' (at the 5xx rate, with the judge's Agresti-Caffo floor).
    """
    if requests_per_window <= 0 or not math.isfinite(per_request_variance):
        return None
    z = NormalDist().inv_cdf(rules.power)
    error_tol = max(rules.error_tolerance_pt / 100, 1e-4)

    def clears(interval_variance: float, noise_variance: float, tolerance: float) -> bool:
        """The interval's half-width plus the estimate's own noise at `power` fits the tolerance."""
        h = half_width(interval_variance, tolerance, rules.alpha)
        return h + z * math.sqrt(noise_variance) <= tolerance

    for k in range(1, (limit or rules.max_windows) + 1):
        n = k * requests_per_window
        if n < rules.min_requests:
            continue
        latency = 2 * per_request_variance / n  # canary and baseline, equal shares
        tail = 2 * p95_variance / n
        # errors: the estimate's noise is binomial (none at all without 5xx), but the judge's
        # interval never uses less than the Agresti-Caffo floor
        noise = 2 * error_rate * (1 - error_rate) / n
        adjusted = (error_rate * n + 1) / (n + 2)
        interval = max(2 * adjusted * (1 - adjusted) / n, noise)
        if (
            clears(latency, latency, tolerance_log)
            and (not p95_variance or clears(tail, tail, tolerance_log))
            and clears(interval, noise, error_tol)
        ):
            return k
    return None


def noise_of(recent: CohortSums) -> Noise:
    """The per-request variances of the recent champion traffic, clustered by user."""
    by_user = mean_log_latency_by_user(recent).variance
    n = recent.answered
    mean = recent.log_sum / n
    request_level = max(recent.log_sq / n - mean * mean, 0.0) / n
    p95 = log_quantile(tail_of(recent, 0.95)).variance
    p95 *= design_effect(by_user, request_level)
    errors = recent.errors / recent.requests if recent.requests else 0.0
    return Noise(by_user * n, p95 * n if math.isfinite(p95) else 0.0, errors)


def _step_plan(
    weight: int,
    per_window: float,
    last: bool,
    noise: Noise,
    tolerance_log: float,
    rules: CanaryRules,
) -> StepPlan:
    """Full if it can pass in the rules' windows; else a guard step, or (the last) a longer one."""
    full = windows_needed(noise.mean, per_window, tolerance_log, rules, noise.error_rate, noise.p95)
    cap = max(rules.plan_max_windows, rules.max_windows)
    if full is not None and not last and full > rules.max_windows // 2:
        full = None  # a full early step that runs out of windows pauses: guard it instead
    if full is not None:
        # the last step decides the release: it may look past its expected length, up to the
        # cap, rather than hand an equal candidate to a person because its looks ran unlucky
        return StepPlan(weight, per_window, full, max_windows=cap if last else None)
    if last:
        longer = windows_needed(
            noise.mean, per_window, tolerance_log, rules, noise.error_rate, noise.p95, cap
        )
        return StepPlan(weight, per_window, longer, max_windows=cap)
    if per_window <= 0 or math.ceil(rules.min_requests / per_window) > rules.max_windows:
        return StepPlan(weight, per_window, None)
    # half as many requests again as the judge's minimum, so that a quiet spell at the planned
    # end still leaves a look that compared the cohorts
    to_judge = min(math.ceil(1.5 * rules.min_requests / per_window), rules.max_windows)
    return StepPlan(weight, per_window, to_judge, guard=True, max_windows=to_judge)


def plan_canary(
    recent: CohortSums | None,
    rate_rps: float,
    steps: list[int],
    window_s: float,
    rules: CanaryRules,
) -> CanaryPlan:
    """What each step can decide at `rate_rps` and how long it takes, from recent traffic."""
    if recent is None or recent.answered < rules.min_requests or recent.users < MIN_USERS:
        return _plan_without_basis(rate_rps, steps, window_s, rules)
    noise = noise_of(recent)
    tolerance_log = math.log(rules.latency_tolerance(recent.p95_ms))
    plans = [
        _step_plan(
            w, rate_rps * w / 100 * window_s, i == len(steps) - 1, noise, tolerance_log, rules
        )
        for i, w in enumerate(steps)
    ]
    reachable = all(p.windows is not None for p in plans)
    summary = _summary(plans, rules, window_s)
    if not reachable:
        summary += (
            f"; at {rate_rps:.3g} req/s a step marked 'not within' cannot show 'no regression "
            f"beyond x{math.exp(tolerance_log):.2f}' in mean and P95 latency and "
            f"+{rules.error_tolerance_pt:g} pt in errors with {rules.power:.0%} power (the last "
            f"step within {max(rules.plan_max_windows, rules.max_windows)} windows), or reach "
            f"{rules.min_requests} requests per cohort as a guard step, and would pause for a person"
        )
    basis = (
        f"{recent.answered:.0f} recent {recent.slot} requests from {recent.users} users, P95 "
        f"{recent.p95_ms:.1f} ms, 5xx {noise.error_rate:.2%}, at {rate_rps:.3g} req/s"
    )
    return CanaryPlan(plans, window_s, basis, reachable, summary)


def _plan_without_basis(
    rate_rps: float, steps: list[int], window_s: float, rules: CanaryRules
) -> CanaryPlan:
    """No recent champion traffic to measure noise on: the early steps guard, the last decides.

    Without a basis nothing says how long equivalence takes, so no early step is asked to show
    it; each guards against harm for its 1.5 x `min_requests` (or the rules' max windows when
    the rate is unknown too) and the last runs until conclusive, up to the cap; a last step that
    cannot see `min_requests` per cohort within the cap at this rate makes the plan unreachable.
    """
    cap = max(rules.plan_max_windows, rules.max_windows)
    plans = []
    for i, w in enumerate(steps):
        per_window = rate_rps * w / 100 * window_s
        if i == len(steps) - 1:
            # even with no variance to plan from, a last step that cannot see `min_requests`
            # per cohort within the cap cannot decide: say so before any traffic moves
            enough = per_window > 0 and per_window * cap >= rules.min_requests
            plans.append(StepPlan(w, per_window, cap if enough else None, max_windows=cap))
            continue
        needed = math.ceil(1.5 * rules.min_requests / per_window) if per_window > 0 else None
        windows = min(needed or rules.max_windows, rules.max_windows)
        plans.append(StepPlan(w, per_window, windows, guard=True, max_windows=windows))
    reachable = plans[-1].windows is not None
    summary = (
        "no recent traffic of the champion before this release: "
        + ", ".join(
            f"{p.weight} %: guard step, {p.windows} windows (harm only)"
            if p.guard
            else f"{p.weight} %: until conclusive, at most {p.max_windows} windows"
            for p in plans
        )
        + f" of {window_s:g} s"
    )
    if not reachable:
        summary += (
            f"; at {rate_rps:.3g} req/s the last step cannot reach {rules.min_requests} requests "
            f"per cohort within {cap} windows and would pause for a person"
        )
    return CanaryPlan(plans, window_s, "no recent traffic to plan from", reachable, summary)


def _summary(plans: list[StepPlan], rules: CanaryRules, window_s: float) -> str:
    def one(p: StepPlan) -> str:
        if p.windows is None:
            limit = p.max_windows or rules.max_windows
            return f"{p.weight} %: not within {limit} window{'s' if limit != 1 else ''}"
        plural = "s" if p.windows != 1 else ""
        if p.guard:
            return f"{p.weight} %: guard step, {p.windows} window{plural} (harm only)"
        return f"{p.weight} %: ~{p.windows} window{plural}"

    total_s = sum((p.windows or p.max_windows or rules.max_windows) * window_s for p in plans)
    return f"{', '.join(one(p) for p in plans)} - about {duration(total_s)}"


def duration(seconds: float) -> str:
    """'40 s' under a minute and a half, '2.5 minutes' above: never 'about 0.0 minutes'."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} minutes"

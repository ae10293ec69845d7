"""The canary plan's task shell: read the champion's recent traffic and the rate, plan, record.

What the plan decides (full or guard steps, how many windows, reachable or not) is
`core.gate.plan`; this module reads ClickHouse and writes the release event and the artifact.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from core.gate.plan import CanaryPlan, StepPlan, plan_canary, windows_needed
from logstore.peaks import query_peak_p95
from logstore.release_events import ActionVerdict, EventKind
from logstore.slo import RequestRate, query_cohorts, query_request_rate
from relay.settings import Settings
from relay.types import Release
from tasks.canary import record
from tasks.canary_analysis import LOG_STORE_ERRORS, CanaryRules, reader

__all__ = [
    "CanaryPlan",
    "StepPlan",
    "anchor_at_history_peak",
    "plan_canary",
    "plan_canary_steps",
    "windows_needed",
]

log = logging.getLogger("relay.canary")

# The slots that serve the champion: stable, and during a canary its equal-share baseline.
BASIS_SLOTS = ("stable", "baseline")


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
                "| weight | requests per window (each cohort) | kind | windows needed |",
                "|---|---|---|---|",
                *[
                    f"| {p.weight} % | {p.requests_per_window:.0f} | "
                    f"{'guard (harm only)' if p.guard else 'full'} | "
                    f"{p.windows if p.windows is not None else 'not within max'} |"
                    for p in plan.steps
                ],
            ]
        ),
        description=plan.summary,
    )
    print(f"canary plan: {plan.summary}")
    return plan


@task(name="anchor-gate-at-peak", cache_policy=NO_CACHE)
def anchor_at_history_peak(
    settings: Settings, rules: CanaryRules, champion: str, history_days: float
) -> CanaryRules:
    """`rules` anchored at the champion's P95 in the fleet's busiest ten minutes of the last
    `history_days` (`logstore.peaks.query_peak_p95`), for a release whose capacity check is off.

    `rules` themselves where the run set `peak_p95_ms`, the store cannot be read, or the champion
    answered fewer than `rules.min_requests` requests in every stretch: the step then counts
    `tolerance_ms` against the baseline's P95 during the step, and the log says why.
    """
    if rules.peak_p95_ms is not None:
        return rules
    end = datetime.now(UTC)
    try:
        peak = query_peak_p95(
            reader(settings),
            end - timedelta(days=history_days),
            end,
            champion,
            rules.min_requests,
        )
    except LOG_STORE_ERRORS as exc:
        log.warning("cannot read the champion's P95 at peak, gate not anchored: %s", exc)
        return rules
    if peak is None:
        log.info(
            "gate not anchored: %s answered fewer than %d requests in every ten minutes of the "
            "last %g days; +%g ms counts against the baseline's P95 during each step",
            champion,
            rules.min_requests,
            history_days,
            rules.tolerance_ms,
        )
        return rules
    anchored = rules.anchored(peak.p95_ms)
    print(
        f"gate anchored at the champion's P95 at peak: {anchored.peak_p95_ms:g} ms over "
        f"{peak.requests} of its requests in the fleet's busiest ten minutes of the last "
        f"{history_days:g} days ({peak.fleet_requests} served, from {peak.start:%Y-%m-%d %H:%M} UTC)"
    )
    return anchored

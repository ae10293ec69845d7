"""The impact report assembled: the finding, its headline, caveats and notes, for each case.

`analyse_impact` picks one of three builders: no sessions joined (`no_data_report`), too few or
too uniform sessions to estimate anything (`insufficient_data_report`), or the full analysis
(`full_report`). Every report carries the assumptions it rests on, and the finding says plainly
when the data cannot support a conclusion (too few sessions, a failed refutation, estimators
that disagree). Pure: the clock is an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pandas as pd

from core.impact.estimation import (
    PreparedSessions,
    bin_by_latency,
    causal_graph,
    correlate,
    estimate_causal_effect,
    fit_ols,
    prepare_sessions,
)
from core.impact.translation import compare_slots, translate_to_business
from core.impact.types import (
    MEDIATOR,
    OUTCOME,
    TREATMENT,
    BusinessTranslation,
    EffectEstimate,
    ImpactData,
    ImpactFinding,
    ImpactOptions,
    ImpactReport,
    Refutation,
)
from logstore.impact import JoinCoverage

ASSUMPTIONS: dict[str, list[str]] = {
    "Pearson correlation": [
        "Measures linear association only; it is not an effect and is confounded by device type.",
        "p-value tests r = 0 assuming independent sessions.",
    ],
    "OLS gmv ~ latency + user_age + device_type": [
        "GMV is linear and additive in latency, age and device; one effect per ms for everyone.",
        "Device type and age are the only common causes of latency and GMV (no hidden confounder).",
        "Intervals are cluster-robust by user (sessions of one user may be correlated, "
        "GMV variance differs between sessions).",
    ],
    "DoWhy back-door (linear regression)": [
        "The causal graph shown is correct and complete: device_type is the only confounder.",
        "Positivity: every device type is seen across the range of latencies.",
        "Linear outcome model. The point estimate equals the OLS one, so the interval quoted is "
        "the OLS cluster-robust one; DoWhy's own interval assumes equal GMV variance in every "
        "session and is shown beside it for reference.",
    ],
    "DoWhy front-door (two-stage regression via session length)": [
        "Latency affects GMV only through session length (full mediation).",
        "Nothing unobserved drives both latency and session length.",
        "Given latency, nothing unobserved drives both session length and GMV.",
        "Linear stages; the interval is the delta method over both stages' robust errors.",
        "These are different assumptions from the back-door ones: agreement is evidence, "
        "disagreement means at least one set is wrong.",
    ],
    "Refutations": [
        "Placebo: replacing latency by a permutation of itself must give an effect near 0.",
        "Random common cause: adding an independent random covariate must not move the estimate.",
        "Data subset: re-estimating on random subsets must give about the same estimate.",
        "Each passes when its re-estimate lies within the 95 % margin (1.96 standard errors) of "
        "the value a sound analysis would give; a pass cannot prove the graph right.",
    ],
    "Business translation": [
        "The per-ms effect holds across the observed latency range (no extrapolation beyond it).",
        "Sessions per day = sessions that made a request in the window / window length in days.",
        "GMV in the currency units logged in user_sessions.",
    ],
    "Canary vs stable": [
        "Sessions are assigned to slots at random, so the latency difference is caused by the "
        "version; a session belongs to the slot that served most of its requests.",
        "The implied GMV effect multiplies that difference by the causal per-ms effect, as if "
        "the canary served all traffic; the measured GMV difference is the direct experiment "
        "and is usually too noisy to read on its own.",
    ],
}


def decide_finding(
    causal: EffectEstimate, frontdoor: EffectEstimate | None, refutations: Sequence[Refutation]
) -> ImpactFinding:
    """The strongest claim the estimates support."""
    if any(not r.passed for r in refutations):
        return ImpactFinding.refuted
    if frontdoor is not None and (
        frontdoor.ci_high < causal.ci_low or causal.ci_high < frontdoor.ci_low
    ):
        return ImpactFinding.estimators_disagree
    return (
        ImpactFinding.effect_detected
        if causal.excludes_zero()
        else ImpactFinding.no_detectable_effect
    )


def _money(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"


def headline_for(
    finding: ImpactFinding, reason: str, translation: BusinessTranslation | None
) -> str:
    """One sentence an analyst can quote, with units and the interval."""
    if translation is None:
        return reason
    per100 = translation.gmv_per_day_per_100ms
    interval = f"95 % CI {_money(100 * translation.ci_low)} to {_money(100 * translation.ci_high)}"
    claim = (
        f"+100 ms of mean latency changes GMV by {_money(per100)} per day ({interval}) at "
        f"{translation.sessions_per_day:,.0f} sessions/day"
    )
    if finding is ImpactFinding.effect_detected:
        return claim + "."
    if finding is ImpactFinding.no_detectable_effect:
        return (
            f"No detectable effect of latency on GMV: the data cannot tell the effect from zero "
            f"({claim})."
        )
    return f"Not a trustworthy estimate ({reason}): {claim}."


def analyse_impact(data: ImpactData, options: ImpactOptions, now: datetime) -> ImpactReport:
    """Every analysis of the issue over one window, with the finding and its caveats.

    `now` stamps the report (`generated_at`, and so its stored id): the caller's clock, so the
    core never reads one.
    """
    generated_at = now
    if data.sessions.empty:
        return no_data_report(data, generated_at)
    prepared = prepare_sessions(data.sessions)
    shortfall = insufficiency(prepared.frame, options)
    if shortfall is not None:
        return insufficient_data_report(data, prepared, options, generated_at, shortfall)
    return full_report(data, prepared, options, generated_at)


def insufficiency(frame: pd.DataFrame, options: ImpactOptions) -> str | None:
    """Why these sessions cannot support an estimate, or None when they can."""
    if len(frame) < options.min_sessions:
        return f"only {len(frame)} usable sessions (the analysis needs at least {options.min_sessions})"
    if frame[TREATMENT].nunique() < 2 or float(frame[TREATMENT].std()) == 0.0:
        return "every session saw the same latency, so its effect cannot be estimated"
    return None


def no_data_report(data: ImpactData, generated_at: datetime) -> ImpactReport:
    """The report when no session in the window joins to inference requests: nothing to analyse."""
    why = _why_empty(data.coverage, data.versions)
    return ImpactReport(
        **_report_base(data, generated_at),
        finding=ImpactFinding.no_data,
        caveats=coverage_caveats(data.coverage),
        headline=f"No data: no session in {data.window} has both a user_sessions row and "
        f"inference requests{why}. Nothing can be concluded.",
    )


def insufficient_data_report(
    data: ImpactData,
    prepared: PreparedSessions,
    options: ImpactOptions,
    generated_at: datetime,
    reason: str,
) -> ImpactReport:
    """The report with descriptive figures only, saying why nothing causal can be concluded."""
    return ImpactReport(
        **_report_base(data, generated_at),
        **_descriptive(prepared, options),
        finding=ImpactFinding.insufficient_data,
        caveats=coverage_caveats(data.coverage),
        notes=_session_notes(prepared),
        headline=f"Insufficient data: {reason}. Nothing causal can be concluded.",
    )


def full_report(
    data: ImpactData, prepared: PreparedSessions, options: ImpactOptions, generated_at: datetime
) -> ImpactReport:
    """The report with every estimate, the refutations, the business translation and the slots."""
    frame, covariates, adjustment = prepared.frame, prepared.covariates, prepared.adjustment
    naive = fit_ols(frame, OUTCOME, [], "naive", "Naive (GMV on latency alone)")
    ols = fit_ols(frame, OUTCOME, adjustment, "ols", "OLS adjusted for " + _listed(covariates))
    length = fit_ols(frame, MEDIATOR, adjustment, "ols_session_length", "OLS session length")
    causal = estimate_causal_effect(prepared, ols, options)
    estimates = [naive, ols, causal.backdoor] + ([causal.frontdoor] if causal.frontdoor else [])

    sessions_per_day, gmv_per_day = observed_traffic(data, frame)
    translation = translate_to_business(causal.backdoor, sessions_per_day, gmv_per_day)
    slots = compare_slots(frame, causal.backdoor, sessions_per_day, options.min_sessions_per_slot)

    finding = decide_finding(causal.backdoor, causal.frontdoor, causal.refutations)
    notes = [
        *_session_notes(prepared),
        *causal.notes,
        *_cross_check_notes(naive, causal.backdoor, causal.frontdoor, covariates),
    ]
    return ImpactReport(
        **_report_base(data, generated_at),
        **_descriptive(prepared, options),
        finding=finding,
        headline=headline_for(finding, _finding_reason(finding, causal.refutations), translation),
        caveats=coverage_caveats(data.coverage) + _finding_caveats(finding, causal.refutations),
        notes=notes,
        estimates=estimates,
        session_length_estimate=length,
        refutations=causal.refutations,
        identification=causal.identification,
        translation=translation,
        slots=slots,
    )


def observed_traffic(data: ImpactData, frame: pd.DataFrame) -> tuple[float, float]:
    """Sessions per day and GMV per day in the window, counting requesting sessions not analysed."""
    coverage, days = data.coverage, data.window.days
    requesting = max(coverage.sessions - coverage.sessions_without_requests, len(frame))
    sessions_per_day = requesting / days
    gmv_per_day = float(frame[OUTCOME].sum()) / days * requesting / len(frame)
    return sessions_per_day, gmv_per_day


def _report_base(data: ImpactData, generated_at: datetime) -> dict[str, Any]:
    """The fields every report has, whatever the case: window, coverage, latency summaries."""
    coverage = data.coverage
    return {
        "window": data.window,
        "versions": list(data.versions),
        "generated_at": generated_at,
        "assumptions": ASSUMPTIONS,
        "coverage": {
            "session_rows": coverage.session_rows,
            "sessions": coverage.sessions,
            "duplicate_session_rows": coverage.duplicate_session_rows,
            "sessions_without_requests": coverage.sessions_without_requests,
            "requests": coverage.requests,
            "requests_without_session": coverage.requests_without_session,
            "unknown_session_ids": coverage.unknown_session_ids,
            "sessions_joined": len(data.sessions),
        },
        "latency_profile": data.latency_profile.to_dict(orient="records"),
        "latency_histogram": data.latency_histogram.to_dict(orient="records"),
        "histogram_bin_ms": data.histogram_bin_ms,
    }


def _descriptive(prepared: PreparedSessions, options: ImpactOptions) -> dict[str, Any]:
    """The fields shown whenever there are sessions: graph, latency bins, correlations."""
    frame, covariates = prepared.frame, prepared.covariates
    return {
        "sessions": len(frame),
        "covariates": covariates,
        "graph_edges": causal_graph(covariates),
        "gmv_by_latency": bin_by_latency(frame, OUTCOME, options.latency_bins),
        "length_by_latency": bin_by_latency(frame, MEDIATOR, options.latency_bins),
        "correlations": [
            c
            for c in (correlate(frame, TREATMENT, OUTCOME), correlate(frame, TREATMENT, MEDIATOR))
            if c is not None
        ],
    }


def _session_notes(prepared: PreparedSessions) -> list[str]:
    notes = list(prepared.notes)
    frame = prepared.frame
    mixed = int(pd.to_numeric(frame["mixed_versions"]).sum()) if "mixed_versions" in frame else 0
    if mixed:
        notes.append(
            f"{mixed:,} sessions were served by more than one model version; each counts for the "
            "version (and slot) that served the majority of its requests."
        )
    return notes


def _failed_refutations(refutations: Sequence[Refutation]) -> str:
    return ", ".join(r.label for r in refutations if not r.passed)


def _finding_reason(finding: ImpactFinding, refutations: Sequence[Refutation]) -> str:
    """Why the finding is not a plain estimate (empty when it is one)."""
    if finding is ImpactFinding.refuted:
        return "refutation failed: " + _failed_refutations(refutations)
    if finding is ImpactFinding.estimators_disagree:
        return "the back-door and front-door intervals do not overlap"
    return ""


def _finding_caveats(finding: ImpactFinding, refutations: Sequence[Refutation]) -> list[str]:
    if finding is ImpactFinding.refuted:
        return [
            f"A refutation failed ({_failed_refutations(refutations)}): the "
            "causal estimate should not be used until the cause is understood."
        ]
    if finding is ImpactFinding.estimators_disagree:
        return [
            "The back-door and front-door estimates disagree: at least one of their "
            "assumption sets is wrong (hidden confounding, or latency acting on GMV "
            "other than through session length)."
        ]
    return []


def _cross_check_notes(
    naive: EffectEstimate,
    backdoor: EffectEstimate,
    frontdoor: EffectEstimate | None,
    covariates: Sequence[str],
) -> list[str]:
    """What the naive and front-door estimates say about the back-door one, when it matters."""
    notes = []
    if not naive.covers(backdoor.value):
        notes.append(
            f"The naive slope ({naive.value:.4g} GMV/ms, 95 % CI {naive.ci_low:.4g} to "
            f"{naive.ci_high:.4g}) excludes the adjusted estimate ({backdoor.value:.4g}): "
            f"the raw correlation is confounded (adjusted for: {_listed(covariates)})."
        )
    if frontdoor is not None and frontdoor.excludes_zero() != backdoor.excludes_zero():
        notes.append(
            f"The front-door estimate ({frontdoor.value:.4g}, 95 % CI {frontdoor.ci_low:.4g} to "
            f"{frontdoor.ci_high:.4g}) {'excludes' if frontdoor.excludes_zero() else 'covers'} "
            "zero while the back-door one does not; the headline rests on the back-door estimate "
            "because full mediation by session length is the stronger assumption."
        )
    return notes


def _listed(covariates: Sequence[str]) -> str:
    return ", ".join(covariates) if covariates else "nothing (no covariate varies)"


def coverage_caveats(coverage: JoinCoverage) -> list[str]:
    """What the join of sessions and requests left out, as caveats to read first."""
    caveats = []
    if coverage.sessions_without_requests:
        caveats.append(
            f"{coverage.sessions_without_requests:,} of {coverage.sessions:,} sessions logged no "
            "inference request (no latency to attribute): excluded from the models."
        )
    if coverage.requests_without_session:
        caveats.append(
            f"{coverage.requests_without_session:,} of {coverage.requests:,} requests "
            f"({coverage.unknown_session_ids:,} session ids) have no user_sessions row: excluded."
        )
    if coverage.duplicate_session_rows:
        caveats.append(
            f"{coverage.duplicate_session_rows:,} duplicate user_sessions rows: one row per "
            "session id was used."
        )
    return caveats


def _why_empty(coverage: JoinCoverage, versions: Sequence[str]) -> str:
    if coverage.sessions == 0 and coverage.requests == 0:
        return " (the window holds no sessions and no requests)"
    if coverage.sessions == 0:
        return f" (no user_sessions start in it; {coverage.requests:,} requests have no session)"
    if coverage.requests == 0:
        return f" ({coverage.sessions:,} sessions but no inference requests)"
    if versions:
        return f" for versions {', '.join(versions)}"
    return ""

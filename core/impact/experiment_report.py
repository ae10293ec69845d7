"""The per-release report's experiment section, beside its latency → GMV analysis.

The latency analysis says what the canary's latency difference should have cost in GMV; the
experiment measures what the candidate did to GMV, by every route (latency, ranking quality,
anything). Where their intervals do not overlap, the section says they disagree and what that
means, rather than leaving two numbers side by side.
"""

from __future__ import annotations

import html

from core.impact.experiment_types import ExperimentFinding, ReleaseExperiment
from core.impact.types import ImpactReport


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:+.2f} %"


def latency_implied_gmv(report: ImpactReport) -> tuple[float, float, float] | None:
    """The latency analysis' implied relative GMV change per session of the canary (and CI)."""
    slots, translation = report.slots, report.translation
    if slots is None or slots.implied_gmv_per_session is None or translation is None:
        return None
    if slots.implied_gmv_per_session_ci is None or translation.sessions_per_day <= 0:
        return None
    mean = translation.gmv_per_day / translation.sessions_per_day
    if mean <= 0:
        return None
    low, high = slots.implied_gmv_per_session_ci
    return slots.implied_gmv_per_session / mean, low / mean, high / mean


def compare_with_latency(report: ImpactReport, experiment: ReleaseExperiment) -> str:
    """One sentence: do the latency → GMV analysis and the experiment agree on GMV?"""
    implied = latency_implied_gmv(report)
    gmv = experiment.metric("gmv_per_user")
    if implied is None:
        return "The latency → GMV analysis gives no implied GMV change to compare with."
    if experiment.finding is not ExperimentFinding.effect_detected and (
        experiment.finding is not ExperimentFinding.no_detectable_effect
    ):
        return "No valid experiment to compare the latency → GMV analysis with."
    if gmv is None or not gmv.measured or gmv.relative_ci_low is None:
        return "The experiment did not measure GMV, so there is nothing to compare."
    value, low, high = implied
    overlap = gmv.relative_ci_low <= high and low <= (gmv.relative_ci_high or gmv.relative_ci_low)
    both = (
        f"the latency → GMV analysis implies {_pct(value)} GMV per session from the canary's "
        f"latency difference ({_pct(low)} to {_pct(high)}); the experiment measured "
        f"{_pct(gmv.relative)} GMV per user ({_pct(gmv.relative_ci_low)} to "
        f"{_pct(gmv.relative_ci_high)})"
    )
    if overlap:
        return f"They agree: {both}."
    return (
        f"They disagree: {both}. The intervals do not overlap, so the candidate changed GMV by "
        "more than its latency explains: through what it ranked (or another route the latency "
        "analysis cannot see). Trust the experiment for this release's effect."
    )


def experiment_section_html(
    report: ImpactReport, experiments: list[ReleaseExperiment], version: str | None
) -> str:
    """The section as HTML: finding, per-metric table, statements, agreement with latency."""
    esc = html.escape
    if not experiments:
        what = f"version {version}" if version else "this report"
        return (
            "<section id='experiment'><h2>Experiment: canary vs baseline</h2>"
            f"<p>No experiment: none is recorded for {esc(what)}.</p></section>"
        )
    parts = ["<section id='experiment'><h2>Experiment: canary vs baseline</h2>"]
    for e in sorted(experiments, key=lambda x: x.generated_at):
        parts.append(f"<p class='finding'><b>{esc(e.headline)}</b></p>")
        if e.metrics:
            rows = "".join(
                f"<tr><td>{esc(m.label)}</td><td>{_num(m.baseline_mean)}</td>"
                f"<td>{_num(m.canary_mean)}</td><td>{_pct(m.relative)}</td>"
                f"<td>{_pct(m.relative_ci_low)} to {_pct(m.relative_ci_high)}</td>"
                f"<td>±{_pct(m.relative_mde)[1:]}</td>"
                f"<td>{'' if m.variance_reduction is None else f'{m.variance_reduction:.0%}'}</td>"
                f"<td>{'detected' if m.detected else ('not measured' if not m.measured else '')}</td></tr>"
                for m in e.metrics
            )
            parts.append(
                "<table><tr><th>metric</th><th>baseline</th><th>canary</th><th>effect</th>"
                "<th>95 % interval</th><th>MDE (80 % power)</th><th>CUPED variance removed</th>"
                f"<th></th></tr>{rows}</table>"
            )
        parts.append("<ul>" + "".join(f"<li>{esc(s)}</li>" for s in e.statements) + "</ul>")
        if e.finding is not ExperimentFinding.no_experiment:
            parts.append(f"<p class='agreement'>{esc(compare_with_latency(report, e))}</p>")
        for a in e.assumptions:
            parts.append(f"<p><i>{esc(a)}</i></p>")
        parts.append(f"<p><small>Method: {esc(e.method)}</small></p>")
    parts.append("</section>")
    return "".join(parts)


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def with_experiment_section(
    page: str, report: ImpactReport, experiments: list[ReleaseExperiment], version: str | None
) -> str:
    """The rendered report with the experiment section inserted before its closing body tag."""
    section = experiment_section_html(report, experiments, version)
    marker = page.rfind("</body>")
    return page[:marker] + section + page[marker:] if marker >= 0 else page + section

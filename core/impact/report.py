"""Renderings of an `ImpactReport`: self-contained HTML, the JSON of every figure, markdown.

The figures, as data and as PNG, are built in `core.impact.figures`; the HTML embeds them and
the JSON carries their data.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from core.impact.figures import build_figures, draw_figure, json_safe
from core.impact.types import (
    ImpactFinding,
    ImpactReport,
    StoredImpactReport,
)

_FINDING_TEXT = {
    ImpactFinding.effect_detected: ("Effect detected", "#1f6feb"),
    ImpactFinding.no_detectable_effect: ("No detectable effect", "#57606a"),
    ImpactFinding.estimators_disagree: ("Estimators disagree — do not use", "#bf8700"),
    ImpactFinding.refuted: ("Refutation failed — do not use", "#bf8700"),
    ImpactFinding.insufficient_data: ("Insufficient data", "#bf8700"),
    ImpactFinding.no_data: ("No data", "#cf222e"),
}


def _num(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if value != 0 and abs(value) < 1e-3:  # p-values and tiny effects
        return f"{value:.{digits - 1}e}"
    return f"{value:,.{digits}g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _ci(low: float | None, high: float | None, digits: int = 4) -> str:
    return f"[{_num(low, digits)}, {_num(high, digits)}]"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _list(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:980px;margin:2em auto;
color:#1f2328;line-height:1.45;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}
.meta{color:#57606a;font-size:.9em} .banner{padding:.8em 1em;border-radius:6px;color:#fff;margin:1em 0}
.banner b{font-size:1.1em} table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
td,th{border:1px solid #d0d7de;padding:.3em .6em;text-align:left} th{background:#f6f8fa}
img{max-width:100%;margin:.5em 0} pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:.8em}
.pass{color:#1a7f37;font-weight:600} .fail{color:#cf222e;font-weight:600}
"""


def render_html(report: ImpactReport) -> str:
    """The report as one self-contained HTML page (plots embedded as base64 PNG)."""
    figures = build_figures(report)
    parts = [
        *_header(report),
        *_data_section(report, figures),
        *_effect_section(report, figures),
        *_translation_section(report),
    ]
    if report.slots is not None:
        parts += ["<h2>This release: canary vs stable</h2>", _slots_html(report)]
        if "canary_vs_stable" in figures:
            parts.append(_img("canary_vs_stable", figures["canary_vs_stable"]))
    if report.notes:
        parts += ["<h2>Notes</h2>", _list(report.notes)]
    parts.append("<h2>Assumptions</h2>")
    for name, items in report.assumptions.items():
        parts += [f"<h3>{html.escape(name)}</h3>", _list(items)]
    parts.append("</body></html>")
    return "\n".join(parts)


def _header(report: ImpactReport) -> list[str]:
    """The page's head, title, window and finding banner, and the caveats to read first."""
    title, color = _FINDING_TEXT[report.finding]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>Relay impact report: latency → GMV</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>What latency costs in GMV</h1>",
        f"<p class='meta'>Window {html.escape(str(report.window))} · versions "
        f"{html.escape(', '.join(report.versions) or 'all')} · {report.sessions:,} sessions analysed"
        f" · generated {html.escape(report.generated_at.isoformat())}</p>",
        f"<div class='banner' style='background:{color}'><b>{html.escape(title)}</b><br>"
        f"{html.escape(report.headline)}</div>",
    ]
    if report.caveats:
        parts += ["<h2>Read this first</h2>", _list(report.caveats)]
    return parts


def _data_section(report: ImpactReport, figures: dict[str, dict[str, Any]]) -> list[str]:
    """Coverage, the latency profile by version and slot, and the descriptive figures."""
    parts = ["<h2>Data</h2>", _coverage_table(report)]
    if report.latency_profile:
        headers = ["version", "slot", "requests", "mean ms", "p50 ms", "p95 ms", "p99 ms"]
        rows = [
            [str(p["model_version"]), str(p["slot"]), f"{p['requests']:,}"]
            + [_num(p[key]) for key in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")]
            for p in report.latency_profile
        ]
        parts.append(_table(headers, rows))
    for name in ("latency_by_version", "gmv_by_latency", "session_length_by_latency"):
        if name in figures:
            parts.append(_img(name, figures[name]))
    if report.correlations:
        parts += [
            "<h2>Correlation (not causation)</h2>",
            _table(
                ["latency vs", "Pearson r", "95 % CI", "p-value", "sessions"],
                [
                    [c.y, _num(c.r, 3), _ci(c.ci_low, c.ci_high, 3), _num(c.p_value, 3), f"{c.n:,}"]
                    for c in report.correlations
                ],
            ),
        ]
    return parts


def _effect_section(report: ImpactReport, figures: dict[str, dict[str, Any]]) -> list[str]:
    """The estimates of latency's effect, the causal graph, and the refutations."""
    parts: list[str] = []
    if report.estimates:
        estimates = [(e.label, e) for e in report.estimates]
        if report.session_length_estimate is not None:
            e = report.session_length_estimate
            estimates.append((e.label + " (s per ms)", e))
        rows = [
            [label, _num(e.value), _ci(e.ci_low, e.ci_high), _num(e.p_value, 3), e.interval_method]
            for label, e in estimates
        ]
        parts += [
            "<h2>Effect of latency on GMV</h2>",
            "<p>GMV per session per +1 ms of the session's mean request latency.</p>",
            _table(["estimate", "value", "95 % CI", "p-value", "interval"], rows),
            _img("effect_estimates", figures["effect_estimates"]),
        ]
    if report.graph_edges:
        parts += [
            "<h3>Causal graph and identification</h3>",
            "<p>" + html.escape(", ".join(f"{a} → {b}" for a, b in report.graph_edges)) + "</p>",
            f"<details><summary>DoWhy identification</summary><pre>"
            f"{html.escape(report.identification)}</pre></details>",
        ]
    if report.refutations:
        parts += ["<h2>Refutations</h2>", _refutation_table(report)]
        parts.append(_img("refutations", figures["refutations"]))
    return parts


def _translation_section(report: ImpactReport) -> list[str]:
    """GMV per day per ms (and per 100 ms) at the observed traffic, with intervals."""
    t = report.translation
    if t is None:
        return []
    return [
        "<h2>Business translation</h2>",
        _table(
            ["quantity", "value", "95 % CI"],
            [
                ["sessions per day (observed)", f"{t.sessions_per_day:,.0f}", ""],
                ["GMV per day (observed)", _num(t.gmv_per_day), ""],
                ["GMV per day per +1 ms", _num(t.gmv_per_day_per_ms), _ci(t.ci_low, t.ci_high)],
                [
                    "GMV per day per +100 ms",
                    _num(t.gmv_per_day_per_100ms),
                    _ci(100 * t.ci_low, 100 * t.ci_high),
                ],
            ],
        ),
    ]


def _img(name: str, spec: dict[str, Any]) -> str:
    return (
        f"<figure><img alt='{html.escape(spec['title'])}' "
        f"src='data:image/png;base64,{draw_figure(name, spec)}'></figure>"
    )


def _coverage_table(report: ImpactReport) -> str:
    labels = {
        "sessions": "sessions starting in the window",
        "sessions_without_requests": "… of which logged no request",
        "duplicate_session_rows": "duplicate user_sessions rows",
        "requests": "requests in the window (all versions)",
        "requests_without_session": "… of which have no session",
        "unknown_session_ids": "… distinct unknown session ids",
        "sessions_joined": "sessions joined (after the version filter)",
    }
    rows = [[label, f"{report.coverage.get(k, 0):,}"] for k, label in labels.items()]
    rows.append(["sessions analysed (complete rows)", f"{report.sessions:,}"])
    return _table(["count", "value"], rows)


def _refutation_table(report: ImpactReport) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(r.label)}</td><td>{_num(r.new_effect)}</td>"
        f"<td>{_num(r.expected)} ± {_num(r.tolerance)}</td>"
        f"<td>{_num(r.dowhy_p_value, 3)}</td><td>{r.simulations} × {r.sessions:,}</td>"
        f"<td class='{'pass' if r.passed else 'fail'}'>{'pass' if r.passed else 'FAIL'}</td></tr>"
        for r in report.refutations
    )
    head = (
        "<tr><th>refutation</th><th>re-estimate</th><th>accepted range</th>"
        "<th>DoWhy p-value</th><th>simulations × sessions</th><th>result</th></tr>"
    )
    return f"<table><thead>{head}</thead><tbody>{rows}</tbody></table>"


def _slots_html(report: ImpactReport) -> str:
    s = report.slots
    assert s is not None
    if not s.available:
        return f"<p>Not available: {html.escape(s.reason)}.</p>"
    rows = [
        ["sessions (stable / canary)", f"{s.stable_sessions:,} / {s.canary_sessions:,}", ""],
        ["versions (stable / canary)", f"{s.stable_version} / {s.canary_version}", ""],
        [
            "mean latency (stable / canary), ms",
            f"{_num(s.stable_latency_ms)} / {_num(s.canary_latency_ms)}",
            "",
        ],
        *(
            [label, _num(value), _ci(*(interval or (None, None)))]
            for label, value, interval in (
                ("latency difference, ms", s.latency_diff_ms, s.latency_diff_ci),
                (
                    "implied GMV per session",
                    s.implied_gmv_per_session,
                    s.implied_gmv_per_session_ci,
                ),
                (
                    "implied GMV per day at full traffic",
                    s.implied_gmv_per_day,
                    s.implied_gmv_per_day_ci,
                ),
                (
                    "measured GMV per session difference",
                    s.measured_gmv_diff,
                    s.measured_gmv_diff_ci,
                ),
            )
        ),
    ]
    note = f"<p>{html.escape(s.reason)}</p>" if s.reason else ""
    return _table(["canary − stable", "value", "95 % CI"], rows) + note


def render_json(report: ImpactReport) -> str:
    """The report's numbers and the data of every figure, as strict JSON."""
    document = {"report": report.model_dump(mode="json"), "figures": build_figures(report)}
    return json.dumps(json_safe(document), indent=2, allow_nan=False)


def render_markdown(report: ImpactReport, stored: StoredImpactReport) -> str:
    """The Prefect artifact: headline numbers with units and intervals, and links."""
    title, _ = _FINDING_TEXT[report.finding]
    lines = [
        f"# Latency → GMV: {title}",
        "",
        report.headline,
        "",
        f"Window {report.window} · versions {', '.join(report.versions) or 'all'} · "
        f"{report.sessions:,} sessions analysed",
        "",
    ]
    if report.estimates:
        lines += ["| estimate (GMV per session per ms) | value | 95 % CI |", "|---|---|---|"]
        lines += [
            f"| {e.label} | {_num(e.value)} | {_ci(e.ci_low, e.ci_high)} |"
            for e in report.estimates
        ]
        lines.append("")
    if report.translation is not None:
        t = report.translation
        lines.append(
            f"- **GMV per day per +100 ms**: {_num(t.gmv_per_day_per_100ms)} "
            f"(95 % CI {_ci(100 * t.ci_low, 100 * t.ci_high)}) at {t.sessions_per_day:,.0f} "
            "sessions/day"
        )
    if report.slots is not None and report.slots.available:
        s = report.slots
        lines.append(
            f"- **Canary − stable latency**: {_num(s.latency_diff_ms)} ms "
            f"{_ci(*(s.latency_diff_ci or (None, None)))} → implied "
            f"{_num(s.implied_gmv_per_day)} GMV/day {_ci(*(s.implied_gmv_per_day_ci or (None, None)))}"
        )
    elif report.slots is not None:
        lines.append(f"- **Canary vs stable**: not available ({report.slots.reason})")
    if report.refutations:
        lines.append(
            "- **Refutations**: "
            + ", ".join(f"{r.key} {'pass' if r.passed else 'FAIL'}" for r in report.refutations)
        )
    if report.caveats:
        lines += ["", "**Caveats**"] + [f"- {c}" for c in report.caveats]
    lines += [
        "",
        f"[Full report (HTML)]({stored.html_url}) · [figures and numbers (JSON)]({stored.json_url})"
        f" · record `{stored.record_key}`",
    ]
    return "\n".join(lines)

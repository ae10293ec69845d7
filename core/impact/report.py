"""Renderings of an `ImpactReport`: self-contained HTML, the JSON of every figure, markdown.

Each figure is first described as plain data (`build_figures`); the PNG embedded in the HTML is
drawn from exactly that data, and the JSON carries it, so every plotted number can be checked.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Any

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
_COLORS = ("#1f6feb", "#d1242f", "#2da44e", "#8250df", "#bf8700", "#57606a")


def _finite(value: Any) -> Any:
    """The value with NaN and infinities replaced by None, so the JSON stays strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# -- figures as data -----------------------------------------------------------------------------
def build_figures(report: ImpactReport) -> dict[str, dict[str, Any]]:
    """The data of every figure the report draws, keyed by figure name (absent when empty)."""
    figures: dict[str, dict[str, Any]] = {}
    if report.latency_histogram:
        series: dict[str, dict[str, list[float]]] = {}
        totals: dict[str, int] = {}
        for row in report.latency_histogram:
            totals[row["model_version"]] = totals.get(row["model_version"], 0) + row["requests"]
        for row in report.latency_histogram:
            entry = series.setdefault(row["model_version"], {"bin_start_ms": [], "share": []})
            entry["bin_start_ms"].append(row["bin_start_ms"])
            entry["share"].append(row["requests"] / totals[row["model_version"]])
        figures["latency_by_version"] = {
            "title": "Request latency by model version",
            "x_label": "request latency (ms); the last bin holds everything above it",
            "y_label": "share of the version's requests",
            "bin_ms": report.histogram_bin_ms,
            "series": [{"version": v, **s, "requests": totals[v]} for v, s in series.items()],
            "quantiles": report.latency_profile,
        }
    for key, bins, label in (
        ("gmv_by_latency", report.gmv_by_latency, "GMV per session"),
        ("session_length_by_latency", report.length_by_latency, "session length (s)"),
    ):
        if bins:
            figures[key] = {
                "title": f"{label} against session mean latency (quantile bins, 95 % CI)",
                "x_label": "session mean latency (ms)",
                "y_label": label,
                "bins": [b.model_dump() for b in bins],
            }
    if report.estimates:
        figures["effect_estimates"] = {
            "title": "Effect of +1 ms mean latency on GMV per session (95 % CI)",
            "x_label": "GMV per session per ms",
            "estimates": [
                {
                    "key": e.key,
                    "label": e.label,
                    "value": e.value,
                    "ci_low": e.ci_low,
                    "ci_high": e.ci_high,
                    "interval_method": e.interval_method,
                }
                for e in report.estimates
            ],
        }
    if report.refutations:
        figures["refutations"] = {
            "title": "Refutations of the back-door estimate: re-estimate vs expected ± tolerance",
            "x_label": "GMV per session per ms",
            "refutations": [r.model_dump() for r in report.refutations],
        }
    slots = report.slots
    if slots is not None and slots.available:
        figures["canary_vs_stable"] = {
            "title": "Canary minus stable (95 % CI)",
            "panels": [
                {
                    "label": "session mean latency (ms)",
                    "value": slots.latency_diff_ms,
                    "ci": slots.latency_diff_ci,
                },
                {
                    "label": "implied GMV per day",
                    "value": slots.implied_gmv_per_day,
                    "ci": slots.implied_gmv_per_day_ci,
                },
                {
                    "label": "measured GMV per session",
                    "value": slots.measured_gmv_diff,
                    "ci": slots.measured_gmv_diff_ci,
                },
            ],
        }
    return _finite(figures)


# -- drawing -------------------------------------------------------------------------------------
def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def draw_figure(name: str, spec: dict[str, Any]) -> str:
    """One figure as a base64 PNG, drawn from its data spec."""
    # The object-oriented API needs no pyplot state or GUI backend: safe in worker threads.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 3.6), dpi=100)
    if name == "canary_vs_stable":
        axes = fig.subplots(1, len(spec["panels"]), gridspec_kw={"wspace": 0.7})
        for ax, panel in zip(axes, spec["panels"], strict=True):
            _errorbar_panel(ax, panel)
        fig.suptitle(spec["title"])
        return _png(fig)
    ax = fig.subplots()
    ax.set_title(spec["title"], fontsize=10)
    if name == "latency_by_version":
        for i, series in enumerate(spec["series"]):
            edges = [*series["bin_start_ms"], series["bin_start_ms"][-1] + spec["bin_ms"]]
            ax.stairs(series["share"], edges, label=series["version"], color=_COLORS[i % 6])
        ax.legend(fontsize=8)
        ax.set_xlabel(spec["x_label"])
        ax.set_ylabel(spec["y_label"])
    elif name in ("gmv_by_latency", "session_length_by_latency"):
        bins = spec["bins"]
        mids = [b["mid_ms"] for b in bins]
        means = [b["mean"] for b in bins]
        errors = [[b["mean"] - b["ci_low"] for b in bins], [b["ci_high"] - b["mean"] for b in bins]]
        ax.errorbar(mids, means, yerr=errors, fmt="o-", capsize=3, color=_COLORS[0])
        ax.set_xlabel(spec["x_label"])
        ax.set_ylabel(spec["y_label"])
    elif name == "effect_estimates":
        rows = spec["estimates"]
        ys = list(range(len(rows)))[::-1]
        for y, row in zip(ys, rows, strict=True):
            ax.errorbar(
                [row["value"]],
                [y],
                xerr=[[row["value"] - row["ci_low"]], [row["ci_high"] - row["value"]]],
                fmt="o",
                capsize=4,
                color=_COLORS[0] if row["key"] != "naive" else _COLORS[1],
            )
        ax.axvline(0.0, color="#888", linewidth=0.8)
        ax.set_yticks(ys, [r["label"] for r in rows], fontsize=8)
        ax.set_xlabel(spec["x_label"])
    elif name == "refutations":
        rows = spec["refutations"]
        ys = list(range(len(rows)))[::-1]
        for y, row in zip(ys, rows, strict=True):
            ax.plot(
                [row["expected"] - row["tolerance"], row["expected"] + row["tolerance"]],
                [y, y],
                color="#bbb",
                linewidth=6,
                solid_capstyle="butt",
            )
            ax.plot(
                [row["new_effect"]], [y], "o", color=_COLORS[2] if row["passed"] else _COLORS[1]
            )
        ax.set_yticks(
            ys, [f"{r['label']} ({'pass' if r['passed'] else 'FAIL'})" for r in rows], fontsize=8
        )
        ax.set_xlabel(spec["x_label"] + " (grey: accepted range)")
    else:
        raise ValueError(f"no drawing for figure {name!r}")
    return _png(fig)


def _errorbar_panel(ax: Any, panel: dict[str, Any]) -> None:
    ax.set_title(panel["label"], fontsize=9)
    ax.axhline(0.0, color="#888", linewidth=0.8)
    ax.set_xticks([])
    if panel["value"] is None:
        ax.text(0.5, 0.5, "not available", ha="center", transform=ax.transAxes)
        return
    low, high = panel["ci"]
    ax.errorbar(
        [0],
        [panel["value"]],
        yerr=[[panel["value"] - low], [high - panel["value"]]],
        fmt="o",
        capsize=5,
        color=_COLORS[0],
    )


# -- text ----------------------------------------------------------------------------------------
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
    parts += ["<h2>Data</h2>", _coverage_table(report)]
    if report.latency_profile:
        parts.append(
            _table(
                ["version", "slot", "requests", "mean ms", "p50 ms", "p95 ms", "p99 ms"],
                [
                    [
                        str(p["model_version"]),
                        str(p["slot"]),
                        f"{p['requests']:,}",
                        _num(p["mean_ms"]),
                        _num(p["p50_ms"]),
                        _num(p["p95_ms"]),
                        _num(p["p99_ms"]),
                    ]
                    for p in report.latency_profile
                ],
            )
        )
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
    if report.estimates:
        rows = [
            [
                e.label,
                _num(e.value),
                _ci(e.ci_low, e.ci_high),
                _num(e.p_value, 3),
                e.interval_method,
            ]
            for e in report.estimates
        ]
        if report.session_length_estimate is not None:
            e = report.session_length_estimate
            rows.append(
                [
                    e.label + " (s per ms)",
                    _num(e.value),
                    _ci(e.ci_low, e.ci_high),
                    _num(e.p_value, 3),
                    e.interval_method,
                ]
            )
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
    if report.translation is not None:
        t = report.translation
        parts += [
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
    return json.dumps(_finite(document), indent=2, allow_nan=False)


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

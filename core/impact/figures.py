"""An impact report's figures: first as plain data (`build_figures`), then drawn as PNG.

The PNG embedded in the HTML is drawn from exactly that data, and the report's JSON carries it,
so every plotted number can be checked.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

from core.impact.types import ImpactReport

_COLORS = ("#1f6feb", "#d1242f", "#2da44e", "#8250df", "#bf8700", "#57606a")


def json_safe(value: Any) -> Any:
    """The value with NaN and infinities replaced by None, so the JSON stays strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
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
    return json_safe(figures)


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

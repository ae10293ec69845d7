"""The impact history: every release's experiment on one page, with trend plots.

One row per stored experiment (core/impact/storage.py files one per release beside its version,
"no experiment" ones included): time, lineage id, outcome, canary length, each metric's effect
with its interval, and the latency elasticity from that version's latest impact report, linked.
Read from the model store alone, so the CLI builds it without ClickHouse or Prefect. The trend
plots are inline SVG drawn here: no plotting library to import, and the page stays one file.
"""

from __future__ import annotations

import html
import math
from datetime import datetime

from pydantic import BaseModel, Field

from core.impact.experiment_types import METRICS, ExperimentFinding, ReleaseExperiment
from core.impact.kinds import EXPERIMENT_KIND, HISTORY_KIND, REPORT_KIND
from core.impact.pages import PAGES, publish_page
from model_store import ModelStore
from relay.types import Stored


class ReportLink(BaseModel):
    """What the history needs of a stored impact report record (core.impact.types'
    StoredImpactReport, read without importing the analysis stack)."""

    created_at: datetime
    html_url: str
    page_url: str | None = None
    elasticity: float | None = None
    elasticity_ci: tuple[float, float] | None = None


class HistoryRow(Stored):
    """One release on the history page."""

    experiment: ReleaseExperiment
    report_url: str | None = None  # the version's latest impact report (HTML)
    elasticity: float | None = None  # GMV per session per ms, from that report
    elasticity_ci: tuple[float, float] | None = None

    @property
    def when(self) -> datetime:
        return self.experiment.end or self.experiment.generated_at


class HistoryPage(Stored):
    """The rows, newest first, and their renderings."""

    generated_at: datetime
    rows: list[HistoryRow] = Field(default_factory=list)
    html: str = ""
    markdown: str = ""


def read_history_rows(store: ModelStore) -> list[HistoryRow]:
    """Every stored experiment with its version's latest impact report, newest release first."""
    rows: list[HistoryRow] = []
    for version in store.list_versions():
        attachments = store.list_attachments(version, EXPERIMENT_KIND)
        if not attachments:
            continue
        reports = [
            ReportLink.model_validate_json(store.read_attachment(a))
            for a in store.list_attachments(version, REPORT_KIND)
        ]
        latest = max(reports, key=lambda r: r.created_at, default=None)
        for attachment in attachments:
            experiment = ReleaseExperiment.model_validate_json(store.read_attachment(attachment))
            rows.append(
                HistoryRow(
                    experiment=experiment,
                    report_url=(latest.page_url or latest.html_url) if latest else None,
                    elasticity=latest.elasticity if latest else None,
                    elasticity_ci=latest.elasticity_ci if latest else None,
                )
            )
    return sorted(rows, key=lambda r: r.when, reverse=True)


def build_history(store: ModelStore, now: datetime, history_url: str | None = None) -> HistoryPage:
    """The history page of every release in the store, rendered as HTML and markdown."""
    rows = read_history_rows(store)
    return HistoryPage(
        generated_at=now,
        rows=rows,
        html=render_history_html(rows, now),
        markdown=render_history_markdown(rows, history_url),
    )


def _pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value * 100:+.1f} %"


def effect_cell(row: HistoryRow, key: str) -> str:
    """A metric's relative effect and 95 % interval as text, or why there is none."""
    experiment = row.experiment
    if experiment.finding is ExperimentFinding.no_experiment:
        return "no experiment"
    metric = experiment.metric(key)
    if metric is None or not metric.measured:
        return "not measured"
    text = (
        f"{_pct(metric.relative)} [{_pct(metric.relative_ci_low)}, {_pct(metric.relative_ci_high)}]"
    )
    if experiment.finding is ExperimentFinding.not_valid:
        return text + " (not valid)"
    return text + (" *" if metric.detected else "")


def elasticity_cell(row: HistoryRow) -> str:
    if row.elasticity is None:
        return "–"
    ci = row.elasticity_ci
    interval = f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""
    return f"{row.elasticity:.4f}{interval}"


def canary_cell(row: HistoryRow) -> str:
    seconds = row.experiment.canary_seconds
    if seconds is None:
        return "–"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def render_history_markdown(rows: list[HistoryRow], history_url: str | None) -> str:
    """The Prefect artifact: a markdown table of every release, with links."""
    lines = [
        "# Impact history",
        "",
        f"{len(rows)} releases, newest first. Effects are canary vs baseline, relative, with "
        "95 % intervals (CUPED, clustered by user); * = detected (Holm across business metrics).",
    ]
    if history_url:
        lines += ["", f"[The history page with trend plots]({history_url})"]
    head = ["time", "version", "lineage id", "outcome", "canary", "finding"]
    head += [m.label for m in METRICS] + ["GMV/ms elasticity", "report"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        e = row.experiment
        cells = [
            f"{row.when:%Y-%m-%d %H:%M}",
            f"`{e.version}`",
            f"`{e.lineage_id[:16]}`",
            e.outcome,
            canary_cell(row),
            e.finding.value.replace("_", " "),
            *(effect_cell(row, m.key) for m in METRICS),
            elasticity_cell(row),
            f"[report]({row.report_url})" if row.report_url else "–",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 6px}
th{background:#f3f3f3}.plots{display:flex;flex-wrap:wrap;gap:16px}figure{margin:0}
td.detected{font-weight:bold}td.none{color:#888}
"""


def render_history_html(rows: list[HistoryRow], now: datetime) -> str:
    """The static page: trend plots of every metric's effect, then the table, newest first."""
    esc = html.escape
    head = ["time", "version", "lineage id", "outcome", "canary", "finding"]
    head += [m.label for m in METRICS] + ["GMV/ms elasticity", "report"]
    body = []
    for row in rows:
        e = row.experiment
        cells = [
            f"<td>{row.when:%Y-%m-%d %H:%M:%S}</td>",
            f"<td><code>{esc(e.version)}</code></td>",
            f"<td><code title='{esc(e.lineage_id)}'>{esc(e.lineage_id[:16])}</code></td>",
            f"<td>{esc(e.outcome)}</td>",
            f"<td>{canary_cell(row)}</td>",
            f"<td title='{esc(e.headline)}'>{esc(e.finding.value.replace('_', ' '))}</td>",
        ]
        for m in METRICS:
            text = effect_cell(row, m.key)
            css = "detected" if text.endswith("*") else ("none" if "[" not in text else "")
            cells.append(f"<td class='{css}' data-metric='{m.key}'>{esc(text)}</td>")
        cells.append(f"<td>{esc(elasticity_cell(row))}</td>")
        link = f"<a href='{esc(row.report_url)}'>report</a>" if row.report_url else "–"
        cells.append(f"<td>{link}</td>")
        body.append(f"<tr data-release='{esc(e.release_id)}'>{''.join(cells)}</tr>")
    plots = "".join(_trend_svg(rows, m.key, m.label) for m in METRICS)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Relay impact history</title>"
        f"<style>{_CSS}</style></head><body><h1>Impact history</h1>"
        f"<p>{len(rows)} releases, built {now:%Y-%m-%d %H:%M:%S} UTC. Each effect is the "
        "canary against its baseline over the canary, relative, with its 95 % interval "
        "(per-user, CUPED with pre-canary behaviour); * marks an effect detected after Holm's "
        "correction across click-through, orders and GMV. These are effects during each "
        "canary, not forecasts.</p>"
        f"<div class='plots'>{plots}</div>"
        f"<table id='history'><thead><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></body></html>"
    )


def _trend_svg(rows: list[HistoryRow], key: str, label: str) -> str:
    """Effect and interval per release over time (oldest left), zero marked."""
    points = []
    for row in reversed(rows):  # oldest first
        m = row.experiment.metric(key)
        ok = row.experiment.finding is not ExperimentFinding.no_experiment
        if ok and m and m.measured and m.relative is not None and m.relative_ci_low is not None:
            points.append((m.relative, m.relative_ci_low, m.relative_ci_high or m.relative))
    w, h, pad = 320, 160, 28
    if not points:
        return f"<figure><svg width='{w}' height='{h}'></svg><figcaption>{label}: no measured releases</figcaption></figure>"
    lo = min(min(p[1] for p in points), 0.0)
    hi = max(max(p[2] for p in points), 0.0)
    span = (hi - lo) or 1.0

    def y(v: float) -> float:
        return pad + (hi - v) / span * (h - 2 * pad)

    step = (w - 2 * pad) / max(len(points) - 1, 1)
    marks = [f"<line x1='{pad}' x2='{w - pad}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#999'/>"]
    for i, (v, a, b) in enumerate(points):
        x = pad + i * step
        marks.append(
            f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y(a):.1f}' y2='{y(b):.1f}' stroke='#69c'/>"
        )
        marks.append(f"<circle cx='{x:.1f}' cy='{y(v):.1f}' r='2.5' fill='#036'/>")
    axis = (
        f"<text x='2' y='{pad - 8}' font-size='10'>{hi * 100:+.1f} %</text>"
        f"<text x='2' y='{h - 6}' font-size='10'>{lo * 100:+.1f} %</text>"
    )
    return (
        f"<figure><svg width='{w}' height='{h}' role='img' aria-label='{label} trend'>"
        f"{''.join(marks)}{axis}</svg><figcaption>{label}: effect and 95 % interval per "
        f"release, oldest left</figcaption></figure>"
    )


def store_history_page(store: ModelStore, page: HistoryPage) -> str:
    """File the page beside the store (write-once, named by time and content); its address."""
    data = page.html.encode()
    name = f"{page.generated_at:%Y%m%dT%H%M%S%fZ}-{len(page.rows)}"
    store.put_attachment(None, HISTORY_KIND, name, data)
    return publish_page(store, HISTORY_KIND, name, page.html)


def latest_history_url(store: ModelStore) -> str | None:
    """The address of the most recently filed history page, if any."""
    pages = store.list_attachments(None, HISTORY_KIND)
    return store.backend.locate(f"{PAGES}/{HISTORY_KIND}/{pages[-1].name}.html") if pages else None

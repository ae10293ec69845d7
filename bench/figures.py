"""The benchmark-figures table in the docs, rendered from bench/results/*.json, never typed.

`python -m bench.figures` rewrites the blocks between `<!-- figures:begin -->` and
`<!-- figures:end -->` (the summary table) and `<!-- figures:gate-cases:begin -->` ... `end -->`
(bench.gate's rows) in README.md and docs/*.md;
`python -m bench.figures --check` exits 1 when a block differs from what the results say
(tests/unit/test_bench_figures.py runs the check, so a figure edited by hand fails the suite).
A result file that is missing, or a field a renderer needs that is absent, reads "not measured":
the table never shows a figure that no run produced.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.proportions import wilson

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BEGIN = "<!-- figures:begin -->"
END = "<!-- figures:end -->"
NOT_MEASURED = "not measured"


class Missing(KeyError):
    """A field a renderer reads is absent from the result file."""


def _get(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise Missing(path)
        node = node[part]
    return node


def _num(value: Any, digits: int = 1) -> str:
    """A number with thousands separators; integers without decimals."""
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and digits == 0):
        return f"{int(value):,}"
    return f"{float(value):,.{digits}f}"


def _pct(value: Any, digits: int = 1) -> str:
    return NOT_MEASURED if value is None else f"{100 * float(value):.{digits}f} %"


Renderer = Callable[[Mapping[str, Any]], Iterable[str]]
RENDERERS: dict[str, Renderer] = {}


def renders(name: str) -> Callable[[Renderer], Renderer]:
    """Register the renderer of bench/results/<name>.json."""

    def register(fn: Renderer) -> Renderer:
        RENDERERS[name] = fn
        return fn

    return register


@renders("release")
def _release(d: Mapping[str, Any]) -> Iterable[str]:
    stages = _get(d, "stage_s")
    yield (
        f"{_num(_get(d, 'events'))} events: wall {_num(_get(d, 'wall_s'))} s; "
        f"train {_num(stages.get('train-ctr-model'))} s, "
        f"validate {_num(stages.get('validate-training-data'))} s; "
        f"Prefect overhead {_pct(_get(d, 'prefect_overhead_fraction'))}; "
        f"hashing {_num(_get(d, 'hash_gb_s'), 2)} GB/s = {_num(_get(d, 'hash_vs_openssl'), 2)} x openssl"
    )


@renders("store")
def _store(d: Mapping[str, Any]) -> Iterable[str]:
    size = _num(_get(d, "artifact_mb"))
    put, raw_put = _get(d, "store_put_mb_s"), _get(d, "raw_put_mb_s")
    get, raw_get = _get(d, "store_get_mb_s"), _get(d, "raw_get_mb_s")
    yield f"{size} MB: put {_num(put)} vs raw {_num(raw_put)} MB/s ({_num(put / raw_put, 2)})"
    yield f"get {_num(get)} vs raw {_num(raw_get)} MB/s ({_num(get / raw_get, 2)})"
    if "raw_verified_get_mb_s" in d:
        yield f"raw get + sha256 {_num(d['raw_verified_get_mb_s'])} MB/s"
    yield f"peak RSS put {_num(_get(d, 'peak_rss_mb'))} MB, get {_num(d.get('get_peak_rss_mb'))} MB"


@renders("serving")
def _serving(d: Mapping[str, Any]) -> Iterable[str]:
    for key in (
        "echo_rps",
        "worker_rps",
        "worker_binary_rps",
        "worker_nolog_rps",
        "worker_requests_only_rps",
        "worker_segmenter_process_rps",
        "worker_tracing_rps",
        "worker_notrace_rps",
        "write_rows_s",
        "ingest_rows_s",
    ):
        if key in d:
            yield f"{key} {_num(d[key])}"
    if "p95_at_2000_ms_by_mode" in d:
        modes = ", ".join(f"{m} {_num(v)} ms" for m, v in d["p95_at_2000_ms_by_mode"].items())
        yield f"P95 at 2,000 req/s offered: {modes}"
    if "log_backpressure_rejections" in d:
        yield f"worker's requests refused for log back-pressure {_num(d['log_backpressure_rejections'])}"
    if "worker_segments_by" in d:
        by = d["worker_segments_by"]
        copied = f"copied as records {_num(by['copy'])}, " if "copy" in by else ""
        yield (
            f"worker's segments: {copied}by its segmenter {_num(by['segmenter'])}, "
            f"by its writer's thread {_num(by['writer'])}"
        )
    if "spool_bytes_per_row" in d:
        sizes = ", ".join(f"{m} {_num(v)}" for m, v in d["spool_bytes_per_row"].items())
        yield f"spool bytes per log row: {sizes}"
    if "mirror_p95_cost" in d:  # the same measurement as serving_mirror.json's, in this run
        yield "mirror: " + _mirror_cost(d)


def _gate_mirror(cost: float | None) -> str:
    """gate.json's copy of serving_mirror.json's `mirror_p95_cost` (on / off - 1: 1.53 is x2.53)."""
    return (
        "mirror P95 cost: stable's P95 with the shadow on over off "
        + (NOT_MEASURED if cost is None else f"+{_pct(cost)} (x{1 + float(cost):.2f})")
        + " (serving_mirror.json)"
    )


def _mirror_cost(d: Mapping[str, Any]) -> str:
    """Stable's P95 with the shadow on against off: `mirror_p95_cost` is on / off - 1."""
    by_mode, config = _get(d, "mirror_p95_ms_by_mode"), _get(d, "mirror_config")
    cost = _get(d, "mirror_p95_cost")  # None where the shadow-off P95 was 0
    rise = NOT_MEASURED if cost is None else f"+{_pct(cost)} (x{1 + float(cost):.2f})"
    interval = d.get("mirror_p95_cost_interval")
    if "mirror_p95_cost_method" not in d:  # saved before the paired figure
        return (
            f"stable's P95 at {_num(config['rate_rps'])} req/s offered, {_pct(config['share'])} "
            f"mirrored: {_num(by_mode['off'])} ms shadow off, {_num(by_mode['on'])} ms on, "
            f"{rise} (ratio of the modes' median P95s over {config['rounds']} alternating "
            f"rounds of {_num(config['seconds'])} s; no interval)"
        )
    bracket = (
        "too few rounds for a 95 % interval"
        if interval is None
        else f"95 % interval {_pct(interval[0])} to {_pct(interval[1])}"
    )
    return (
        f"stable's P95 at {_num(config['rate_rps'])} req/s offered, {_pct(config['share'])} "
        f"mirrored: {rise} ({bracket}; median of {config['rounds']} paired rounds of "
        f"{_num(config['seconds'])} s, each its shadow-on P95 over its shadow-off P95; median "
        f"P95 {_num(by_mode['off'])} ms off, {_num(by_mode['on'])} ms on)"
    )


@renders("rollback")
def _rollback(d: Mapping[str, Any]) -> Iterable[str]:
    p95 = _get(d, "rollback_ms_p95_by_workers")
    failed = d.get("requests_failed_by_workers", {})
    for workers, ms in p95.items():
        yield f"{workers} workers: p95 {_num(ms)} ms, {_num(failed.get(workers))} failed requests"


@renders("chaos")
def _chaos(d: Mapping[str, Any]) -> Iterable[str]:
    yield (
        f"{_num(_get(d, 'worker_kills'))} worker SIGKILLs: {_num(_get(d, 'answered'))} answered, "
        f"{_num(_get(d, 'rows_lost'))} rows lost, {_num(_get(d, 'rows_duplicated'))} duplicated"
    )
    if "impression_rows" in d:
        yield (
            f"their impressions: {_num(d['impression_rows'])} rows, "
            f"{_num(d['impressions_lost'])} requests missing some, "
            f"{_num(d['impressions_duplicated'])} with a rank twice"
        )
    for key in (
        "concurrent_ingestion",
        "ingester_kills",
        "transports",
        "requests_in_flight",
        "logging_cost",
        "fsync_cost",
        "release_kills",
        "next_release_started",
        "lease_s",
        "orphan_canary_s_max",
    ):
        if key in d and key.endswith("_cost"):  # a share of throughput: 0.0833 is 8.3 %, not 0.1
            yield f"{key}: {_pct(d[key])}"
        elif key in d:
            yield f"{key}: {d[key] if isinstance(d[key], str | list) else _num(d[key])}"


@renders("impact")
def _impact(d: Mapping[str, Any]) -> Iterable[str]:
    yield (
        f"{_num(_get(d, 'rows'))} rows: query {_num(_get(d, 'query_s'))} s + analysis "
        f"{_num(_get(d, 'analysis_s'))} s; peak RSS {_num(_get(d, 'peak_rss_mb'))} MB"
    )


@renders("gate")
def _gate(d: Mapping[str, Any]) -> Iterable[str]:
    cases = _get(d, "cases")
    aa = [c for c in cases if c["regression"] == "aa"]
    yield (
        f"{len(cases)} cases x {_num(d.get('releases_per_case'))} simulated releases "
        "(every case in docs/gate.md's table)"
    )
    yield "A/A false rollback worst row " + _pct(max(c["rolled_back"] for c in aa))
    yield "A/A promoted without a person, worst row " + _pct(min(c["promoted"] for c in aa))
    hit = [c for c in cases if (c.get("p95_ratio_at_peak") or 0) >= 1.2]
    if hit:
        yield "P95 +>=20 % cases: worst promoted row " + _pct(max(c["promoted"] for c in hit))
    srm = d.get("srm") or {}
    line = (
        f"sample-ratio check: A/A flag rate {_pct(srm.get('aa_flag_rate'))}, "
        f"5 %->6 % detected within 2 windows in {_pct(srm.get('detected_within_2_windows'))}"
    )
    if srm.get("users_in_2_windows_median"):  # older results did not count users
        replays = int(srm["replays"])
        aa_low, aa_high = wilson(round(float(srm["aa_flag_rate"]) * replays), replays)
        line += (
            f", within {_num(srm.get('max_windows'))} in "
            f"{_pct(srm.get('detected_within_max_windows'))} ({_num(replays)} replays each, "
            f"median {_num(srm['users_in_2_windows_median'], 0)} users in 2 windows; A/A Wilson "
            f"95 % {_pct(aa_low)}-{_pct(aa_high)})"
        )
    if srm.get("measured_at"):  # an --srm-only run, not the rest of gate.json's
        at = datetime.fromisoformat(srm["measured_at"]).strftime("%Y-%m-%d %H:%M")
        line += f", measured {at} UTC by bench.gate --srm-only"
    yield line
    cap = d.get("capacity_check") or {}
    plant = ""
    if cap.get("champion_cpu_ms_per_request") is not None:
        plant = (
            " (costlier: +30 % CPU per request, sized before each pair of runs from the "
            f"champion's flat-out cost: median {float(cap['champion_cpu_ms_per_request']):.3f} ms, "
            f"planted +{float(cap['plant_cpu_ms_per_request']):.3f} ms"
        )
        if cap.get("champion_cpu_ms_per_request_range"):
            low, high = cap["champion_cpu_ms_per_request_range"]
            plant += f", range {low:.3f}-{high:.3f} ms over {cap.get('cost_probes')} probes"
        plant += ")"

    def flagged(case: str) -> str:
        rate, runs = cap.get(f"flag_rate_{case}"), cap.get(f"runs_{case}")
        text = f"{_pct(rate)} of {_num(runs)} runs"
        if rate is not None and runs:
            low, high = wilson(round(float(rate) * runs), int(runs))
            text += f" (Wilson 95 % {_pct(low)}-{_pct(high)})"
        return text

    when = ""
    if cap.get("measured_at"):  # capacity.json's run, not the rest of gate.json's
        at = datetime.fromisoformat(cap["measured_at"]).strftime("%Y-%m-%d %H:%M")
        when = f", measured {at} UTC by bench.capacity"
    yield (
        f"capacity check{plant}: flags costlier {flagged('costlier')}, "
        f"twin {flagged('twin')}, median throughput shortfall costlier "
        f"{_pct(cap.get('median_shortfall_costlier'))}, twin {_pct(cap.get('median_shortfall_twin'))}, "
        f"longest check {_num(cap.get('wall_s_max'))} s{when}"
    )
    yield _gate_mirror(d.get("mirror_p95_cost"))
    live_when = ""
    if d.get("live_measured_at"):  # a --live-only run's, not the rest of gate.json's
        at = datetime.fromisoformat(d["live_measured_at"]).strftime("%Y-%m-%d %H:%M")
        live_when = (
            f" (at {_num(d.get('live_traffic_rps'))} req/s, {_num(d.get('live_seconds'))} s in all, "
            f"measured {at} UTC by bench.gate --live-only)"
        )
    yield (
        f"live releases: {len(d.get('live_aa') or [])} A/A, {len(d.get('live_ab') or [])} A/B"
        f"{live_when}"
    )
    for kind, outcomes in _live_outcomes(d).items():
        yield f"live {kind}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))


def _live_outcomes(d: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Each live kind's outcomes, counted (one line per kind: no kind pooled into another)."""
    out: dict[str, dict[str, int]] = {}
    for run in [*(d.get("live_aa") or []), *(d.get("live_ab") or [])]:
        kind = out.setdefault(str(run.get("kind", "?")), {})
        kind[run["outcome"]] = kind.get(run["outcome"], 0) + 1
    return out


def gate_cases_table() -> str:
    """bench.gate's operating characteristic, one row per case, nothing pooled."""
    path = RESULTS / "gate.json"
    if not path.exists():
        return NOT_MEASURED
    cases = json.loads(path.read_text()).get("cases", [])
    out = [
        "| load | req/s | regression | P95 ratio at peak | rolled back | refused before users "
        "| paused | promoted | median s to verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        out.append(
            f"| {c['load']} | {_num(c['traffic_rps'], 0)} | {c['regression']} "
            f"| {_num(c.get('p95_ratio_at_peak'), 2)} | {_pct(c['rolled_back'])} "
            f"| {_pct(c['refused_before_users'])} | {_pct(c['paused'])} | {_pct(c['promoted'])} "
            f"| {_num(c.get('median_s_to_verdict'), 0)} |"
        )
    return "\n".join(out)


@renders("attribution")
def _attribution(d: Mapping[str, Any]) -> Iterable[str]:
    cases = _get(d, "cases")
    right = sum(1 for c in cases if c["correct"])
    yield f"{right} of {len(cases)} cases correct"
    for c in cases:
        named = ", ".join(c["top_causes"]) or "none"
        yield f"{c['name']}: {c['status']}, named {named} ({'right' if c['correct'] else 'wrong'}, {_num(c['wall_s'])} s)"
    coverage = f"90 % interval coverage {_pct(_get(d, 'coverage_90'))}"
    span, runs = d.get("coverage_90_interval"), d.get("calibration", {}).get("runs")
    if span and runs:  # older result files carry neither
        coverage += f" of {_num(runs)} plantings (Wilson 95 % {_pct(span[0])}-{_pct(span[1])})"
    yield f"{coverage}; resamples {_num(_get(d, 'resamples_min'))}"


@renders("experiment")
def _experiment(d: Mapping[str, Any]) -> Iterable[str]:
    cov = _get(d, "coverage_by_metric")
    red = _get(d, "cuped_variance_reduction")
    span = d.get("coverage_interval_by_metric", {})

    def interval(m: str) -> str:
        return f" [{_pct(span[m][0])}, {_pct(span[m][1])}]" if span.get(m) else ""

    releases = sum(d.get("releases_per_case", {}).values())
    yield f"95 % coverage over {_num(releases)} releases (Wilson 95 % interval) " + ", ".join(
        f"{m} {_pct(v)}{interval(m)}" for m, v in cov.items()
    )
    yield "CUPED variance reduction " + ", ".join(f"{m} {_pct(v)}" for m, v in red.items())
    yield f"effect detected at zero {_pct(_get(d, 'false_detection_rate_zero'))}"
    yield f"query + estimate on 10M rows {_num(_get(d, 'query_s_10m'))} s"
    yield f"history page, 100 releases {_num(_get(d, 'history_build_s_100'), 2)} s"


@renders("drift")
def _drift(d: Mapping[str, Any]) -> Iterable[str]:
    for size in _get(d, "by_window_size"):
        alarms = size["false_alarm_rate"]
        combined = alarms.get("combined") or next(iter(alarms.values()))
        yield f"{_num(size['window_rows'])} impressions/window: false alarms {_pct(combined['rate'])} of {combined['n']}"
    served = _get(d, "served_clean")
    combined = served["false_alarm_rate"]["combined"]
    yield (
        f"{_num(served['window_rows'])} served impressions/window (feeds of 20 sharing a user): "
        f"false alarms {_pct(combined['rate'])} of {combined['n']}; the score's rule alone by "
        "batches it runs over: "
        + ", ".join(
            f"{_num(b['batches'])} {_pct(b['rate'])}"
            for b in served["score_false_alarm_by_batches"]
        )
    )
    yield f"cost per window on {_num(_get(d, 'cost_per_window.window_rows'))} impressions {_num(_get(d, 'cost_per_window.combined_s'), 2)} s"


@renders("serving_mirror")
def _serving_mirror(d: Mapping[str, Any]) -> Iterable[str]:
    yield _mirror_cost(d)


@renders("log_record")
def _log_record(d: Mapping[str, Any]) -> Iterable[str]:
    for case in _get(d, "cases"):
        answer, writer = case["answer_path_us_per_batch"], case["writer_us_per_batch"]
        yield (
            f"impressions of {case['requests_per_batch']} requests a batch: "
            f"{_num(answer['record'])} µs engine-thread CPU per batch before its answers "
            f"(journal per batch: {_num(answer['journal'])} µs), writer {_num(writer['record'])} µs"
        )


@renders("gpu_check")
def _gpu_check(d: Mapping[str, Any]) -> Iterable[str]:
    yield f"TensorRT {_get(d, 'tensorrt.status')}: {_get(d, 'tensorrt.reason')}"
    yield f"host GPU: {_get(d, 'host.gpu') or 'none'}"


def measured(data: Mapping[str, Any], file_name: str) -> str:
    """When and on what a result file's figures were measured (bench.saved stamps each file)."""
    at = data.get("measured_at")
    if not at:
        return f"when measured: not recorded in {file_name} (saved before benches stamped it)"
    host = data.get("host") if isinstance(data.get("host"), Mapping) else {}
    cpus = host.get("cpus") or data.get("cpu_count") or data.get("cpu_cores")
    load = host.get("loadavg_1m_at_end", data.get("load_avg_1m"))
    where = f" on {cpus} CPUs" if cpus else ""
    if load is not None:
        where += f" (load {float(load):.1f} at the end)"
    return f"measured {datetime.fromisoformat(at).strftime('%Y-%m-%d %H:%M')} UTC{where}"


def render_rows() -> list[tuple[str, list[str]]]:
    """Each benchmark's name and its figure lines, in a fixed order."""
    rows: list[tuple[str, list[str]]] = []
    for name, renderer in sorted(RENDERERS.items()):
        path = RESULTS / f"{name}.json"
        if not path.exists():
            rows.append((name, [NOT_MEASURED]))
            continue
        data = json.loads(path.read_text())
        try:
            lines = list(renderer(data))
        except Missing as missing:
            lines = [f"{NOT_MEASURED} ({missing.args[0]} absent from {path.name})"]
        rows.append((name, [*(lines or [NOT_MEASURED]), measured(data, path.name)]))
    return rows


def render_table() -> str:
    """The Markdown table between the markers."""
    out = [
        "| benchmark | figures (copied from bench/results/<name>.json by `python -m bench.figures`) |",
        "|---|---|",
    ]
    for name, lines in render_rows():
        out.append(f"| `{name}` | {'; '.join(lines)} |")
    return "\n".join(out)


BLOCKS: dict[str, Callable[[], str]] = {
    "figures": lambda: render_table(),
    "figures:gate-cases": gate_cases_table,
}


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- {key}:begin -->", f"<!-- {key}:end -->"


def _blocks() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for p in docs:
        text = p.read_text() if p.exists() else ""
        if any(_markers(key)[0] in text for key in BLOCKS):
            found.append(p)
    return found


def _with_tables(text: str) -> str:
    for key, render in BLOCKS.items():
        begin, end = _markers(key)
        if begin not in text:
            continue
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{render()}\n{end}{tail}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = parser.parse_args(argv)
    stale = []
    for path in _blocks():
        text = path.read_text()
        wanted = _with_tables(text)
        if wanted != text:
            stale.append(path)
            if not args.check:
                path.write_text(wanted)
    if args.check and stale:
        print("stale figures in: " + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

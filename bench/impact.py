"""Benchmark the impact report on 10,000,000 inference_logs rows with their sessions.

    python -m bench.impact [--rows N] [--keep] [--out PATH]

Seeds a fresh embedded ClickHouse under /tmp in a child process (chdb allows one engine path per
process, and the child's memory is not the report's), then, in this process, times the report
as the flow runs it: the ClickHouse join and aggregation (`query_s`), the analyses with the
rendered HTML and JSON (`analysis_s`), and everything through storing the report (`total_s`).
Writes bench/results/impact.json (or --out) with rows, sessions, query_s, analysis_s, total_s,
peak_rss_mb (this process's peak resident memory, embedded ClickHouse included).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.saved import save

RESULTS = Path(__file__).parent / "results"
START = datetime(2035, 1, 1, tzinfo=UTC)
END = START + timedelta(days=1)
REQUESTS_PER_SESSION = 20.0  # the simulator's mean: 1 + Poisson(19)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def seed(dsn: str, sessions: int) -> None:
    """Child process: write the sessions and their requests, in bounded chunks."""
    import logstore
    from simulation.sessions import TrafficConfig, seed_traffic

    client = logstore.connect(dsn)
    started = time.perf_counter()
    written = seed_traffic(
        client, TrafficConfig(n_sessions=sessions, seed=2035), START, END, chunk_sessions=25_000
    )
    print(
        f"seeded {written[0]:,} sessions, {written[1]:,} requests in "
        f"{time.perf_counter() - started:.1f} s (child peak RSS {_peak_rss_mb():,.0f} MB)",
        flush=True,
    )
    logstore.close_all()


def run(rows: int, keep: bool) -> dict[str, float | int]:
    """Seed in a child, then time the report here; return the figures."""
    workdir = Path(tempfile.mkdtemp(prefix="relay-bench-impact-", dir="/tmp"))
    dsn = f"chdb://{workdir / 'clickhouse'}"
    try:
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.impact",
                "--seed-into",
                dsn,
                "--sessions",
                str(round(rows / REQUESTS_PER_SESSION)),
            ],
            check=True,
        )
        print(f"seed (child process): {time.perf_counter() - started:.1f} s")
        return time_report(dsn, workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def time_report(dsn: str, workdir: Path) -> dict[str, float | int]:
    """Time the report over the seeded day as the flow runs it; print the breakdown."""
    import logstore
    from core.impact.analysis import analyse_impact
    from core.impact.report import render_html, render_json
    from core.impact.storage import store_report_files
    from core.impact.types import ImpactOptions, ImpactWindow
    from model_store import open_store
    from relay.settings import Settings
    from tasks.impact import query_impact_sessions

    settings = Settings(
        home=workdir, clickhouse_dsn=dsn, model_store_url=f"file://{workdir / 'models'}"
    )
    client = logstore.connect(dsn)
    n_rows = int(client.query("SELECT count() FROM inference_logs").result_rows[0][0])
    n_sessions = int(client.query("SELECT count() FROM user_sessions").result_rows[0][0])
    baseline_rss = _peak_rss_mb()
    window = ImpactWindow(start=START, end=END)

    t0 = time.perf_counter()
    data = query_impact_sessions.fn(settings, window, [], timedelta(hours=1))
    t1 = time.perf_counter()
    report = analyse_impact(data, ImpactOptions(), now=datetime.now(UTC))
    t2 = time.perf_counter()
    html_path, json_path = workdir / "impact-report.html", workdir / "impact-report.json"
    html_path.write_text(render_html(report), encoding="utf-8")
    json_path.write_text(render_json(report), encoding="utf-8")
    t3 = time.perf_counter()
    stored = store_report_files(open_store(settings), report, html_path, json_path, None)
    t4 = time.perf_counter()

    figures: dict[str, float | int] = {
        "rows": n_rows,
        "sessions": n_sessions,
        "query_s": round(t1 - t0, 2),
        "analysis_s": round(t3 - t1, 2),
        "total_s": round(t4 - t0, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
    frame_mb = data.sessions.memory_usage(deep=True).sum() / 2**20
    print(
        f"query {t1 - t0:.2f} s · analyses {t2 - t1:.2f} s · render {t3 - t2:.2f} s · "
        f"store {t4 - t3:.2f} s"
    )
    print(
        f"RSS before the report {baseline_rss:,.0f} MB, peak {figures['peak_rss_mb']:,} MB; "
        f"per-session frame in Python {frame_mb:,.1f} MB for {len(data.sessions):,} rows"
    )
    print(f"finding: {report.finding.value}: {report.headline}")
    for e in report.estimates:
        print(f"  {e.key:16} {e.value:+.4f} [{e.ci_low:+.4f}, {e.ci_high:+.4f}] GMV/session/ms")
    print(f"report: {stored.html_url} ({stored.blobs['report.html'].size:,} bytes)")
    logstore.close_all()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.impact", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="inference_logs rows")
    parser.add_argument("--keep", action="store_true", help="keep the temp ClickHouse and store")
    parser.add_argument("--out", type=Path, default=RESULTS / "impact.json")
    parser.add_argument("--seed-into", help=argparse.SUPPRESS)  # the child's job
    parser.add_argument("--sessions", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seed_into:
        seed(args.seed_into, args.sessions)
        return 0
    figures = run(args.rows, args.keep)
    save(args.out, figures)
    print(json.dumps(figures, indent=2))
    target = "met" if figures["total_s"] <= 60 else "MISSED"
    print(f"target total ≤ 60 s: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

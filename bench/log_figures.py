"""What the serving benchmark measures of the log path: CPU per request, rows written, ingestion.

`cpu_seconds` reads a process's user + system time from /proc: on a shared host the CPU a worker
spends per answered request is steadier than its throughput, which neighbours move. Rows logged
in a window are read from the worker's /metrics (written out plus still pending, so nothing
waits for a flush). `ingest_figures` times `ingest_spool` over a worker's spool into a chdb
engine of this process, the way the log store's owner ingests before it reads.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` and its live children have used so far.

    A worker's children are its log segmenter (`logstore.segmenter`): its CPU is the worker's
    logging cost, moved off the serving threads, not saved.
    """
    return sum(cpu_by_part(pid).values())


# Where a worker's CPU goes: its event loop (the main thread: HTTP, decoding, routing, the
# request row written ahead), its other threads (engine calls and the impressions records built
# on them, the log writers' rotations; threads that have exited included), and its children
# (the log segmenter). Logging's cost shows as the difference from the logging-off worker, part
# by part.
CPU_PARTS = ("event_loop", "worker_threads", "children")


def cpu_by_part(pid: int) -> dict[str, float]:
    """CPU seconds so far of process `pid`, by CPU_PARTS; 0.0 for a part that cannot be read."""
    whole = _stat_seconds(f"/proc/{pid}/stat")
    loop = _stat_seconds(f"/proc/{pid}/task/{pid}/stat")
    kids = sum(_stat_seconds(f"/proc/{c}/stat") for c in children(pid))
    return {"event_loop": loop, "worker_threads": max(whole - loop, 0.0), "children": kids}


def _stat_seconds(path: str) -> float:
    """User + system seconds from a /proc stat file; 0.0 if it is gone (it exited meanwhile)."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The pids of process `pid`'s children (every thread's), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of metric `name` (all label sets) in a /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def logged_rows(url: str) -> float:
    """Log rows a worker has taken so far, every table: written out plus pending."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return metric_sum(text, "relay_log_written_rows_total") + metric_sum(
        text, "relay_log_pending_rows"
    )


def spool_bytes_per_row(spool: Path, url: str) -> float | None:
    """Bytes on disk per log row the worker wrote out, over every table's spooled segments.

    Read before anything ingests the spool (bench.serving's workers spool and never ingest).
    """
    from logstore.segments import is_segment

    size = sum(p.stat().st_size for p in spool.rglob("*") if p.is_file() and is_segment(p.name))
    rows = metric_sum(httpx.get(f"{url}/metrics", timeout=10).text, "relay_log_written_rows_total")
    return round(size / rows, 1) if rows else None


def backpressure_rejections(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return metric_sum(text, "relay_log_backpressure_rejections_total")


def ingest_figures(spool_dir: Path, dsn: str) -> dict[str, Any]:
    """Time `ingest_spool` over every log table's spool folder under `spool_dir`."""
    import logstore
    from logstore.reading import LOG_TABLES
    from logstore.spool import ingest_spool

    client = logstore.connect(dsn)
    by_table: dict[str, int] = {}
    started = time.perf_counter()
    for table in LOG_TABLES:
        by_table[table.name] = ingest_spool(client, table.spool_dir(spool_dir), table).rows
    seconds = time.perf_counter() - started
    rows = sum(by_table.values())
    # What landed is checked against what was reported, so a rate is never over lost rows.
    landed = {
        t: int(client.query(f"SELECT count() FROM {t}").result_rows[0][0])  # constant names
        for t in by_table
    }
    return {
        "ingest_rows": rows,
        "ingest_s": round(seconds, 3),
        "ingest_rows_s": round(rows / seconds, 1) if seconds > 0 else 0.0,
        "ingest_rows_by_table": by_table,
        "ingest_landed_rows_by_table": landed,
    }


def cpu_figures(
    cpu_s: float, answered: int, wall_s: float, by_part: dict[str, float] | None = None
) -> dict[str, Any]:
    """A server's CPU per answered request and its CPU share, over one window.

    Both are over the same window (warm-up included), so the answers they divide by are the
    ones the CPU was spent on. The share is CPU seconds per wall second: on a host with more
    runnable threads than cores the scheduler sets it, thread by thread, not the server's
    efficiency, and throughput follows it (see docs/benchmarks.md).
    """
    figures: dict[str, Any] = {
        "cpu_us_per_request": round(cpu_s / max(answered, 1) * 1e6, 1),
        "cpu_share": round(cpu_s / wall_s, 3) if wall_s > 0 else 0.0,
    }
    if by_part is not None:  # the same, split by CPU_PARTS
        figures["cpu_us_per_request_by_part"] = {
            part: round(s / max(answered, 1) * 1e6, 1) for part, s in by_part.items()
        }
    return figures


def log_cost_ratios(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Logging on over logging off, paired round by round, each with its median.

    Paired: each round's ratio is of two scenarios measured moments apart, so drift in the
    host's load between rounds cancels (medians taken apart can pair a quiet round of one with
    a busy round of the other). `_rps_per_cpu` is throughput per CPU second, the rps ratio with
    the CPU share the scheduler gave each server taken out: what it is when each has a CPU.
    """
    nolog = rounds["worker_nolog"]

    def paired(name: str, kind: str, over: Any) -> dict[str, Any]:
        ratios = [over(a, n) for a, n in zip(rounds[name], nolog, strict=True)]
        ratios = [x for x in ratios if x is not None]
        return {
            f"{name}_over_nolog_{kind}_rounds": [round(x, 3) for x in ratios],
            f"{name}_over_nolog_{kind}": round(statistics.median(ratios), 3) if ratios else None,
        }

    def rps(a: dict[str, float], n: dict[str, float]) -> float | None:
        return a["rps"] / n["rps"] if n["rps"] else None

    def per_cpu(a: dict[str, float], n: dict[str, float]) -> float | None:
        c = a["cpu_us_per_request"]
        return n["cpu_us_per_request"] / c if c else None

    def extra_cpu(name: str) -> dict[str, float] | None:
        """Median over rounds of the CPU per request `name` spends beyond logging off, by part."""
        pairs = [
            (a["cpu_us_per_request_by_part"], n["cpu_us_per_request_by_part"])
            for a, n in zip(rounds[name], nolog, strict=True)
            if "cpu_us_per_request_by_part" in a and "cpu_us_per_request_by_part" in n
        ]
        if not pairs:
            return None
        return {
            part: round(statistics.median(a[part] - n[part] for a, n in pairs), 1)
            for part in CPU_PARTS
        }

    return {
        "log_cpu_us_per_request_by_part": {
            name: extra_cpu(name) for name in ("worker", "worker_requests_only")
        },
        **paired("worker", "rps", rps),
        **paired("worker_requests_only", "rps", rps),
        **paired("worker_segmenter_process", "rps", rps),
        **paired("worker", "rps_per_cpu", per_cpu),
    }


def segments_by(url: str) -> dict[str, float]:
    """Spool segments a worker wrote so far (every table): copied, by the segmenter, by the writer."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {"copy": 0.0, "segmenter": 0.0, "writer": 0.0}
    for line in text.splitlines():
        if line.startswith("relay_log_segments_total{"):
            for by in found:
                if f'by="{by}"' in line:
                    found[by] += float(line.rsplit(" ", 1)[1])
    return found

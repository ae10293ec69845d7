"""bench.serving's CPU figures: CPU per request and CPU share over one window, and the
logging-on over logging-off ratios, paired round by round and with the CPU share taken out."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from bench.log_figures import cpu_by_part, cpu_figures, cpu_seconds, log_cost_ratios


def test_cpu_figures_divide_one_windows_cpu_by_that_windows_answers_and_wall_time():
    figures = cpu_figures(cpu_s=0.6, answered=3000, wall_s=2.0)
    assert figures == {"cpu_us_per_request": 200.0, "cpu_share": 0.3}


def test_cpu_figures_of_an_idle_window_are_zero_not_a_division_error():
    assert cpu_figures(cpu_s=0.0, answered=0, wall_s=0.0) == {
        "cpu_us_per_request": 0.0,
        "cpu_share": 0.0,
    }


def _round(rps: float, cpu_us: float) -> dict[str, float]:
    return {"rps": rps, "cpu_us_per_request": cpu_us}


def test_log_cost_ratios_pair_each_round_so_a_busy_round_of_one_mode_cannot_skew_it():
    # round 2 was busy for worker_nolog only: independent medians would give 1000 / 500 = 2.0
    rounds = {
        "worker": [_round(1000, 300), _round(1100, 250), _round(400, 320)],
        "worker_requests_only": [_round(1000, 220), _round(900, 230), _round(450, 240)],
        "worker_segmenter_process": [_round(900, 320), _round(1000, 260), _round(380, 330)],
        "worker_nolog": [_round(1020, 210), _round(500, 200), _round(420, 224)],
    }
    r = log_cost_ratios(rounds)
    assert r["worker_over_nolog_rps_rounds"] == [0.98, 2.2, 0.952]
    assert r["worker_over_nolog_rps"] == 0.98
    assert r["worker_requests_only_over_nolog_rps"] == pytest.approx(1.071, abs=1e-3)
    assert r["worker_segmenter_process_over_nolog_rps_rounds"] == [0.882, 2.0, 0.905]


def test_a_worker_given_more_cpu_but_costlier_per_request_is_slower_per_cpu_second():
    # the shared-host case: logging on wins more CPU (more req/s) yet costs more per request
    rounds = {
        "worker": [_round(1300, 300), _round(1200, 250)],
        "worker_requests_only": [_round(1250, 240), _round(1150, 230)],
        "worker_segmenter_process": [_round(1250, 310), _round(1150, 260)],
        "worker_nolog": [_round(1000, 210), _round(900, 200)],
    }
    r = log_cost_ratios(rounds)
    assert r["worker_over_nolog_rps_per_cpu_rounds"] == [0.7, 0.8]
    assert r["worker_over_nolog_rps_per_cpu"] == pytest.approx(0.75)
    assert r["worker_over_nolog_rps"] > 1  # what the scheduler's share alone makes of it


def test_a_round_with_nothing_answered_or_measured_is_left_out_not_divided_by():
    rounds = {
        "worker": [_round(0, 0.0)],
        "worker_requests_only": [_round(10, 200.0)],
        "worker_segmenter_process": [_round(10, 200.0)],
        "worker_nolog": [_round(0, 200.0)],
    }
    r = log_cost_ratios(rounds)
    assert r["worker_over_nolog_rps"] is None and r["worker_over_nolog_rps_rounds"] == []
    assert r["worker_over_nolog_rps_per_cpu"] is None


def test_cpu_seconds_of_this_process_grow_with_the_work_it_does():
    before = cpu_seconds(os.getpid())
    deadline, give_up = before + 0.05, time.monotonic() + 10
    while cpu_seconds(os.getpid()) < deadline and time.monotonic() < give_up:
        sum(range(10_000))
    assert cpu_seconds(os.getpid()) >= deadline


def _busy(seconds_of_cpu: float, read: Any) -> None:
    """Spin until `read()` (CPU seconds of one part) has grown by `seconds_of_cpu`, or 60 s pass."""
    deadline, give_up = read() + seconds_of_cpu, time.monotonic() + 60
    while read() < deadline and time.monotonic() < give_up:
        sum(range(10_000))


def test_cpu_by_part_books_a_worker_thread_apart_from_the_event_loop_and_children_apart():
    pid = os.getpid()
    before = cpu_by_part(pid)
    spinner = threading.Thread(target=_busy, args=(0.3, lambda: cpu_by_part(pid)["worker_threads"]))
    spinner.start()
    spinner.join()
    after_thread = cpu_by_part(pid)
    assert after_thread["worker_threads"] - before["worker_threads"] >= 0.3
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)",
        ]
    )
    try:
        give_up = time.monotonic() + 60
        while cpu_by_part(pid)["children"] < 0.28 and time.monotonic() < give_up:
            time.sleep(0.05)
        after_child = cpu_by_part(pid)
        whole = cpu_seconds(pid)
    finally:
        child.kill()
        child.wait()
    assert after_child["children"] >= 0.28  # the child's own CPU, read while it lives
    # the main thread waited meanwhile: what the spinner and child used is not booked to it
    assert after_child["event_loop"] - before["event_loop"] < 0.25
    assert sum(after_child.values()) == pytest.approx(whole, abs=0.05)  # the parts make the whole


def test_log_cost_by_part_is_each_rounds_difference_from_logging_off_its_median_taken():
    def r(rps: float, loop: float, threads: float, kids: float) -> dict[str, Any]:
        by_part = {"event_loop": loop, "worker_threads": threads, "children": kids}
        return {**_round(rps, loop + threads + kids), "cpu_us_per_request_by_part": by_part}

    rounds = {
        "worker": [r(900, 260, 45, 30), r(950, 250, 40, 28), r(700, 300, 60, 40)],
        "worker_requests_only": [r(1000, 262, 35, 7), r(990, 255, 33, 6), r(800, 280, 40, 8)],
        "worker_segmenter_process": [r(900, 300, 40, 0), r(900, 300, 40, 0), r(900, 300, 40, 0)],
        "worker_nolog": [r(1000, 258, 35, 0), r(1000, 252, 32, 0), r(800, 290, 50, 0)],
    }
    extra = log_cost_ratios(rounds)["log_cpu_us_per_request_by_part"]
    # worker: loop +2, -2, +10 -> 2; threads +10, +8, +10 -> 10; children 30, 28, 40 -> 30
    assert extra["worker"] == {"event_loop": 2.0, "worker_threads": 10.0, "children": 30.0}
    assert extra["worker_requests_only"] == {
        "event_loop": 3.0,
        "worker_threads": 0.0,
        "children": 7.0,
    }


def test_the_p95_target_counts_only_where_the_logging_off_worker_had_headroom():
    """At a rate near its own capacity, P95s compare two queues, not two log paths."""
    import json
    from pathlib import Path

    from bench.serving import targets

    saved = json.loads((Path(__file__).parents[2] / "bench/results/serving.json").read_text())

    def p95_target(nolog_rps: float) -> tuple[bool, str]:
        r = {
            **saved,
            "worker_nolog_rps": nolog_rps,
            "worker_segmenter_process_rps": 1500.0,
            "worker_segmenter_process_over_nolog_rps": 0.7,
        }
        r["p95_at_2000_ms_by_mode"] = {
            "worker_nolog": 10.0,
            "worker_requests_only": 10.5,
            "worker": 11.0,
            "worker_segmenter_process": 12.0,
        }
        (t,) = [t for t in targets(r) if t.name.startswith("p95 at 2000")]
        return t.met, t.target

    assert p95_target(4000.0)[0]  # 50 % of capacity: a ratio of 1.1 meets it
    met, target = p95_target(2100.0)  # 95 %: the same ratio counts for nothing
    assert not met and "it was 95%" in target

"""bench.serving's CPU figures: CPU per request and CPU share over one window, and the
logging-on over logging-off throughput ratio with each server's CPU share taken out."""

from __future__ import annotations

import os
import time

import pytest

from bench.log_figures import cpu_figures, cpu_seconds, per_cpu_figures


def test_cpu_figures_divide_one_windows_cpu_by_that_windows_answers_and_wall_time():
    figures = cpu_figures(cpu_s=0.6, answered=3000, wall_s=2.0)
    assert figures == {"cpu_us_per_request": 200.0, "cpu_share": 0.3}


def test_cpu_figures_of_an_idle_window_are_zero_not_a_division_error():
    assert cpu_figures(cpu_s=0.0, answered=0, wall_s=0.0) == {
        "cpu_us_per_request": 0.0,
        "cpu_share": 0.0,
    }


def test_a_worker_given_more_cpu_but_costlier_per_request_is_slower_per_cpu_second():
    # the shared-host case: logging on wins more CPU (more req/s) yet costs more per request
    worker = [{"cpu_us_per_request": 300.0}, {"cpu_us_per_request": 250.0}]
    nolog = [{"cpu_us_per_request": 210.0}, {"cpu_us_per_request": 200.0}]
    figures = per_cpu_figures(worker, nolog)
    assert figures["worker_over_nolog_rps_per_cpu_rounds"] == [0.7, 0.8]
    assert figures["worker_over_nolog_rps_per_cpu"] == pytest.approx(0.75)


def test_per_cpu_ratio_skips_a_round_with_no_cpu_measured():
    figures = per_cpu_figures([{"cpu_us_per_request": 0.0}], [{"cpu_us_per_request": 200.0}])
    assert figures == {
        "worker_over_nolog_rps_per_cpu_rounds": [],
        "worker_over_nolog_rps_per_cpu": None,
    }


def test_cpu_seconds_of_this_process_grow_with_the_work_it_does():
    before = cpu_seconds(os.getpid())
    deadline, give_up = before + 0.05, time.monotonic() + 10
    while cpu_seconds(os.getpid()) < deadline and time.monotonic() < give_up:
        sum(range(10_000))
    assert cpu_seconds(os.getpid()) >= deadline

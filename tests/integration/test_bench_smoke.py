"""Every benchmark still runs: each `python -m bench.X` at a tiny size, its JSON in a temp dir.

Benchmarks are not tests, so nothing else would notice one rotting (bench.release did, when the
release grew a canary stage). The figures at these sizes mean nothing; what is checked is that
each module runs to the end, writes its JSON where it is told, and leaves bench/results alone.
The modules run side by side (most of their time is process start-up, servers and sleeps), so
the whole module takes about as long as the slowest, bench.release (~1.5 min on 2 busy cores).
bench.gate has its own test (tests/integration/test_bench_gate.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# Bench modules that are not run here, and what runs them instead.
COVERED_ELSEWHERE = {
    "gate": "tests/integration/test_bench_gate.py",
    "figures": "tests/unit/test_bench_figures.py (the docs' table matches bench/results)",
    "load": "bench.serving's load generators, run by the serving smoke",
    "baselines": "bench.serving's echo and naive baselines, run by the serving smoke",
    "log_figures": "bench.serving's log-path figures, run by the serving smoke",
    "gate_replay": "bench.gate's offline replay, run by tests/integration/test_bench_gate.py",
    "mirror_cost": "bench.serving's mirror_p95_cost (shadow off and on), run by the serving smoke",
    "scratch": "the scratch directory of the benches below; every smoke run of those uses it",
    "saved": "how every bench writes its JSON; each smoke run below saves through it, and "
    "tests/unit/test_bench_figures.py reads what it stamps",
    "proportions": "the Wilson interval bench.drift, bench.attribution and the figures state; "
    "tests/unit/test_bench_figures.py checks it against known answers",
    "chaos_release": "bench.chaos's release kills on the deployed stack (--release-kills); too slow "
    "for the smoke, which runs the worker and ingester kills",
}
TIMEOUT_S = 420

# Tiny sizes; each run also gets `--out` into its own temp dir.
COMMANDS: dict[str, str] = {
    "release": "--events 12000 --epochs 1 --hash-mb 16",
    "store": "--size-mb 8 --rounds 1",
    "serving": "--train-events 4000 --seconds 3 --rounds 1 --warmup 2 --connections 4 "
    "--binary-connections 1 --binary-depth 4 --raw-seconds 0.2 "
    "--sweep-start 50 --sweep-max 60 --sweep-seconds 0.5 --p95-rounds 1 --mirror-rounds 2",
    "rollback": "--workers 2,3 --cycles 2 --rps 20 --events 4000 --renewals 3",
    "impact": "--rows 20000",
    "gpu_check": "--events 4000 --batches 1,16 --seconds 0.01",
    "drift": "--clean 4 --episodes 1 --episode-windows 2 --sizes 400 "
    "--reference-rows 4000 --cost-rows 2000",
    "capacity": "--quick",  # one costlier and one twin check on a real worker (~80 s)
    "experiment": "--releases 3 --users 200 --rows-10m 20000",
    "log_record": "--batches 40 --repeats 1",
    "attribution": "--requests 1500 --train-events 4000 --calibration-runs 3",
    # two worker kills and the logging cost; no release kills: each needs a deployed stack and
    # two trained releases (minutes), and test_deployments_e2e already loses a release's host
    "chaos": "--worker-kills 2 --ingester-kill-every 1 --connections 4 --binary-connections 1 "
    "--binary-depth 4 --release-kills 0 --events 6000 --logging-rounds 1 --logging-seconds 1",
}


@dataclass
class BenchRun:
    process: subprocess.Popen[bytes]
    out: Path
    log: Path

    def finish(self) -> dict[str, Any]:
        """Wait for the run; its JSON, or a failure carrying the end of its log."""
        try:
            code = self.process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {TIMEOUT_S} s:\n{self.tail()}")
        assert code == 0, f"exit code {code}:\n{self.tail()}"
        assert self.out.is_file(), f"no JSON at {self.out}:\n{self.tail()}"
        figures = json.loads(self.out.read_text())
        # stamped by bench.saved: the docs' table says when and on what each row was measured
        assert figures["measured_at"] and figures["host"]["cpus"] == os.cpu_count()
        return figures

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def _env(home: Path) -> dict[str, str]:
    """The test's environment without Relay or Prefect connections: a private home for each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "PREFECT_"))}
    env.update(
        RELAY_HOME=str(home / "relay"),
        PREFECT_HOME=str(home / "prefect"),  # no PREFECT_API_URL: bench.release starts its own
        PYTHONUNBUFFERED="1",
    )
    return env


def _digests() -> dict[str, str]:
    return {
        f"{name}.json": hashlib.sha256(path.read_bytes()).hexdigest()
        for name in COMMANDS
        if (path := RESULTS / f"{name}.json").is_file()
    }


@dataclass
class Smoke:
    runs: dict[str, BenchRun]
    results_before: dict[str, str]  # bench/results/<name>.json digests before any run

    def __getitem__(self, name: str) -> BenchRun:
        return self.runs[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Smoke]:
    """Every benchmark started at once, each in its own process group and home."""
    before = _digests()
    started: dict[str, BenchRun] = {}
    try:
        for name, flags in COMMANDS.items():
            home = tmp_path_factory.mktemp(f"bench-{name}")
            out, log = home / f"{name}.json", home / "log.txt"
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    [sys.executable, "-m", f"bench.{name}", *shlex.split(flags), "--out", str(out)],
                    cwd=ROOT,
                    env=_env(home),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its servers and workers go with it on teardown
                )
            started[name] = BenchRun(process, out, log)
        yield Smoke(started, before)
    finally:
        for run in started.values():
            if run.process.poll() is None:
                os.killpg(run.process.pid, signal.SIGKILL)
                run.process.wait()


def test_every_bench_module_is_smoke_tested():
    modules = {p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__"}
    assert modules - set(COVERED_ELSEWHERE) == set(COMMANDS)


def test_bench_capacity_runs_a_costlier_and_a_twin_check(runs):
    figures = runs["capacity"].finish()
    assert [r["case"] for r in figures["runs"]] == ["costlier", "twin"]
    assert all(
        r["verdict"] in ("passed", "failed", "inconclusive", "error") for r in figures["runs"]
    )
    assert figures["wall_s_max"] <= 120  # each check inside its hard budget
    # the costlier canary's plant is 30 % of the champion's CPU per request, measured in this run
    assert figures["champion_cpu_ms_per_request"] > 0
    assert figures["plant_cpu_ms_per_request"] == pytest.approx(
        0.3 * figures["champion_cpu_ms_per_request"], abs=1e-3
    )
    gate = json.loads(runs["capacity"].out.with_name("gate.json").read_text())
    assert set(gate["capacity_check"]) >= {"flag_rate_costlier", "flag_rate_twin", "wall_s_max"}


def test_bench_release_runs_the_flow_without_a_fleet(runs):
    figures = runs["release"].finish()
    # 12,000 events seldom make a model the blessing accepts; either way the flow ran to the end.
    assert figures["deploy"] is False
    assert figures["outcome"] in {"blessed", "not_deployed"}
    assert {"train-ctr-model", "register-candidate", "assess-calibration"} <= set(
        figures["stage_s"]
    )
    assert figures["hash_gb_s"] > 0 and figures["openssl_sha256_gb_s"] > 0


def test_bench_store_runs_against_an_s3_server(runs):
    figures = runs["store"].finish()
    assert figures["artifact_mb"] == 8
    assert min(figures[f"{k}_mb_s"] for k in ("store_put", "raw_put", "store_get", "raw_get")) > 0


def test_bench_serving_measures_every_scenario(runs):
    figures = runs["serving"].finish()
    from bench.serving import SCENARIOS

    for scenario in SCENARIOS:
        assert figures[f"{scenario}_rps"] > 0, scenario
    assert figures["raw_rps"] > 0 and figures["slo_sweep"]
    assert {t["name"] for t in figures["targets"]} >= {"worker_rps / echo_rps"}
    modes = figures["p95_at_2000_ms_by_mode"]
    assert set(modes) == {
        "worker_nolog",
        "worker_requests_only",
        "worker",
        "worker_segmenter_process",
    }
    assert figures["write_rows_s"] > 0 and figures["ingest_rows_s"] > 0
    # every row the worker spooled was ingested, and is in the tables
    assert figures["ingest_rows_by_table"] == figures["ingest_landed_rows_by_table"]
    assert figures["ingest_rows_by_table"]["impressions"] > 0
    # the default worker copies its write-ahead records into segments, the comparison encodes
    assert figures["worker_segments_by"]["copy"] > 0
    assert all(v > 0 for v in figures["spool_bytes_per_row"].values())
    assert figures["mirror_p95_ms_by_mode"]["on"] > 0 and figures["mirror_counts"]["mirrored"] > 0


def test_bench_log_record_measures_both_forms_at_every_batch_size(runs):
    figures = runs["log_record"].finish()
    assert [c["requests_per_batch"] for c in figures["cases"]] == [1, 4, 16]
    for case in figures["cases"]:
        for key in ("answer_path_us_per_batch", "writer_us_per_batch"):
            assert set(case[key]) == {"record", "journal"} and min(case[key].values()) > 0, key


def test_bench_rollback_rolls_a_canary_back_under_traffic(runs):
    figures = runs["rollback"].finish()
    assert set(figures["rollback_ms_p95_by_workers"]) == {"2", "3"}
    for size in figures["by_workers"].values():  # one cycle on a warm pool, one on a cold one
        assert size["cycles"] == 2 and size["warm_pool_cycles"] == size["cold_pool_cycles"] == 1
        assert size["rollback_ms_p50"] > 0 and size["renewal"]["renewal_ms_p50"] > 0
        assert size["requests_total"] > 0 and size["requests_failed_during_rollback"] == 0
    assert [row["lease_s"] for row in figures["lease_cost_at_workers"]["by_lease"]] == [
        15.0,
        30.0,
        60.0,
        90.0,
    ]


def test_bench_impact_builds_the_report(runs):
    figures = runs["impact"].finish()
    assert figures["rows"] > 10_000 and figures["sessions"] > 0 and figures["total_s"] > 0


def test_bench_experiment_plants_releases_through_the_query_and_estimator(runs):
    figures = runs["experiment"].finish()
    assert figures["releases_per_case"] == {"orders_plus_3pct": 3, "gmv_minus_2pct": 3, "zero": 3}
    metrics = {"click_through", "orders_per_user", "gmv_per_user", "latency_ms"}
    assert set(figures["coverage_by_metric"]) == metrics
    assert all(0 <= v <= 1 for v in figures["coverage_by_metric"].values())
    assert set(figures["cuped_variance_reduction"]) == metrics
    assert figures["query_s_10m"] > 0 and figures["history_build_s_100"] > 0


def test_bench_gpu_check_runs_here_and_says_what_it_did_with_tensorrt(runs):
    figures = runs["gpu_check"].finish()
    assert figures["latency"]["ort-fp32"]["16"]["p50_ms"] > 0
    if figures["host"]["gpu"] is None:  # no CUDA or no tensorrt here: skipped, and why
        assert figures["tensorrt"]["status"] == "skipped"
        assert figures["tensorrt"]["reason"].startswith("skipped: ")
        assert set(figures["latency"]) == {"ort-fp32"}
    else:
        assert figures["tensorrt"]["status"] in {"built", "rejected"}


def test_bench_attribution_reports_every_planted_case_on_a_real_worker(runs):
    figures = runs["attribution"].finish()
    cases = {c["name"]: c for c in figures["cases"]}
    assert set(cases) == {
        "compute",
        "preprocess",
        "queue",
        "heavier",
        "two_causes",
        "load",
        "no_change",
    }
    statuses = {"attributed", "cannot_separate", "no_change", "too_few_rows", "failed"}
    for case in cases.values():
        assert {"planted", "status", "top_causes", "correct", "wall_s"} <= set(case)
        assert case["status"] in statuses and case["wall_s"] > 0 and case["statement"]
    # Whether a case is named correctly is what the benchmark measures (bench/results), not
    # what this smoke checks: here eleven benchmarks share two cores, and the queue plant (one
    # request per engine call) acts only while requests are in flight together. A fresh-clone
    # run measured 0.4 in flight, nothing to queue behind, and the case fell to postprocess.
    assert figures["resamples_min"] >= 200 and 0 <= figures["coverage_90"] <= 1


def test_bench_chaos_kills_workers_and_finds_a_row_for_every_answered_request(runs):
    figures = runs["chaos"].finish()
    assert figures["worker_kills"] == 2 and figures["answered"] > 0
    assert figures["rows_lost"] == 0 and figures["rows_duplicated"] == 0
    # an ingester ran throughout and was killed under load each time; both transports answered
    assert figures["concurrent_ingestion"] and figures["ingester_kills"] == 2
    assert figures["transports"] == ["binary", "http"]
    assert all(t["answered"] > 0 for t in figures["by_transport"].values())
    assert figures["rows_logged"] >= figures["answered"]
    # every answered request's impressions too: all its candidates, each rank once
    assert figures["impressions_lost"] == 0 and figures["impressions_duplicated"] == 0
    assert figures["impression_rows"] >= 20 * figures["answered"]
    assert figures["worker_nolog_rps"] > 0 and figures["logging_cost"] is not None


def test_smoke_runs_leave_bench_results_alone(runs):
    for run in runs.runs.values():
        run.finish()
    assert _digests() == runs.results_before


def test_bench_drift_reports_every_detector_side_by_side(runs):
    figures = runs["drift"].finish()
    (block,) = figures["by_window_size"]
    assert set(block["false_alarm_rate"]) == {"distance_score", "per_feature", "combined"}
    assert len(block["shifts"]) == 6  # three kinds, small and large
    shift = block["shifts"]["device_mix_large"]
    assert shift["detection_rate"]["combined"]["n"] == 2
    assert "combined_s" in figures["cost_per_window"]

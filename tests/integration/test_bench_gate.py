"""`python -m bench.gate` at a tiny size: it records from real workers, replays through the gate,
and writes the figures the canary issue names, so the benchmark cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relay_testing.deployed_stack import REPO

pytestmark = pytest.mark.slow


def test_gate_benchmark_runs_small_and_writes_its_named_figures(tmp_path: Path) -> None:
    out = tmp_path / "gate.json"
    recordings = tmp_path / "recordings.npz"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gate",
            "--releases",
            "4",
            "--record-s",
            "4",
            "--live-aa",
            "0",
            "--live-ab",
            "0",
            "--out",
            str(out),
            "--recordings",
            str(recordings),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures["recordings"]) == {"light", "heavy"} and recordings.exists()
    for rule in ("sequential", "point_p95"):
        summary = figures["offline"][rule]
        assert 0.0 <= summary["aa_false_rollback_rate"] <= 1.0
        assert set(summary["detection_rate_by_regression"]) == {
            "+10%",
            "+25%",
            "+50%",
            "+100%",
            "+1pt errors",
        }
        assert summary["median_windows_to_verdict"] >= 1
    cases = figures["offline"]["cases"]
    assert len(cases) == 2 * 2 * 6 * 2  # loads x traffic x regressions x rules
    assert all(c["releases"] == 4 for c in cases)

"""`python -m bench.gate --quick`: it records from real workers, replays every case through the
gate's own loop and writes the figures the gate issue names, so the benchmark cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gate_replay import REGRESSIONS
from relay_testing.deployed_stack import REPO

pytestmark = pytest.mark.slow

CASE_FIELDS = {
    "load",
    "traffic_rps",
    "regression",
    "p95_ratio_at_peak",
    "rolled_back",
    "refused_before_users",
    "paused",
    "promoted",
    "median_s_to_verdict",
}


def test_gate_benchmark_quick_writes_one_row_per_case_with_its_named_figures(
    tmp_path: Path,
) -> None:
    out = tmp_path / "gate.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.gate", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    for key in ("mirror_p95_cost", "capacity_check", "srm", "live_aa", "live_ab", "total_seconds"):
        assert key in figures, key
    assert {"windows_to_detect", "aa_flag_rate"} <= set(figures["srm"])
    assert {"flag_rate_costlier", "flag_rate_twin", "wall_s_max"} <= set(figures["capacity_check"])
    cases = figures["cases"]
    assert len(cases) == 2 * 2 * len(REGRESSIONS)  # loads x traffic x regressions, none pooled
    rows = {(c["load"], c["traffic_rps"], c["regression"]) for c in cases}
    assert len(rows) == len(cases) and {c["load"] for c in cases} == {"light", "heavy"}
    for case in cases:
        assert set(case) >= CASE_FIELDS
        shares = [case[k] for k in ("rolled_back", "refused_before_users", "paused", "promoted")]
        assert sum(shares) == pytest.approx(1.0)
    uniform = {c["regression"]: c["p95_ratio_at_peak"] for c in cases}
    assert uniform["uniform x2"] == pytest.approx(2.0, rel=0.01) and uniform["aa"] == 1.0

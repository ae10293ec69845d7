"""The benchmark figures in the docs are the ones bench/results holds, copied by bench.figures."""

import json
from pathlib import Path

import pytest

from bench import figures


def test_docs_figures_match_the_saved_results():
    assert figures._blocks(), "no doc carries the <!-- figures:begin --> block"
    assert figures.main(["--check"]) == 0, "run `python -m bench.figures` after a benchmark run"


def test_a_figure_edited_by_hand_is_caught(tmp_path, monkeypatch):
    doc = tmp_path / "README.md"
    doc.write_text(f"x\n{figures.BEGIN}\n| `store` | get 999 MiB/s |\n{figures.END}\n")
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    assert figures.main(["--check"]) == 1
    assert figures.main([]) == 0
    assert "999" not in doc.read_text() and figures.main(["--check"]) == 0


def test_a_missing_field_reads_not_measured_rather_than_a_number(tmp_path, monkeypatch):
    (tmp_path / "impact.json").write_text(json.dumps({"rows": 10}))
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    rows = dict(figures.render_rows())
    assert rows["impact"] == [
        "not measured (query_s absent from impact.json)",
        "when measured: not recorded in impact.json (saved before benches stamped it)",
    ]
    assert rows["chaos"] == ["not measured"]


def test_each_row_says_when_and_on_what_its_figures_were_measured(tmp_path, monkeypatch):
    from bench.saved import save

    save(tmp_path / "impact.json", {"rows": 10, "host": {"cpus": 2, "loadavg_1m_at_end": 1.26}})
    saved = json.loads((tmp_path / "impact.json").read_text())
    assert saved["host"] == {"cpus": 2, "loadavg_1m_at_end": 1.26}  # what the bench set is kept
    saved["measured_at"] = "2026-12-06T19:04:31+00:00"
    (tmp_path / "impact.json").write_text(json.dumps(saved))
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    rows = dict(figures.render_rows())
    assert rows["impact"][-1] == "measured 2026-12-06 19:04 UTC on 2 CPUs (load 1.3 at the end)"


def test_a_save_that_fails_leaves_the_last_result_whole(tmp_path):
    from bench.saved import save

    out = tmp_path / "store.json"
    save(out, {"store_get_mb_s": 824.7})
    with pytest.raises(TypeError):
        save(out, {"store_get_mb_s": object()})  # not JSON: fails before anything is renamed
    assert json.loads(out.read_text())["store_get_mb_s"] == 824.7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.json"]


@pytest.mark.parametrize("name", sorted(figures.RENDERERS))
def test_every_saved_result_renders(name):
    rows = dict(figures.render_rows())
    assert rows[name] and all(isinstance(line, str) for line in rows[name])


def test_a_gate_run_keeps_the_capacity_and_mirror_figures_other_benches_measured(
    tmp_path: Path,
) -> None:
    from bench.gate import measured_elsewhere

    out = tmp_path / "gate.json"
    assert measured_elsewhere(out)["capacity_check"]["flag_rate_costlier"] is None  # never run
    assert measured_elsewhere(out)["mirror_p95_cost"] is None
    capacity = {"flag_rate_costlier": 0.1, "flag_rate_twin": 0.15, "wall_s_max": 35.5}
    out.write_text(json.dumps({"capacity_check": capacity, "cases": []}))
    (tmp_path / "serving_mirror.json").write_text(json.dumps({"mirror_p95_cost": 1.53}))
    kept = measured_elsewhere(out)
    assert kept["mirror_p95_cost"] == 1.53
    assert {k: kept["capacity_check"][k] for k in capacity} == capacity


def test_an_unreadable_gate_json_reads_as_never_measured_rather_than_crashing_the_run(
    tmp_path: Path,
) -> None:
    from bench.gate import measured_elsewhere

    out = tmp_path / "gate.json"
    out.write_text('{"capacity_check": {"flag_rate')  # cut short
    assert measured_elsewhere(out)["capacity_check"]["flag_rate_twin"] is None


def test_a_cost_reads_as_the_share_it_is_so_a_miss_is_not_rounded_onto_its_target():
    saved = {"worker_kills": 20, "answered": 9, "rows_lost": 0, "rows_duplicated": 0}
    lines = list(figures._chaos({**saved, "logging_cost": 0.1049, "fsync_cost": 0.0833}))
    assert "logging_cost: 10.5 %" in lines and "fsync_cost: 8.3 %" in lines, lines


def test_the_mirror_cost_reads_as_the_rise_it_is_not_as_the_ratio():
    # mirror_p95_cost is on / off - 1: 41.8 -> 105.9 ms is a cost of 1.53, a ratio of 2.53
    saved = {
        "mirror_p95_cost": 1.5329,
        "mirror_p95_ms_by_mode": {"off": 41.792, "on": 105.855},
        "mirror_config": {"rate_rps": 2000.0, "share": 0.2, "rounds": 3, "seconds": 5.0},
    }
    [line] = figures._serving_mirror(saved)
    assert "+153.3 % (x2.53" in line and "41.8 ms shadow off, 105.9 ms on" in line, line
    [unmeasured] = figures._serving_mirror({**saved, "mirror_p95_cost": None})
    assert "not measured (ratio of the modes' median P95s over 3" in unmeasured, unmeasured
    paired = {
        **saved,
        "mirror_p95_cost": 0.081,
        "mirror_p95_cost_interval": [-0.02, 0.2],
        "mirror_p95_cost_method": "median over 8 rounds ...",
        "mirror_config": {**saved["mirror_config"], "rounds": 8},
    }
    [line] = figures._serving_mirror(paired)
    assert "+8.1 % (x1.08) (95 % interval -2.0 % to 20.0 %" in line, line
    assert "median of 8 paired rounds" in line, line
    assert figures._gate_mirror(1.5329) == (
        "mirror P95 cost: stable's P95 with the shadow on over off +153.3 % (x2.53) "
        "(serving_mirror.json)"
    )


def test_a_mirror_only_run_keeps_the_gate_rows_copy_of_its_figure_current(tmp_path: Path):
    from bench.saved import update_key

    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps({"cases": [1], "mirror_p95_cost": 1.5329}))
    update_key(gate, "mirror_p95_cost", 0.3229)
    assert json.loads(gate.read_text()) == {"cases": [1], "mirror_p95_cost": 0.3229}
    update_key(tmp_path / "absent" / "gate.json", "mirror_p95_cost", 0.1)  # none: nothing written
    assert not (tmp_path / "absent").exists()


def test_the_wilson_interval_matches_known_answers() -> None:
    from bench.proportions import wilson

    # by hand: centre (p + z²/2n) / (1 + z²/n) = 0.87749, half-width 0.11363 (z = 1.96)
    assert wilson(19, 20) == pytest.approx([0.76386, 0.99112], abs=1e-5)
    assert wilson(0, 20) == pytest.approx([0.0, 0.16113], abs=1e-5)  # never below 0
    assert wilson(20, 20) == pytest.approx([0.83887, 1.0], abs=1e-5)  # nor above 1
    assert wilson(0, 0) == [0.0, 1.0]  # no runs: nothing is known

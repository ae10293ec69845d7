"""The benchmark figures in the docs are the ones bench/results holds, copied by bench.figures."""

import json

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
    assert rows["impact"] == ["not measured (query_s absent from impact.json)"]
    assert rows["chaos"] == ["not measured"]


@pytest.mark.parametrize("name", sorted(figures.RENDERERS))
def test_every_saved_result_renders(name):
    rows = dict(figures.render_rows())
    assert rows[name] and all(isinstance(line, str) for line in rows[name])

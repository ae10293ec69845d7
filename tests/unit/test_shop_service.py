"""The shop process's own checks: its drift file and its bounds, each refused naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.settings import get_settings
from simulation.drift import Drift
from simulation.shop_service import main, read_drift


def test_a_drift_file_plants_its_drift_and_no_file_plants_none(tmp_path: Path) -> None:
    path = tmp_path / "drift.json"
    assert read_drift(path) is None
    path.write_text('{"kind": "price_inflation", "magnitude": 0.3}')
    assert read_drift(path) == Drift("price_inflation", 0.3)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{nope", "not readable JSON"),
        ('["device_mix"]', 'must be {"kind": ..., "magnitude": ...}'),
        ('{"kind": "device_mix", "magnitude": "big"}', "magnitude must be a number"),
        ('{"kind": "moon_phase", "magnitude": 0.5}', "moon_phase"),
        ('{"kind": "device_mix", "magnitude": 5}', "out of range"),
    ],
)
def test_a_bad_drift_file_is_refused_naming_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "drift.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="") as refused:
        read_drift(path)
    assert problem in str(refused.value)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--rate-rps", "0"], "rate_rps"),
        (["--round-s", "7200"], "duration_s"),
        (["--max-hours", "0"], "--max-hours"),
    ],
)
def test_out_of_bounds_arguments_stop_the_shop_before_any_traffic(
    args: list[str],
    problem: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAY_SERVING_FLEET_URLS", "http://127.0.0.1:9")
    get_settings.cache_clear()  # another test may have read the settings already
    try:
        assert main(args) == 2
    finally:
        get_settings.cache_clear()
    assert problem in capsys.readouterr().err

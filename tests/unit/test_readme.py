"""The README stays true: every setting is documented, and the two commands are there."""

from pathlib import Path

from relay.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_has_a_row_in_the_readme():
    missing = [
        f"RELAY_{name.upper()}"
        for name in Settings.model_fields
        if f"RELAY_{name.upper()}" not in README
    ]
    assert missing == []


def test_readme_shows_the_two_commands():
    assert "make demo" in README and "make test" in README

"""The README is a front door that stays true, and so are the pages it leads to.

README.md stays short (<= 12 KB) and shows the two commands; every `make` target, `relay`
command and `RELAY_*` setting that README.md or docs/*.md names exists; every setting has its
row in docs/settings.md; every page the README links to is there; docs/benchmarks.md keeps the
markers the figures script fills.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from relay.settings import Settings
from relay_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
ALL_TEXT = {"README.md": README, **{f"docs/{name}": text for name, text in DOCS.items()}}
MAKEFILE = (ROOT / "Makefile").read_text()
# Environment variables read outside `Settings` (shell scripts, the Makefile, prefect.yaml).
OUTSIDE_SETTINGS = [
    ROOT / "Makefile",
    ROOT / "prefect.yaml",
    *sorted((ROOT / "deployments").rglob("*.sh")),
    *sorted((ROOT / "deployments").rglob("*.yaml")),
    *sorted((ROOT / "deployments").rglob("*.example")),
]


def setting_names() -> set[str]:
    return {f"RELAY_{name.upper()}" for name in Settings.model_fields}


def test_the_readme_is_a_front_door_of_at_most_12_kb() -> None:
    assert len(README.encode()) <= 12 * 1024


def test_readme_shows_the_two_commands() -> None:
    assert "make demo" in README and "make test" in README


def test_every_setting_has_a_row_in_the_settings_page() -> None:
    rows = {m for m in re.findall(r"^\| `(RELAY_[A-Z0-9_]+)`", DOCS["settings.md"], re.M)}
    # one row may name two settings: `RELAY_S3_ACCESS_KEY` / `RELAY_S3_SECRET_KEY`
    rows |= set(re.findall(r"`(RELAY_[A-Z0-9_]+)`", DOCS["settings.md"]))
    assert sorted(setting_names() - rows) == []


def named_settings(text: str) -> set[str]:
    """RELAY_ names in the text; `RELAY_S3_*` is the prefix RELAY_S3_."""
    return set(re.findall(r"RELAY_[A-Z0-9_]*[A-Z0-9]_?(?=\*)|RELAY_[A-Z0-9_]*[A-Z0-9]", text))


@pytest.mark.parametrize("page", sorted(ALL_TEXT))
def test_every_setting_a_page_names_exists(page: str) -> None:
    known = setting_names()
    elsewhere = "\n".join(p.read_text() for p in OUTSIDE_SETTINGS if p.is_file())
    missing = []
    for name in sorted(named_settings(ALL_TEXT[page])):
        if name.endswith("_"):  # a prefix: some setting must start with it
            found = any(k.startswith(name) for k in known)
        else:
            found = name in known or re.search(rf"\b{name}\b", elsewhere) is not None
        if not found:
            missing.append(name)
    assert missing == [], f"{page} names settings nothing reads"


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", MAKEFILE, re.M))


def named_make_targets(text: str) -> set[str]:
    inline = re.findall(r"`make ([a-z][a-z-]*)`", text)
    in_code = re.findall(r"^make ([a-z][a-z-]*)", text, re.M)
    return set(inline) | set(in_code)


@pytest.mark.parametrize("page", sorted(ALL_TEXT))
def test_every_make_target_a_page_names_exists(page: str) -> None:
    assert sorted(named_make_targets(ALL_TEXT[page]) - make_targets()) == []


def cli_commands() -> set[str]:
    """Every `relay` command and sub-command, as `lineage`, `lineage show`, ..."""
    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found.add(f"{prefix}{name}")
                    walk(child, f"{prefix}{name} ")

    walk(build_parser(), "")
    return found


def named_cli_commands(text: str) -> set[str]:
    """`relay x`, `relay x y|z` inline, and `relay x y` at the start of a code line."""
    named: set[str] = set()
    for first, second in re.findall(r"`relay ([a-z]+)(?: ([a-z|]+))?", text) + re.findall(
        r"^relay ([a-z]+)(?: ([a-z]+))?", text, re.M
    ):
        named.add(first)
        named |= {f"{first} {s}" for s in second.split("|") if s}
    return named


@pytest.mark.parametrize("page", sorted(ALL_TEXT))
def test_every_cli_command_a_page_names_exists(page: str) -> None:
    assert sorted(named_cli_commands(ALL_TEXT[page]) - cli_commands()) == []


def test_the_checks_catch_a_made_up_target_command_and_setting() -> None:
    text = "run `make deploy-all`, then `relay lineage blame x`; set RELAY_NO_SUCH_THING"
    assert named_make_targets(text) - make_targets() == {"deploy-all"}
    assert named_cli_commands(text) - cli_commands() == {"lineage blame"}
    assert "RELAY_NO_SUCH_THING" in named_settings(text) - setting_names()


@pytest.mark.parametrize("page", sorted(ALL_TEXT))
def test_every_relative_link_leads_to_a_file(page: str) -> None:
    base = (ROOT / page).parent
    links = re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", ALL_TEXT[page])
    assert [link for link in links if not (base / link).is_file()] == []


def test_the_readme_leads_to_every_topic_page() -> None:
    for topic in ("release", "gate", "serving", "store", "impact", "drift", "scale"):
        assert f"(docs/{topic}.md)" in README, topic
    assert "(docs/benchmarks.md)" in README and "(docs/settings.md)" in README


def test_the_benchmark_page_keeps_the_markers_the_figures_script_fills() -> None:
    page = DOCS["benchmarks.md"]
    assert page.count("<!-- figures:begin -->") == 1 and page.count("<!-- figures:end -->") == 1
    assert page.index("<!-- figures:begin -->") < page.index("<!-- figures:end -->")

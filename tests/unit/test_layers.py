"""The layers of ARCHITECTURE.md hold: `lint-imports` keeps every contract in pyproject.toml.

The contracts (pyproject.toml, `[tool.importlinter]`): imports point downward only, flows ->
tasks -> (core, serving, simulation) -> (model_store, logstore) -> relay; the domain core
imports no Prefect and no tasks; the serving worker never imports tasks or flows; nothing below
tasks imports Prefect. Module-level circles are tests/unit/test_import_cycles.py's: import-linter
checks packages against layers, not cycles between modules of one package.

The second and third tests run the same contracts over a small tree with one planted violation
each, so a contract that stopped checking anything would be noticed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the dev extra (import-linter)")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_projects_imports_keep_every_layering_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert f"Contracts: {len(contracts['contracts'])} kept, 0 broken." in result.stdout


def planted_tree(tmp_path: Path, module: str, source: str) -> Path:
    """Every root package of the contracts, empty, with the project's pyproject and one module."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in config["root_packages"]:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "tasks" / "calibration.py").write_text('"""A task module."""\n')
    path = tmp_path / (module.replace(".", "/") + ".py")
    path.write_text(source)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_a_store_module_importing_tasks_breaks_the_layers(tmp_path: Path) -> None:
    tree = planted_tree(tmp_path, "model_store.migrate", "import tasks.calibration\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "model_store.migrate -> tasks.calibration" in result.stdout
    assert "Layers: flows -> tasks" in result.stdout and "BROKEN" in result.stdout


def test_the_core_importing_prefect_breaks_its_contract_but_a_type_checking_import_does_not(
    tmp_path: Path,
) -> None:
    tree = planted_tree(
        tmp_path,
        "core.rules",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import tasks.calibration\n\n"
        "def decide() -> None:\n    from prefect import task  # deferred: still an import\n",
    )
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "core.rules -> prefect" in result.stdout
    assert "core.rules -> tasks" not in result.stdout

"""No import circle in the project: every module's imports, walked with `ast`, form no cycle.

What counts as an edge, and why:

- Every `import x` and `from x import y` anywhere in a module, function bodies included. A
  deferred import inside a function does not break a circle, it hides one: both circles this
  test was written for (`serving.engine` ↔ `serving.tensorrt_engine`, `tasks.impact` ↔
  `core.impact.report`) were closed by an import inside a function, commented "here: that
  module imports this one". Deferring a *third-party* import (torch, tensorrt, matplotlib) to
  keep start-up cheap is fine and unaffected: only project modules are nodes.
- Not imports under `if TYPE_CHECKING:`: they never run, and are the usual way to name a type
  from a module that imports you.
- `from x import y` is an edge to the module `x.y` when that is a project module, else to `x`
  (its `__init__`); relative imports are resolved against the importing module. Importing
  `a.b` is not also counted as importing `a`: a package's `__init__` re-exporting its
  submodules, which import their siblings, is not a circle in the design.

The nodes are modules, not packages: layering between packages is a separate rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The packages the shared design names; any other top-level package found is walked too.
PACKAGES = ("relay", "model_store", "logstore", "serving", "simulation", "tasks", "flows", "bench")
NOT_WALKED = ("tests",)


@dataclass(frozen=True)
class ImportEdge:
    """`source` imports `target` at `line` of its file."""

    source: str
    target: str
    line: int


def find_packages(root: Path) -> list[str]:
    """Top-level packages under root (directories with an __init__.py), tests excluded."""
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file() and p.name not in NOT_WALKED
    )


def find_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_in(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, in functions too; not under `if TYPE_CHECKING:`."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports_in(node.orelse)
        else:
            yield from _imports_in(ast.iter_child_nodes(node))


def _within(name: str, modules: dict[str, Path]) -> str | None:
    """The longest leading part of a dotted name that is a project module, if any."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def import_edges(modules: dict[str, Path]) -> list[ImportEdge]:
    """Every import from one project module of another (self-imports left out)."""
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports_in(tree.body):
            targets: list[str | None]
            if isinstance(node, ast.Import):
                targets = [_within(alias.name, modules) for alias in node.names]
            else:
                base = _from_base(node, module, path.name == "__init__.py")
                targets = [
                    f"{base}.{alias.name}"
                    if f"{base}.{alias.name}" in modules
                    else _within(base, modules)
                    for alias in node.names
                ]
            edges += [
                ImportEdge(module, target, node.lineno)
                for target in dict.fromkeys(targets)
                if target is not None and target != module
            ]
    return edges


def find_cycles(edges: Iterable[ImportEdge]) -> list[list[ImportEdge]]:
    """One concrete cycle per strongly connected group of modules, each as the edges around it."""
    graph: dict[str, dict[str, ImportEdge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
        graph.setdefault(edge.target, {})
    cycles = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            cycles.append(_cycle_through(min(group), group, graph))
    return sorted(cycles, key=lambda c: c[0].source)


def _strongly_connected(graph: dict[str, dict[str, ImportEdge]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (import chains can be deeper than a comfortable stack)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups


def _cycle_through(
    start: str, group: set[str], graph: dict[str, dict[str, ImportEdge]]
) -> list[ImportEdge]:
    """The shortest cycle from start back to itself inside its group (breadth-first)."""
    came_by: dict[str, ImportEdge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target, edge in sorted(graph[node].items()):
                if target not in group:
                    continue
                if target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came_by[path[0].source])
                    return path
                if target not in came_by:
                    came_by[target] = edge
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected group but on no cycle")


def describe(cycle: list[ImportEdge], modules: dict[str, Path], root: Path) -> str:
    """A cycle as `a → b → a`, with the file and line of each import in it."""
    names = " → ".join([cycle[0].source, *(e.target for e in cycle)])
    where = "; ".join(
        f"{modules[e.source].relative_to(root)}:{e.line} imports {e.target}" for e in cycle
    )
    return f"{names} ({where})"


def cycles_in(root: Path, packages: Iterable[str]) -> list[str]:
    modules = find_modules(root, packages)
    return [describe(c, modules, root) for c in find_cycles(import_edges(modules))]


# -- the project ---------------------------------------------------------------------------------
def test_the_project_has_no_import_cycle() -> None:
    packages = find_packages(ROOT)
    assert set(PACKAGES) <= set(packages), f"packages missing from {ROOT}: {packages}"
    assert cycles_in(ROOT, packages) == []


def test_every_project_module_is_walked() -> None:
    modules = find_modules(ROOT, find_packages(ROOT))
    # the modules the two former circles ran through, and the module that broke one of them
    for name in ("serving.engine", "serving.loading", "tasks.impact", "core.impact.report"):
        assert name in modules
    edges = {(e.source, e.target) for e in import_edges(modules)}
    assert ("serving.loading", "serving.tensorrt_engine") in edges
    assert ("serving.tensorrt_engine", "serving.engine") in edges
    assert ("tasks.impact", "core.impact.report") in edges


# -- the detector, on synthetic packages ---------------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_circle_closed_inside_a_function_is_found_and_named(tmp_path: Path) -> None:
    # the shape serving.engine ↔ serving.tensorrt_engine had
    root = _package(
        tmp_path,
        {
            "srv/__init__.py": "",
            "srv/engine.py": (
                "def load_model():\n"
                "    from srv.tensorrt_engine import load_local_plan  # that one imports this\n"
                "    return load_local_plan()\n"
            ),
            "srv/tensorrt_engine.py": "from srv.engine import warmed\n",
        },
    )
    assert cycles_in(root, ["srv"]) == [
        "srv.engine → srv.tensorrt_engine → srv.engine ("
        "srv/engine.py:2 imports srv.tensorrt_engine; "
        "srv/tensorrt_engine.py:1 imports srv.engine)"
    ]


def test_a_longer_circle_through_relative_and_package_imports_is_found(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from . import b\nA = 1\n",  # `from . import b` is the module pkg.b
            "pkg/b.py": "import numpy\nfrom .sub.c import C\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from ..a import A\nC = A\n",
        },
    )
    (cycle,) = cycles_in(root, ["pkg"])
    assert cycle.startswith("pkg.a → pkg.b → pkg.sub.c → pkg.a (")


def test_type_checking_imports_and_a_policy_module_above_both_are_not_circles(
    tmp_path: Path,
) -> None:
    # the shape after the fix: the chooser imports both engines, neither imports it or the other
    root = _package(
        tmp_path,
        {
            "srv/__init__.py": "",
            "srv/engine.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from srv.loading import load_model\n"
            ),
            "srv/tensorrt_engine.py": "from srv.engine import warmed\n",
            "srv/loading.py": "from srv.engine import x\nfrom srv.tensorrt_engine import y\n",
        },
    )
    assert cycles_in(root, ["srv"]) == []


@pytest.mark.parametrize("deferred", [True, False])
def test_a_module_and_its_helper_importing_each_other_is_a_circle(
    tmp_path: Path, deferred: bool
) -> None:
    # the shape tasks.impact ↔ core.impact.report had, with the helper's import deferred or not
    helper_import = (
        "def render():\n    from tk.impact_report import render_html\n"
        if deferred
        else "from tk.impact_report import render_html\n"
    )
    root = _package(
        tmp_path,
        {
            "tk/__init__.py": "",
            "tk/impact.py": helper_import,
            "tk/impact_report.py": "from tk.impact import ImpactReport\n",
        },
    )
    (cycle,) = cycles_in(root, ["tk"])
    assert cycle.startswith("tk.impact → tk.impact_report → tk.impact (")

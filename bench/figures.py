"""The benchmark-figures table in the docs, rendered from bench/results/*.json, never typed.

`python -m bench.figures` rewrites the block between `<!-- figures:begin -->` and
`<!-- figures:end -->` in every Markdown file under the repository that has one;
`python -m bench.figures --check` exits 1 when a block differs from what the results say
(tests/unit/test_bench_figures.py runs the check, so a figure edited by hand fails the suite).
A result file that is missing, or a field a renderer needs that is absent, reads "not measured":
the table never shows a figure that no run produced.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BEGIN = "<!-- figures:begin -->"
END = "<!-- figures:end -->"
NOT_MEASURED = "not measured"


class Missing(KeyError):
    """A field a renderer reads is absent from the result file."""


def _get(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise Missing(path)
        node = node[part]
    return node


def _num(value: Any, digits: int = 1) -> str:
    """A number with thousands separators; integers without decimals."""
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and digits == 0):
        return f"{int(value):,}"
    return f"{float(value):,.{digits}f}"


def _pct(value: Any, digits: int = 1) -> str:
    return NOT_MEASURED if value is None else f"{100 * float(value):.{digits}f} %"


Renderer = Callable[[Mapping[str, Any]], Iterable[str]]
RENDERERS: dict[str, Renderer] = {}


def renders(name: str) -> Callable[[Renderer], Renderer]:
    """Register the renderer of bench/results/<name>.json."""

    def register(fn: Renderer) -> Renderer:
        RENDERERS[name] = fn
        return fn

    return register


@renders("release")
def _release(d: Mapping[str, Any]) -> Iterable[str]:
    stages = _get(d, "stage_s")
    yield (
        f"{_num(_get(d, 'events'))} events: wall {_num(_get(d, 'wall_s'))} s; "
        f"train {_num(stages.get('train-ctr-model'))} s, "
        f"validate {_num(stages.get('validate-training-data'))} s; "
        f"Prefect overhead {_pct(_get(d, 'prefect_overhead_fraction'))}; "
        f"hashing {_num(_get(d, 'hash_gb_s'), 2)} GB/s = {_num(_get(d, 'hash_vs_openssl'), 2)} x openssl"
    )


@renders("store")
def _store(d: Mapping[str, Any]) -> Iterable[str]:
    for key, value in d.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield f"{key} {_num(value, 2)}"


@renders("serving")
def _serving(d: Mapping[str, Any]) -> Iterable[str]:
    for key in (
        "echo_rps",
        "worker_rps",
        "worker_binary_rps",
        "worker_nolog_rps",
        "worker_requests_only_rps",
        "worker_tracing_rps",
        "worker_notrace_rps",
        "write_rows_s",
        "ingest_rows_s",
    ):
        if key in d:
            yield f"{key} {_num(d[key])}"
    if "p95_at_2000_ms_by_mode" in d:
        modes = ", ".join(f"{m} {_num(v)} ms" for m, v in d["p95_at_2000_ms_by_mode"].items())
        yield f"P95 at 2,000 req/s offered: {modes}"


@renders("rollback")
def _rollback(d: Mapping[str, Any]) -> Iterable[str]:
    p95 = _get(d, "rollback_ms_p95_by_workers")
    failed = d.get("requests_failed_by_workers", {})
    for workers, ms in p95.items():
        yield f"{workers} workers: p95 {_num(ms)} ms, {_num(failed.get(workers))} failed requests"


@renders("chaos")
def _chaos(d: Mapping[str, Any]) -> Iterable[str]:
    yield (
        f"{_num(_get(d, 'worker_kills'))} worker SIGKILLs: {_num(_get(d, 'answered'))} answered, "
        f"{_num(_get(d, 'rows_lost'))} rows lost, {_num(_get(d, 'rows_duplicated'))} duplicated"
    )
    for key in ("concurrent_ingestion", "ingester_kills", "transports", "release_kills", "lease_s"):
        if key in d:
            yield f"{key}: {d[key] if isinstance(d[key], str | list) else _num(d[key])}"


@renders("impact")
def _impact(d: Mapping[str, Any]) -> Iterable[str]:
    yield (
        f"{_num(_get(d, 'rows'))} rows: query {_num(_get(d, 'query_s'))} s + analysis "
        f"{_num(_get(d, 'analysis_s'))} s; peak RSS {_num(_get(d, 'peak_rss_mb'))} MB"
    )


def render_rows() -> list[tuple[str, list[str]]]:
    """Each benchmark's name and its figure lines, in a fixed order."""
    rows: list[tuple[str, list[str]]] = []
    for name, renderer in sorted(RENDERERS.items()):
        path = RESULTS / f"{name}.json"
        if not path.exists():
            rows.append((name, [NOT_MEASURED]))
            continue
        data = json.loads(path.read_text())
        try:
            lines = list(renderer(data))
        except Missing as missing:
            lines = [f"{NOT_MEASURED} ({missing.args[0]} absent from {path.name})"]
        rows.append((name, lines or [NOT_MEASURED]))
    return rows


def render_table() -> str:
    """The Markdown table between the markers."""
    out = [
        "| benchmark | figures (copied from bench/results/<name>.json by `python -m bench.figures`) |",
        "|---|---|",
    ]
    for name, lines in render_rows():
        out.append(f"| `{name}` | {'; '.join(lines)} |")
    return "\n".join(out)


def _blocks() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in docs if p.exists() and BEGIN in p.read_text()]


def _with_table(text: str, table: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = parser.parse_args(argv)
    table = render_table()
    stale = []
    for path in _blocks():
        text = path.read_text()
        wanted = _with_table(text, table)
        if wanted != text:
            stale.append(path)
            if not args.check:
                path.write_text(wanted)
    if args.check and stale:
        print("stale figures in: " + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

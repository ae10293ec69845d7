"""`relay impact history`: every release's experiment, from the model store alone.

Like `relay lineage`, it imports only the store, the settings and the history's light modules:
no Prefect, pandas or ClickHouse (tests/unit/test_relay_cli.py keeps it so).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from core.impact.experiment_types import METRICS
from core.impact.history import (
    build_history,
    canary_cell,
    effect_cell,
    elasticity_cell,
    latest_history_url,
)
from model_store import open_store
from relay.settings import get_settings


def _history(args: argparse.Namespace) -> int:
    store = open_store(get_settings())
    page = build_history(store, datetime.now(UTC))
    rows = page.rows[: args.limit] if args.limit else page.rows
    if args.html:
        args.html.write_text(page.html, encoding="utf-8")
    if args.json:
        print(json.dumps([json.loads(r.model_dump_json()) for r in rows], indent=2))
        return 0
    if not rows:
        print("no release experiments in the store yet")
        return 0
    head = ["time", "version", "outcome", "canary", "finding", *(m.key for m in METRICS)]
    print("\t".join([*head, "elasticity"]))
    for row in rows:
        e = row.experiment
        cells = [f"{row.when:%Y-%m-%d %H:%M}", e.version, e.outcome, canary_cell(row)]
        cells += [e.finding.value, *(effect_cell(row, m.key) for m in METRICS)]
        print("\t".join([*cells, elasticity_cell(row)]))
    print(f"\n{len(page.rows)} releases; newest first. Effects: relative, 95 % CI, * detected.")
    url = latest_history_url(store)
    if url:
        print(f"history page (last published): {url}")
    if args.html:
        print(f"written: {args.html}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`relay impact history`."""
    impact = sub.add_parser("impact", help="the business impact of releases")
    impact_sub = impact.add_subparsers(dest="impact_command", required=True)
    history = impact_sub.add_parser(
        "history", help="every release's experiment: effects on clicks, orders, GMV, latency"
    )
    history.add_argument("--limit", type=int, default=0, help="newest N releases (0: all)")
    history.add_argument("--html", type=Path, help="also write the history page to this file")
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(func=_history)

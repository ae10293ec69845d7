"""`relay lineage|alias|store`: what a version is made of, who moved an alias, and store gc.

These read the model store and nothing else, so they import only the store, the settings and
the lineage queries: no Prefect, torch or ClickHouse (tests/unit/test_relay_cli.py keeps it so),
and start in about a second instead of the ~5 s those imports cost. `store migrate`, a one-off
after upgrading, is the exception: it imports the pipeline's record models when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta

from core.lineage.queries import diff_versions, flatten_sources, show_lineage
from model_store import open_store
from model_store.store import version_at
from relay.errors import RelayError
from relay.settings import get_settings


def _at_time(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r}") from exc
    return when if when.tzinfo else when.replace(tzinfo=UTC)  # naive times are UTC


def _lineage_show(args: argparse.Namespace) -> int:
    view = show_lineage(open_store(get_settings()), args.ref)
    if args.json:
        print(view.model_dump_json(indent=2))
        return 0
    print(f"version     {view.version}")
    print(f"lineage id  {view.lineage_id}")
    print(f"created     {view.created_at.isoformat()}")
    print(f"mlflow run  {view.mlflow_run_id or '-'}")
    print(f"aliases     {', '.join(view.aliases) or '-'}")
    for part in view.parts:
        print(f"\n{part.name:<6} {part.digest}")
        sources = flatten_sources(part.sources)
        for name, value in sources.items():
            print(f"  {name}: {value}")
        if not sources:
            print("  (no sources recorded)")
    return 0


def _lineage_diff(args: argparse.Namespace) -> int:
    comparison = diff_versions(open_store(get_settings()), args.base, args.other)
    if args.json:
        print(comparison.model_dump_json(indent=2))
        return 0
    print(f"base   {comparison.base} ({comparison.base_lineage_id})")
    print(f"other  {comparison.other} ({comparison.other_lineage_id})")
    print(f"\n{comparison.headline}")
    if comparison.changed:
        for line in comparison.explanation:
            print(f"  {line}")
    if comparison.source_changes:
        print("\ninputs that differ:")
        for change in comparison.source_changes:
            print(f"  {change.part}: {change.field}: {change.base!r} -> {change.other!r}")
    return 0


def _alias_history(args: argparse.Namespace) -> int:
    history = open_store(get_settings()).alias_history(args.alias)
    if args.json:
        print(json.dumps([event.model_dump(mode="json") for event in history], indent=2))
        return 0
    if not history:
        print(f"alias {args.alias!r} has never been set")
        return 1
    for seq, event in enumerate(history):
        move = f"{event.previous or '-'} -> {event.version or '(cleared)'}"
        print(f"#{seq:<3} {event.at.isoformat()}  {move}  by {event.actor}: {event.reason}")
    if args.at is not None:
        held = version_at(history, args.at)
        print(f"\nat {args.at.isoformat()} {args.alias} pointed at {held or 'no version'}")
    return 0


def _store_gc(args: argparse.Namespace) -> int:
    store = open_store(get_settings())
    report = store.gc(min_age=timedelta(hours=args.min_age_hours), dry_run=args.dry_run)
    verb = "would delete" if report.dry_run else "deleted"
    print(
        f"gc of {store.backend.describe()} (blobs older than {report.cutoff.isoformat()}): "
        f"{verb} {len(report.deleted)} orphaned blobs ({report.freed_bytes / 2**20:.1f} MiB); "
        f"{report.referenced} referenced kept; {len(report.spared_recent)} recent orphans spared; "
        f"{report.leases_removed} expired leases; "
        f"{len(report.incomplete_uploads)} incomplete uploads {'found' if report.dry_run else 'removed'}"
    )
    for digest in report.deleted:
        print(f"  {verb}: {digest}")
    for upload in report.incomplete_uploads:
        print(f"  incomplete: {upload}")
    return 0


def _store_migrate(args: argparse.Namespace) -> int:
    # Here, not at the top: a one-off command; the others never load the records' models.
    from model_store.migrate import migrate_records

    store = open_store(get_settings())
    try:
        report = migrate_records(store)
    except RelayError as exc:
        print(f"relay: store migrate failed: {exc}", file=sys.stderr)
        return 2
    print(f"migrate of {store.backend.describe()} (old records are kept; gc still honours them):")
    for kind, counts in report.kinds.items():
        print(
            f"  {kind}: {counts.migrated} migrated, {counts.already_done} already done, "
            f"{len(counts.unreadable)} unreadable"
        )
    for key in report.converted_in_place:
        print(f"  converted in place: {key}")
    for item in report.unreadable:
        print(f"  unreadable: {item}", file=sys.stderr)
    if report.unreadable:
        print(
            f"relay: store migrate: {len(report.unreadable)} records could not be migrated",
            file=sys.stderr,
        )
        return 2
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`relay lineage show|diff`, `relay alias history` and `relay store gc|migrate`."""
    lineage = sub.add_parser("lineage", help="a version's lineage, or what changed between two")
    lineage_sub = lineage.add_subparsers(dest="lineage_command", required=True)
    show = lineage_sub.add_parser("show", help="the four lineage parts and where each came from")
    show.add_argument("ref", help="version or alias (e.g. champion)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=_lineage_show)
    diff = lineage_sub.add_parser("diff", help="which lineage part changed, and what it points at")
    diff.add_argument("base", help="version or alias")
    diff.add_argument("other", help="version or alias")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    diff.set_defaults(func=_lineage_diff)

    alias = sub.add_parser("alias", help="alias history: who moved it, when and why")
    alias_sub = alias.add_subparsers(dest="alias_command", required=True)
    history = alias_sub.add_parser("history", help="every move of an alias, oldest first")
    history.add_argument("alias", help="e.g. champion, candidate")
    history.add_argument(
        "--at", type=_at_time, help="also say which version it held then (ISO; naive = UTC)"
    )
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(func=_alias_history)

    store = sub.add_parser("store", help="model-store housekeeping")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    gc = store_sub.add_parser("gc", help="delete blobs no manifest references (and stale uploads)")
    gc.add_argument(
        "--min-age-hours", type=float, default=1.0, help="spare anything newer (default 1)"
    )
    gc.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    gc.set_defaults(func=_store_gc)
    migrate = store_sub.add_parser(
        "migrate", help="file records written before attachments existed as attachments (once)"
    )
    migrate.set_defaults(func=_store_migrate)

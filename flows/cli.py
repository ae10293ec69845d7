"""`relay` console command: the demo, seeding, and read-only looks into the model store."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from relay.errors import RelayError
from relay.settings import get_settings

# The demo drives its own shoppers and judges them by the default rules; at 60 req/s the 10 %
# step reaches its 200 requests per cohort in ~3 windows of 15 s and the 50 % step in one.
DEMO_CANARY = {
    "canary_steps": [10, 50],
    "analysis_window_s": 15.0,
    "traffic_rps": 60.0,
    "approval_timeout_s": 600,
    "impact_min_sessions": 200,
}


def _demo(args: argparse.Namespace) -> int:
    import logstore
    from flows.release import retrain_and_release
    from model_store import open_store
    from simulation.seed import ensure_seeded
    from tasks.data import window_ending

    settings = get_settings()
    window = window_ending(None, args.window_days)
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    seeded = ensure_seeded(client, window.start, window.end, args.events // 2, args.events)
    print(
        f"events: seeded {seeded:,} simulated events" if seeded else "events: window already seeded"
    )
    # With no champion yet, the first release goes straight to stable; a second, retrained with
    # another seed, then shows the whole canary: blessing, steps, verdicts, promotion or rollback.
    first_ever = open_store(settings).get_alias("champion") is None
    seeds = [args.seed, args.seed + 1] if first_ever else [args.seed]
    for seed in seeds:
        state = retrain_and_release(
            window_days=args.window_days,
            seed=seed,
            actor="make demo",
            return_state=True,
            **DEMO_CANARY,
        )
        run_url = f"{settings.prefect_ui_url}/runs/flow-run/{state.state_details.flow_run_id}"
        if not state.is_completed():
            print(f"\nrelease run FAILED: {state.message}\n  flow run:  {run_url}", file=sys.stderr)
            return 1
        summary = state.result()
        print(f"\nRelay demo: release {summary.outcome.replace('_', ' ')} ({summary.reason})")
        print(f"  flow run:      {run_url}")
        print(f"  lineage id:    {summary.lineage_id}")
        print(f"  holdout AUC:   {summary.metrics['holdout_auc']:.4f}")
        print(f"  engines:       {', '.join(summary.engines)}")
    store = open_store(settings)
    print(f"\n  champion:      {store.get_alias('champion')}")
    print(
        f"  artifacts:     {settings.prefect_ui_url}/artifacts (release-outcome, release-summary, calibration, canary-plan, canary-weight-*, parity, data-validation)"
    )
    print(f"  model store:   {settings.resolved_model_store_url}")
    print(
        f"  MLflow:        {settings.resolved_mlflow_uri} (model {settings.mlflow_model_name}, aliases candidate, champion)"
    )
    print(
        f"  ClickHouse:    {logstore.redact(settings.resolved_clickhouse_dsn)} (tables release_events, inference_logs, user_sessions)"
    )
    print(
        f"  serving fleet: {settings.serving_fleet_urls}  (make down stops it and the Prefect server)"
    )
    return 0


def _seed(args: argparse.Namespace) -> int:
    import logstore
    from simulation.seed import seed_events
    from tasks.data import window_ending

    settings = get_settings()
    window = window_ending(None, args.window_days)
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    written = seed_events(client, args.events, window.end, days=args.window_days)
    print(f"wrote {written:,} events over {window}")
    return 0


# -- the model store: lineage, alias history, gc ------------------------------------------------
def _at_time(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r}") from exc
    return when if when.tzinfo else when.replace(tzinfo=UTC)  # naive times are UTC


def _lineage_show(args: argparse.Namespace) -> int:
    from model_store import open_store
    from tasks.lineage_queries import flatten_sources, show_lineage

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
    from model_store import open_store
    from tasks.lineage_queries import diff_versions

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
    from model_store import open_store
    from model_store.store import version_at

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
    from model_store import open_store

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


def _add_store_commands(sub: argparse._SubParsersAction) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="seed if needed, run retrain_and_release, print where to look"
    )
    demo.add_argument("--events", type=int, default=200_000)
    demo.add_argument("--window-days", type=float, default=7.0)
    demo.add_argument("--seed", type=int, default=7)
    demo.set_defaults(func=_demo)
    seed = sub.add_parser("seed", help="write simulated events into ClickHouse")
    seed.add_argument("--events", type=int, default=200_000)
    seed.add_argument("--window-days", type=float, default=7.0)
    seed.set_defaults(func=_seed)
    _add_store_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except RelayError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

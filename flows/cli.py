"""`relay` console command: the demo, seeding, and read-only looks into the model store."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from relay.errors import RelayError
from relay.settings import get_settings


def _demo(args: argparse.Namespace) -> int:
    import logstore
    from flows.release import retrain_and_release
    from simulation.seed import ensure_seeded
    from tasks.data import window_ending

    settings = get_settings()
    window = window_ending(None, args.window_days)
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    seeded = ensure_seeded(client, window.start, window.end, args.events // 2, args.events)
    print(
        f"events: seeded {seeded:,} simulated events" if seeded else "events: window already seeded"
    )
    state = retrain_and_release(window_days=args.window_days, actor="make demo", return_state=True)
    run_url = f"{settings.prefect_ui_url}/runs/flow-run/{state.state_details.flow_run_id}"
    if not state.is_completed():
        print(f"\nrelease run FAILED: {state.message}\n  flow run:  {run_url}", file=sys.stderr)
        return 1
    summary = state.result()
    print("\nRelay demo: release candidate registered")
    print(f"  flow run:      {run_url}")
    print(f"  lineage id:    {summary.lineage_id}")
    print(f"  holdout AUC:   {summary.metrics['holdout_auc']:.4f}")
    print(f"  engines:       {', '.join(summary.engines)}")
    print(f"  artifacts:     {settings.prefect_ui_url}/artifacts (release-summary, parity, data-validation)")
    print(f"  model store:   {settings.resolved_model_store_url}/versions/{summary.version}")
    print(f"  MLflow:        {settings.resolved_mlflow_uri} (model {settings.mlflow_model_name}, alias candidate)")
    print(f"  ClickHouse:    {logstore.redact(settings.resolved_clickhouse_dsn)}")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="seed if needed, run retrain_and_release, print where to look")
    demo.add_argument("--events", type=int, default=200_000)
    demo.add_argument("--window-days", type=float, default=7.0)
    demo.set_defaults(func=_demo)
    seed = sub.add_parser("seed", help="write simulated events into ClickHouse")
    seed.add_argument("--events", type=int, default=200_000)
    seed.add_argument("--window-days", type=float, default=7.0)
    seed.set_defaults(func=_seed)
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

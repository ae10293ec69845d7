"""`relay demo` and `relay seed`: the commands that write the log store and run releases.

Prefect, torch and the log store are imported inside the commands, not here: the read-only
store commands share the parser and must start without them.
"""

from __future__ import annotations

import argparse
import sys

from relay.settings import Settings, get_settings

# The canary's traffic is the shop process `make stack` starts (60 feeds/s for `make demo`),
# judged by the default rules. The errors' interval needs ~900 requests per cohort to show
# "within +0.5 pt": at 60 req/s the 25 % step gets there in ~4 windows of 15 s and the 50 % step
# in ~2 (a 10 % step would need all 10). The canary plan says so from the rate it measures.
DEMO_CANARY = {
    "canary_steps": [25, 50],
    "analysis_window_s": 15.0,
    "approval_timeout_s": 600,
    "impact": {"min_sessions": 200},
}
# Between the first release and the second, the shop's shoppers use the first for this long:
# the second release then trains partly on what it served.
SERVED_S = 30.0


def _demo(args: argparse.Namespace) -> int:
    import logstore
    from core.data.validation import window_ending
    from flows.release import retrain_and_release
    from model_store import open_store
    from simulation.seed import ensure_seeded

    settings = get_settings()
    window = window_ending(None, args.window_days)
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    seeded = ensure_seeded(client, window.start, window.end, args.events // 2, args.events)
    print(
        f"events: seeded {seeded:,} simulated events" if seeded else "events: window already seeded"
    )
    # With no champion yet, the first release goes straight to stable; a second, retrained with
    # another seed, then shows the whole canary: blessing, steps, verdicts, promotion or rollback.
    # Every demo release trains on the seeded events plus what the fleet served and shoppers
    # clicked (train_on_served): the shop's shoppers, served by the release before.
    first_ever = open_store(settings).get_alias("champion") is None
    seeds = [args.seed, args.seed + 1] if first_ever else [args.seed]
    for n, seed in enumerate(seeds):
        if n > 0:
            _serve_shoppers(settings)
        state = retrain_and_release(
            window_days=args.window_days,
            training={"seed": seed},
            actor="make demo",
            train_on_served=True,
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
        f"  ClickHouse:    {logstore.redact(settings.resolved_clickhouse_dsn)} (tables release_events, inference_logs, user_sessions, impressions, feedback)"
    )
    print(
        f"  serving fleet: {settings.serving_fleet_urls}  (make down stops it and the Prefect server)"
    )
    return 0


def _serve_shoppers(settings: Settings) -> None:
    """The shop's shoppers on the first release, until their feedback counts as labels."""
    import time
    from datetime import UTC, datetime

    from logstore.feedback import LABEL_DELAY
    from logstore.reading import connect_for_reading

    since = datetime.now(UTC)
    print(
        f"\nshoppers: the shop's shoppers use the champion for {SERVED_S:.0f} s, then "
        f"{LABEL_DELAY.total_seconds():.0f} s until their clicks count as labelled events"
    )
    time.sleep(SERVED_S + LABEL_DELAY.total_seconds() + 2 * settings.serving_log_flush_ms / 1000)
    client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
    feeds, clicks = client.query(
        "SELECT uniqExact(request_id), (SELECT count() FROM feedback WHERE ts >= {t:DateTime64(3, 'UTC')}) "
        "FROM impressions WHERE ts >= {t:DateTime64(3, 'UTC')}",
        parameters={"t": since},
    ).result_rows[0]
    print(f"shoppers: {feeds:,} feeds served by the champion, {clicks:,} feedback events")
    if not feeds:
        print("shoppers: none - is the shop running? (deployments/local/shop.sh start)")


def _seed(args: argparse.Namespace) -> int:
    import logstore
    from core.data.validation import window_ending
    from simulation.seed import seed_events

    settings = get_settings()
    window = window_ending(None, args.window_days)
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    written = seed_events(client, args.events, window.end, days=args.window_days)
    print(f"wrote {written:,} events over {window}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`relay demo` and `relay seed`."""
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

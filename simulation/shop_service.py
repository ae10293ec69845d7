"""The shop as its own process: shoppers calling the serving fleet until it is told to stop.

    python -m simulation.shop_service [--rate-rps 20] [--round-s 10] [--max-hours 12]
                                      [--shop-seed S --n-users U --n-items I]

Shoppers (`simulation.traffic.drive`, feedback on) call every URL of `RELAY_SERVING_FLEET_URLS`
in back-to-back rounds of `--round-s` seconds at `--rate-rps`, and post their clicks and orders
(the shop's world, `simulation.shop.ShopConfig`, is the seeder's unless told otherwise).
The fleet logs the requests, impressions and feedback as it would a real shop's, so scheduled
releases, the release guard, drift-watch and the impact report (`make stack`, and so `make demo`
and `make up`, start this process) read traffic nobody drove from inside a flow. Bounded: the
process stops by itself after `--max-hours`, and at SIGTERM or SIGINT once the round in progress
ends (at most `--round-s`).

Planted drift: at the start of every round the process reads `--drift-file` (default
`$RELAY_HOME/shop/drift.json`, e.g. `{"kind": "device_mix", "magnitude": 0.5}`; kinds in
`simulation.drift`). No file means no drift; a file that does not parse or names an unknown kind
is reported in the log, naming the problem, and the round runs without drift.

Sessions: after every round its shoppers' sessions (one `user_sessions` row each, with their
orders and GMV) go through the fleet's durable log path (`logstore.writers`): straight into a
ClickHouse server, or, with the embedded ClickHouse (which admits one process), a write-ahead
file and spool segments in the spool's `sessions` folder (`RELAY_SERVING_SPOOL_DIR`, by default
`$RELAY_HOME/spool`) that readers ingest (`logstore.reading.connect_for_reading`). Every session
logged is in `user_sessions` exactly once (a dead shop's write-ahead file is recovered by the next
start), and the release's impact report reads them with the rest. A round's sessions are logged
when it ends: SIGTERM lets it end, but a shop killed outright loses its current round's sessions
(up to `--round-s` of them), while the fleet has already logged their requests.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pandas as pd

from logstore.log_tables import USER_SESSION_COLUMNS, USER_SESSIONS
from logstore.spool import RequestLogWriter
from logstore.writers import log_writer_for, writer_prefix
from relay.settings import Settings, get_settings
from simulation.drift import Drift
from simulation.shop import ShopConfig
from simulation.traffic import LiveTraffic, drive

log = logging.getLogger("relay.shop")


def read_drift(path: Path) -> Drift | None:
    """The drift the file plants, None without a file; ValueError naming what is wrong."""
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"drift file {path} is not readable JSON: {exc}") from exc
    if not isinstance(doc, dict) or set(doc) - {"kind", "magnitude"} or "kind" not in doc:
        raise ValueError(
            f'drift file {path} must be {{"kind": ..., "magnitude": ...}}, got {doc!r}'
        )
    magnitude = doc.get("magnitude", 0.0)
    if not isinstance(magnitude, int | float) or isinstance(magnitude, bool):
        raise ValueError(f"drift file {path}: magnitude must be a number, got {magnitude!r}")
    return Drift(doc["kind"], float(magnitude))  # Drift names a bad kind or magnitude


def session_rows(sessions: pd.DataFrame) -> list[tuple[Any, ...]]:
    """A round's sessions as log rows: USER_SESSIONS' column order, started_at in Unix seconds.

    Plain Python values (`tolist`), as the write-ahead file's JSON records need them.
    """
    if sessions.empty:
        return []
    values = {c: sessions[c].tolist() for c in USER_SESSION_COLUMNS}
    started = values[USER_SESSIONS.time_column]
    values[USER_SESSIONS.time_column] = [t.timestamp() for t in started]
    return list(zip(*values.values(), strict=True))


def open_sessions_log(settings: Settings) -> RequestLogWriter:
    """The sessions' writer, started: the write-ahead files of a shop that died are recovered.

    Written whatever `serving_request_log` says: that switch is for benchmarking a worker, and
    the shop's sessions are what the impact report's GMV is made of.
    """
    writer = log_writer_for(settings, USER_SESSIONS, writer_prefix("shop"))
    writer.start()
    return writer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulation.shop_service", description=__doc__)
    parser.add_argument("--rate-rps", type=float, default=20.0, help="feeds a second (20)")
    parser.add_argument("--round-s", type=float, default=10.0, help="seconds a round (10)")
    parser.add_argument("--max-hours", type=float, default=12.0, help="stop after this (12)")
    parser.add_argument("--seed", type=int, default=0, help="of the shoppers' draws (0)")
    parser.add_argument("--shop-seed", type=int, default=ShopConfig.seed, help="the shop's world")
    parser.add_argument("--n-users", type=int, default=ShopConfig.n_users)
    parser.add_argument("--n-items", type=int, default=ShopConfig.n_items)
    parser.add_argument("--drift-file", type=Path, default=None)
    return parser


def _checked_shop(args: argparse.Namespace, urls: list[str]) -> ShopConfig:
    """The shop's world, once every argument is in range; a ValueError names the one that is not."""
    LiveTraffic(rate_rps=args.rate_rps, duration_s=args.round_s)  # checks both bounds
    if not 0 < args.max_hours <= 24 * 7:
        raise ValueError(f"--max-hours must be in (0, 168], got {args.max_hours}")
    if args.n_users < 1 or args.n_items < 20:
        raise ValueError("--n-users must be >= 1 and --n-items >= 20 (a feed's candidates)")
    if not urls:
        raise ValueError("RELAY_SERVING_FLEET_URLS names no serving worker")
    return ShopConfig(seed=args.shop_seed, n_users=args.n_users, n_items=args.n_items)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the rounds
    settings = get_settings()
    urls = [u.strip() for u in settings.serving_fleet_urls.split(",") if u.strip()]
    drift_file = args.drift_file or settings.home / "shop" / "drift.json"
    try:
        shop = _checked_shop(args, urls)
    except ValueError as exc:
        print(f"shop: {exc}", file=sys.stderr)
        return 2

    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        log.info("signal %d: stopping after this round", signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = time.monotonic() + args.max_hours * 3600
    log.info(
        "shop: %g feeds/s in rounds of %g s against %s, for at most %g h (drift file %s)",
        args.rate_rps,
        args.round_s,
        ", ".join(urls),
        args.max_hours,
        drift_file,
    )
    try:
        sessions_log = open_sessions_log(settings)
    except OSError as exc:
        log.error("shop: cannot write sessions to the log spool: %s", exc)
        return 1
    try:
        rounds, logged = _run_rounds(args, urls, shop, drift_file, sessions_log, stopping, deadline)
    finally:
        sessions_log.close()  # writes every session still buffered
    log.info("shop: stopped after %d rounds, %d sessions logged", rounds, logged)
    return 0


def _run_rounds(
    args: argparse.Namespace,
    urls: list[str],
    shop: ShopConfig,
    drift_file: Path,
    sessions_log: RequestLogWriter,
    stopping: threading.Event,
    deadline: float,
) -> tuple[int, int]:
    """Rounds of shoppers until a signal or the deadline; returns (rounds, sessions logged).

    Each round rereads the drift file, so a drift planted mid-run takes effect at the next round.
    """
    rounds = logged = 0
    while not stopping.is_set() and time.monotonic() < deadline:
        try:
            drift = read_drift(drift_file)
        except ValueError as exc:
            log.error("%s: this round runs without drift", exc)
            drift = None
        duration = min(args.round_s, max(deadline - time.monotonic(), 0.1))
        traffic = LiveTraffic(
            rate_rps=args.rate_rps, duration_s=duration, seed=args.seed + rounds, drift=drift
        )
        report = drive(urls, traffic, shop)
        rows = session_rows(report.sessions)
        sessions_log.append_group(rows)  # one record: a round's sessions survive together
        rounds += 1
        logged += len(rows)
        log.info(
            "round %d: %d feeds, %d failed, by slot %s, clicks %s, feedback failed %d, "
            "%d sessions logged%s",
            rounds,
            report.requests,
            report.failed,
            report.by_slot,
            report.clicks_by_slot,
            report.feedback_failed,
            len(rows),
            f", drift {drift.kind} x{drift.magnitude:g}" if drift else "",
        )
    return rounds, logged


if __name__ == "__main__":
    sys.exit(main())

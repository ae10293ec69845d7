"""Benchmark crash safety: serving workers, the log ingester and release flows SIGKILLed.

    python -m bench.chaos [--worker-kills 20] [--release-kills 5] [--lease-s 30] [--out PATH]

Three parts, one run, loopback only; every loop is bounded in count and time and stops by itself.

1. **Worker kills while ingestion runs.** One serving worker under steady load on both
   transports — `--connections` JSON HTTP clients (one request in flight each) and
   `--binary-connections` binary-protocol clients with `--binary-depth` requests in flight each
   (default 16 + 2 x 8 = 32 in flight), every request with its own id — is SIGKILLed at a random
   moment 0.5-2 s after it became ready, then restarted on the same spool, `--worker-kills` times.
   All the while a separate ingester process loops over the spool (`ingest_spool` of every log
   table every `--ingest-every-s`), and every `--ingester-kill-every` worker kills the ingester
   itself is SIGKILLed at a random moment under load and restarted. At the end the reader
   ingests what is left and every answered request id is looked up: `answered` (answers the
   clients saw), `rows_logged`, `rows_lost` (answered, no row), `rows_duplicated` (ids with more
   than one row), per transport too (`by_transport`); and each answered request's impressions
   (`impressions_lost`: answered without all its candidates' rows; `impressions_duplicated`:
   a request with a rank twice; `impression_rows`); `concurrent_ingestion` is true when an
   ingester was alive at every worker kill; `ingester_kills` counts the kills under load.
   Target 0 lost, 0 duplicated.
2. **Logging and fsync cost**, measured in the same run: three workers of the same model side by
   side, one logging, one not, one logging with RELAY_SERVING_LOG_FSYNC=request (each row msynced
   before its answer), closed loop, alternating rounds: `worker_rps`, `worker_nolog_rps`,
   `worker_fsync_rps`, `logging_cost` = 1 - worker_rps / worker_nolog_rps (target ≤ 0.10),
   `fsync_cost` = 1 - worker_fsync_rps / worker_rps, `p50_ms_by_log_mode`.
3. **Release-flow kills.** A deployed local stack (`make up`'s scripts: Prefect server, pools,
   deployments and automations, a `cpu` pool worker, two serving workers). A first release makes
   a champion; then `--release-kills` releases are each SIGKILLed (the flow process and its whole
   process group) at a random moment of their canary step, alternating a run of the pool worker
   (`pool`) with a run in its own process (`embedded`, as `make demo` runs it). Per kill:
   `orphan_canary_s` (kill → every worker at canary weight 0), `canary_unloaded_s` (kill → the
   guard's reconciliation unloaded it), `prefect_state_after` (the run's state once Prefect
   decided: the pool worker's own verdict, or the heartbeat automation's), `champion_unchanged`,
   `next_release_started` (checked for every kill: the release started right after it — the
   next kill's, a skipped one, or a final one — left the queue and ran; `next_release_run` names
   it). A release that ends before its canary (its plan paused and nobody answered) is not a
   kill: it is listed in `releases_ended_before_their_canary` and another is started, at most
   twice as many. The canary lease is `--lease-s`, by default the production default
   (RELAY_SERVING_CANARY_LEASE_S); the target is every worker off the canary within one lease
   of the kill (`orphan_canary_bound_s`: + 1 s for the watchdog's tick and this bench's poll).

`--worker-kills 0` / `--logging-rounds 0` skip parts 1 / 2 (and `--release-kills 0` part 3), so
the parts can run apart. Writes bench/results/chaos.json (or --out).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.load import CANDIDATES
from bench.saved import save
from bench.scratch import scratch_dir
from relay.settings import Settings

RESULTS = Path(__file__).parent / "results"
PRODUCTION_LEASE_S: float = Settings.model_fields["serving_canary_lease_s"].default
TOKEN = "bench-chaos-token"


# -- 1. worker kills, with an ingester running (and killed) throughout ------------------------------
def _send_until_dead(
    url: str, docs: list[dict[str, Any]], tag: str, answered: list[str], stop: threading.Event
) -> None:
    """JSON predicts, one in flight, unique request ids, until the worker dies or `stop`."""
    with httpx.Client(base_url=url, timeout=10) as http:
        for i in range(10_000_000):
            if stop.is_set():
                return
            doc = {**docs[i % len(docs)], "request_id": f"{tag}-{i}"}
            try:
                response = http.post("/v1/predict", json=doc)
            except httpx.HTTPError:
                return  # killed: a request cut short was never answered
            if response.status_code == 200:
                answered.append(doc["request_id"])


def _send_binary_until_dead(
    host: str,
    port: int,
    requests: list[Any],
    tag: str,
    answered: list[str],
    stop: threading.Event,
    depth: int,
) -> None:
    """Binary predicts, `depth` in flight on one connection, each answer counted as it arrives."""
    from dataclasses import replace

    from relay.errors import ServingError
    from serving.client import BinaryClient, encode_predict
    from serving.protocol import Kind

    sent = itertools.count()
    in_flight: dict[int, str] = {}

    def frames(n: int) -> bytes:
        out = []
        for _ in range(n):
            i = next(sent)
            in_flight[i + 1] = f"{tag}-{i}"  # frame ids count from 1
            out.append(
                encode_predict(i + 1, replace(requests[i % len(requests)], request_id=f"{tag}-{i}"))
            )
        return b"".join(out)

    try:
        with BinaryClient(host, port, timeout_s=10, heartbeat_s=None) as client:
            data = frames(depth)
            while not stop.is_set():
                got = client.send_raw(data)
                for kind, head, _ in got:
                    rid = in_flight.pop(head.get("id"), None) if isinstance(head, dict) else None
                    if rid is not None and kind == Kind.RESULT:
                        answered.append(rid)
                data = frames(depth - len(in_flight))
    except (OSError, ServingError):
        return  # killed: what was in flight was never answered


def ingest_loop(dsn: str, spool: str, every_s: float) -> None:
    """The reader's ingestion, looping until killed: every log table's spool, every `every_s`."""
    import logstore.reading

    client = logstore.reading.connect_for_reading(dsn, Path(spool))  # ingests once, too
    print("ingesting", flush=True)
    while True:
        for table in logstore.reading.LOG_TABLES:
            logstore.reading.ingest_spool(client, table.spool_dir(Path(spool)), table)
        time.sleep(every_s)


def _start_ingester(root: Path, env: dict[str, str], n: int) -> subprocess.Popen[str]:
    log = open(root / f"ingester-{n}.log", "w")  # noqa: SIM115 - the child owns it
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.chaos", "--ingest-loop"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    log.close()
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ingesting":  # chdb open and a first pass done
        raise SystemExit(f"the ingester did not start: see {root / f'ingester-{n}.log'}")
    return process


def _senders(
    worker: Any,
    loads: tuple[list[Any], list[Any]],
    tag: str,
    answered: dict[str, list[str]],
    stop: threading.Event,
    args: argparse.Namespace,
) -> list[threading.Thread]:
    """The load on one worker: JSON clients (one in flight each), binary ones (`binary_depth`)."""
    docs, binary = loads
    return [
        threading.Thread(
            target=_send_until_dead,
            args=(worker.http_url, docs, f"{tag}-h{c}", answered["http"], stop),
        )
        for c in range(args.connections)
    ] + [
        threading.Thread(
            target=_send_binary_until_dead,
            args=(
                worker.binary_host,
                worker.binary_port,
                binary,
                f"{tag}-b{c}",
                answered["binary"],
                stop,
                args.binary_depth,
            ),
        )
        for c in range(args.binary_connections)
    ]


def worker_kills(root: Path, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL a loaded worker `args.worker_kills` times, restarting it on the same spool, while
    an ingester loops; the ingester is SIGKILLed too, every `args.ingester_kill_every` worker
    kills, at a random moment, and restarted. Every answered request's row, by request id."""
    from bench.serving import request_docs
    from serving.client import BinaryRequest, items_matrix
    from serving.process import start_worker

    docs = request_docs(200)
    binary = [
        BinaryRequest(d["user"], d["session"], d["context"], items_matrix(d["candidates"]))
        for d in docs
    ]
    rng = random.Random(11)
    run_tag = f"chaos-{time.time_ns()}"
    answered: dict[str, list[str]] = {"http": [], "binary": []}
    lifetimes, ingester_alive, ingester_kills = [], [], 0
    ingester = _start_ingester(root, env, 0)
    for kill in range(args.worker_kills):
        worker = start_worker(env, root / f"worker-{kill}.log")
        worker.wait_ready(timeout_s=120)
        stop = threading.Event()
        senders = _senders(worker, (docs, binary), f"{run_tag}-k{kill}", answered, stop, args)
        for sender in senders:
            sender.start()
        started = time.monotonic()
        lifetime = rng.uniform(0.5, 2.0)  # a few flush intervals: anywhere inside one
        if kill % args.ingester_kill_every == args.ingester_kill_every - 1:
            time.sleep(rng.uniform(0.1, lifetime))  # the ingester dies mid-loop, under load
            ingester.kill()
            ingester.wait()
            ingester_kills += 1
            ingester = _start_ingester(root, env, ingester_kills)
            lifetime = max(lifetime, time.monotonic() - started + 0.2)  # some load on the new one
        time.sleep(max(lifetime - (time.monotonic() - started), 0.0))
        ingester_alive.append(ingester.poll() is None)
        os.kill(worker.process.pid, signal.SIGKILL)
        lifetimes.append(lifetime)
        for sender in senders:
            sender.join(timeout=30)
        stop.set()
        worker.stop()
    ingester.kill()  # the reader below drains what is left (not counted as a kill under load)
    ingester.wait()
    return _rows_of(env, run_tag, answered) | {
        "worker_kills": args.worker_kills,
        "concurrent_ingestion": all(ingester_alive),
        "ingester_kills": ingester_kills,
        "requests_in_flight": args.connections + args.binary_connections * args.binary_depth,
        "kill_after_ready_s_min": round(min(lifetimes), 3),
        "kill_after_ready_s_max": round(max(lifetimes), 3),
        "load_connections": args.connections,
        "binary_connections": args.binary_connections,
        "binary_depth": args.binary_depth,
    }


def _rows_of(env: dict[str, str], run_tag: str, answered: dict[str, list[str]]) -> dict[str, Any]:
    """Every answered request id looked up in inference_logs, after the last ingestion."""
    import logstore
    import logstore.reading
    from logstore.spool import INFERENCE_LOGS, ingest_spool

    spool = Path(env["RELAY_HOME"]) / "spool"
    client = logstore.connect(env["RELAY_CLICKHOUSE_DSN"])
    # what the loop had not ingested when its last ingester died (and what that one left half-way)
    left = ingest_spool(client, INFERENCE_LOGS.spool_dir(spool), INFERENCE_LOGS)
    client = logstore.reading.connect_for_reading(env["RELAY_CLICKHOUSE_DSN"], spool)
    counts = dict(
        client.query(
            "SELECT request_id, count() FROM inference_logs "
            "WHERE startsWith(request_id, {tag:String}) GROUP BY request_id",
            parameters={"tag": run_tag},
        ).result_rows
    )
    every = answered["http"] + answered["binary"]
    # Each answered request's impressions: one row per candidate, every rank once (a batch's are
    # one write-ahead record, so they survive all or none).
    shown = {
        rid: (int(rows), int(ranks))
        for rid, rows, ranks in client.query(
            "SELECT request_id, count(), uniqExact(rank) FROM impressions "
            "WHERE startsWith(request_id, {tag:String}) GROUP BY request_id",
            parameters={"tag": run_tag},
        ).result_rows
    }
    return {
        "answered": len(every),
        "impression_rows": sum(rows for rows, _ in shown.values()),
        "impressions_lost": sum(1 for rid in every if shown.get(rid, (0, 0))[1] < CANDIDATES),
        "impressions_duplicated": sum(1 for rows, ranks in shown.values() if rows > ranks),
        "rows_logged": int(sum(counts.values())),
        "rows_lost": sum(1 for rid in every if rid not in counts),
        "rows_duplicated": sum(1 for n in counts.values() if n > 1),
        "transports": sorted(name for name, ids in answered.items() if ids),
        "by_transport": {
            name: {
                "answered": len(ids),
                "rows_lost": sum(1 for rid in ids if rid not in counts),
                "rows_duplicated": sum(1 for rid in ids if counts.get(rid, 0) > 1),
            }
            for name, ids in answered.items()
        },
        "rows_ingested_while_running": int(sum(counts.values())) - left.rows,
        "rows_left_for_the_final_reader": left.rows,
        "segments_recovered_from_killed_ingesters_at_the_end": left.recovered,
    }


# -- 2. logging cost -------------------------------------------------------------------------------
def logging_cost(root: Path, env: dict[str, str], rounds: int, seconds: float) -> dict[str, Any]:
    """Closed-loop req/s of a logging, a non-logging and a logging worker that msyncs every
    row before answering (RELAY_SERVING_LOG_FSYNC=request), alternating rounds; medians."""
    from bench.serving import http_load, http_requests, request_docs, run_async
    from serving.process import start_worker

    docs = request_docs(200)
    modes = (
        ("worker", {"RELAY_SERVING_REQUEST_LOG": "true"}),
        ("worker_nolog", {"RELAY_SERVING_REQUEST_LOG": "false"}),
        (
            "worker_fsync",
            {"RELAY_SERVING_REQUEST_LOG": "true", "RELAY_SERVING_LOG_FSYNC": "request"},
        ),
    )
    servers = {
        name: start_worker({**env, "RELAY_HOME": str(root / name), **extra}, root / f"{name}.log")
        for name, extra in modes
    }
    rates: dict[str, list[float]] = {name: [] for name in servers}
    p50: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for w in servers.values():
            w.wait_ready(timeout_s=120)
        for _ in range(rounds):
            for name, w in servers.items():
                host, port = w.http_url.removeprefix("http://").split(":")
                load = http_load(
                    host, int(port), http_requests(docs, host, int(port)), 8, seconds, 1.0
                )
                figures = run_async(load).figures()
                rates[name].append(figures["rps"])
                p50[name].append(figures["p50_ms"])
    finally:
        for w in servers.values():
            w.stop()
    logged, bare = statistics.median(rates["worker"]), statistics.median(rates["worker_nolog"])
    synced = statistics.median(rates["worker_fsync"])
    return {
        "worker_rps": round(logged, 1),
        "worker_nolog_rps": round(bare, 1),
        "logging_cost": round(1 - logged / bare, 4) if bare else None,
        "worker_fsync_rps": round(synced, 1),
        "fsync_cost": round(1 - synced / logged, 4) if logged else None,
        "p50_ms_by_log_mode": {name: round(statistics.median(v), 3) for name, v in p50.items()},
        "logging_rounds": rounds,
        "logging_round_s": seconds,
    }


# -- the run ---------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-kills", type=int, default=20)
    parser.add_argument("--connections", type=int, default=16, help="JSON load threads per kill")
    parser.add_argument("--binary-connections", type=int, default=2)
    parser.add_argument("--binary-depth", type=int, default=8, help="in flight per connection")
    parser.add_argument("--ingester-kill-every", type=int, default=3, help="worker kills")
    parser.add_argument("--ingest-every-s", type=float, default=0.2)
    parser.add_argument("--ingest-loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--release-kills", type=int, default=5)
    parser.add_argument(
        "--lease-s",
        type=float,
        default=PRODUCTION_LEASE_S,
        help="canary lease of part 3 (default: the production default)",
    )
    parser.add_argument("--events", type=int, default=20_000, help="events of the serving model")
    parser.add_argument(
        "--release-events", type=int, default=40_000, help="events seeded for the releases"
    )
    parser.add_argument("--logging-rounds", type=int, default=3)
    parser.add_argument("--logging-seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    args = parser.parse_args()
    if args.ingest_loop:  # the ingester child of part 1: the environment names its store
        from relay.settings import get_settings

        settings = get_settings()
        ingest_loop(
            settings.resolved_clickhouse_dsn, str(settings.resolved_spool_dir), args.ingest_every_s
        )
        return
    started = time.monotonic()

    from bench.serving import build_small_version

    with scratch_dir(prefix="relay-bench-chaos-") as tmp:
        store, manifest = build_small_version(tmp, args.events)
        env = {
            "RELAY_HOME": str(tmp / "serving"),
            "RELAY_MODEL_STORE_URL": store.backend.describe(),
            "RELAY_CLICKHOUSE_DSN": f"chdb://{tmp / 'clickhouse'}",
            "RELAY_SERVING_PORT": "0",
            "RELAY_SERVING_BINARY_PORT": "0",
            "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
            "RELAY_SERVING_STABLE_REF": manifest.version,
        }
        figures: dict[str, Any] = {}
        if args.worker_kills:  # 0: parts 3 only (a run of its own; see the docstring)
            figures |= worker_kills(tmp, env, args)
            print(json.dumps(figures), flush=True)
        if args.logging_rounds:
            figures |= logging_cost(tmp, env, args.logging_rounds, args.logging_seconds)
            cost = ("worker_rps", "worker_nolog_rps", "logging_cost", "fsync_cost")
            print(json.dumps({k: figures[k] for k in cost}), flush=True)
        if args.release_kills:
            from bench.chaos_release import release_kills

            figures |= release_kills(tmp, args.release_kills, args.lease_s, args.release_events)
    figures |= {"wall_s": round(time.monotonic() - started, 1), "cpu_count": os.cpu_count()}
    save(args.out, figures)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

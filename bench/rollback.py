"""Benchmark rollback from the verdict through the release's own hook, at 2, 8 and 32 workers.

    python -m bench.rollback [--workers 2,8,32] [--cycles 20] [--rps 150] [--events 30000] [--out PATH]

For each fleet size, that many workers start on loopback (one engine thread each, a small model:
32 workers share this machine's cores) and a separate process sends predict requests
round-robin to all of them the whole time, recording each request's start, end and outcome.
Each cycle is the release flow's own path, in a real Prefect flow run (against Prefect's local
test server unless PREFECT_API_URL points at one): inside a `transaction()`, the
`deploy-canary` task loads canary and baseline everywhere at weight 50, traffic reaches the
canary for a second, then the verdict is taken (`verdict_at`) and `CanaryRejected` is raised;
Prefect rolls the transaction back and runs the deploy's `on_rollback` hook
(`tasks.canary.take_canary_out_on_rollback` -> `tasks.canary_removal.take_canary_out`), which
takes the canary out of every worker and records `rollback_ms`: verdict -> weight 0 and canary
unloaded on every worker. That recorded figure is what is reported, read back from
`release_events`; after each cycle every worker is checked to serve no canary.

Every other cycle empties the process's pool of admin connections just before the verdict, so
that every connection is opened after it (`cold_pool`): the release's own path keeps the pool
warm (the deploy and the lease renewals use it), the cold cycles show what a first contact costs.

Writes bench/results/rollback.json (or --out): `rollback_ms_p95_by_workers` (every cycle: the
figure the target is about, p95 <= 50 ms at 32 workers with 0 failed requests), and beside it
the warm- and cold-pool figures and each size's requests and failures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.saved import save
from bench.scratch import scratch_dir

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-rollback-token"


def load(urls: list[str], bodies_path: str, rps: float, stop_at: float, out_path: str) -> None:
    """Paced predict requests round-robin to the workers until stop_at or until a file named
    `out_path`.stop appears; outcomes to out_path."""
    import httpx

    bodies = json.loads(Path(bodies_path).read_text())
    records = []
    interval = 1.0 / rps
    with httpx.Client(timeout=5.0) as client:
        i = 0
        next_at = time.time()
        stop = Path(out_path + ".stop")
        while time.time() < stop_at and not (i % 50 == 0 and stop.exists()):
            next_at += interval
            sent = time.time()
            try:
                ok = (
                    client.post(
                        f"{urls[i % len(urls)]}/v1/predict", json=bodies[i % len(bodies)]
                    ).status_code
                    == 200
                )
            except httpx.HTTPError:
                ok = False
            records.append((sent, time.time(), ok))
            i += 1
            time.sleep(max(0.0, next_at - time.time()))
    Path(out_path).write_text(json.dumps(records))


def rollback_cycles(stable: str, canary: str, cycles: int, tag: str) -> list[dict[str, Any]]:
    """The release's deploy -> verdict -> rollback hook, `cycles` times; each cycle's figures.

    Run as a Prefect flow (`main` wraps it), so the transaction and its hook are Prefect's own.
    """
    from prefect.transactions import transaction

    import logstore
    from logstore.release_events import events_of_release
    from relay.settings import get_settings
    from relay.types import GateResult, Release, Verdict
    from serving.fleet import FleetClient, shared_channel
    from tasks.canary import CanaryRejected, deploy_canary

    settings = get_settings()
    events = logstore.connect(settings.resolved_clickhouse_dsn)
    rejected = GateResult(gate="bench", verdict=Verdict.failed, reason="bench verdict")
    figures = []
    for i in range(cycles):
        release = Release(f"{tag}-{i}", canary, f"bench-lineage-{canary}")
        cold = i % 2 == 1
        verdict_at = 0.0
        try:
            with transaction() as txn:
                txn.set("release", release)
                deploy_canary(settings, release, baseline=stable, weight=50)
                time.sleep(1.0)  # traffic reaches the canary
                if cold:  # every connection opened after the verdict
                    shared_channel(TOKEN).close()
                    shared_channel.cache_clear()
                verdict_at = time.time()
                txn.set("verdict_at", verdict_at)
                raise CanaryRejected(rejected)
        except CanaryRejected:
            done_at = time.time()
        with FleetClient.from_settings(settings) as fleet:
            left = [w.url for w in fleet.state().workers if w.canary_version or not w.ok]
        if left:
            raise SystemExit(f"cycle {i}: a canary is left on (or no answer from) {left}")
        recorded = [
            e for e in events_of_release(events, release.release_id) if e.kind == "rollback"
        ]
        if len(recorded) != 1 or recorded[0].verdict != "done":
            raise SystemExit(
                f"cycle {i}: the hook recorded {[(e.verdict, e.reason) for e in recorded]}"
            )
        figures.append(
            {
                "rollback_ms": float(recorded[0].details["rollback_ms"]),
                "cold_pool": cold,
                "window": (verdict_at, done_at),
            }
        )
        time.sleep(0.5)
    return figures


def measure_fleet(
    urls: list[str],
    stable: str,
    canary: str,
    bodies_path: Path,
    args: argparse.Namespace,
    out: Path,
) -> dict[str, Any]:
    """`args.cycles` cycles on the workers at `urls` under paced traffic; the size's figures."""
    from prefect import flow

    from relay.settings import get_settings

    os.environ["RELAY_SERVING_FLEET_URLS"] = ",".join(urls)
    get_settings.cache_clear()
    stop_at = time.time() + args.cycles * 15.0 + 60.0  # a bound; stopped when the cycles end
    traffic = mp.get_context("spawn").Process(
        target=load, args=(urls, str(bodies_path), args.rps, stop_at, str(out))
    )
    traffic.start()
    load_before = os.getloadavg()[0]
    try:
        time.sleep(1.0)
        run = flow(name="bench-rollback", log_prints=False)(rollback_cycles)
        cycles = run(stable, canary, args.cycles, f"bench-{len(urls)}-{int(time.time())}")
    finally:
        Path(str(out) + ".stop").touch()
        traffic.join(timeout=60)
    # the machine's 1-min load average around the cycles: these cores are shared
    machine = {"load_average_1m_before": load_before, "load_average_1m_after": os.getloadavg()[0]}
    return _size_figures(len(urls), cycles, out) | machine


def renewal_cost(
    urls: list[str], pids: list[int], stable: str, canary: str, renewals: int
) -> dict[str, Any]:
    """What one lease renewal of the whole fleet costs: its wall time, and the CPU it takes in
    the release process and in all workers together (from /proc, less their idle CPU)."""
    from relay.settings import get_settings
    from relay.types import CanaryRemoval
    from serving.fleet import FleetClient

    def workers_cpu_s() -> float:
        ticks = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
        return ticks / os.sysconf("SC_CLK_TCK")

    os.environ["RELAY_SERVING_FLEET_URLS"] = ",".join(urls)
    get_settings.cache_clear()
    with FleetClient.from_settings(get_settings()) as fleet:
        if not fleet.deploy_canary(canary, 50, baseline=stable).ok:
            raise SystemExit("canary deploy for the renewal measurement failed")
        before, started = workers_cpu_s(), time.perf_counter()
        time.sleep(3.0)
        idle_per_s = (workers_cpu_s() - before) / (time.perf_counter() - started)
        walls = []
        client_before, before, started = time.process_time(), workers_cpu_s(), time.perf_counter()
        for _ in range(renewals):
            t = time.perf_counter()
            if not fleet.renew().ok:
                raise SystemExit("a renewal failed on an idle fleet")
            walls.append((time.perf_counter() - t) * 1000)
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        workers_ms = (workers_cpu_s() - before - idle_per_s * elapsed) * 1000 / renewals
        client_ms = (time.process_time() - client_before) * 1000 / renewals
        fleet.take_canary_out(CanaryRemoval.operator)
    return {
        "renewals": renewals,
        "renewal_ms_p50": round(float(np.percentile(walls, 50)), 2),
        "renewal_ms_p95": round(float(np.percentile(walls, 95)), 2),
        "renewal_client_cpu_ms": round(client_ms, 3),
        "renewal_workers_cpu_ms": round(max(workers_ms, 0.0), 3),
    }


def lease_table(renewal: dict[str, Any], leases: list[float]) -> list[dict[str, Any]]:
    """Per candidate lease: what renewing costs per hour against how long an orphan can serve.

    The release renews every third of the lease (`serving.fleet.RENEWALS_PER_LEASE`); a release
    that dies stops renewing, and each worker takes the canary to weight 0 at most one lease
    after the last renewal, which came before the death (+ the watchdog's 0.1 s tick).
    """
    from serving.canary_lease import LEASE_CHECK_S
    from serving.fleet import RENEWALS_PER_LEASE

    cpu_ms = renewal["renewal_client_cpu_ms"] + renewal["renewal_workers_cpu_ms"]
    rows = []
    for lease in leases:
        per_hour = 3600.0 / (lease / RENEWALS_PER_LEASE)
        rows.append(
            {
                "lease_s": lease,
                "renewals_per_hour": round(per_hour, 1),
                "renewal_cpu_s_per_hour": round(per_hour * cpu_ms / 1000, 3),
                "renewal_cpu_share_of_one_core": round(per_hour * cpu_ms / 1000 / 3600, 6),
                "orphan_canary_bound_s": round(lease + LEASE_CHECK_S, 1),
            }
        )
    return rows


def _size_figures(n: int, cycles: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    records = json.loads(out.read_text()) if out.is_file() else []
    windows = [c["window"] for c in cycles]
    during = [r for r in records if any(r[0] <= end and r[1] >= start for start, end in windows)]
    every = [c["rollback_ms"] for c in cycles]
    warm = [c["rollback_ms"] for c in cycles if not c["cold_pool"]]
    cold = [c["rollback_ms"] for c in cycles if c["cold_pool"]]

    def pct(xs: list[float], q: float) -> float | None:
        return round(float(np.percentile(xs, q)), 2) if xs else None

    return {
        "workers": n,
        "cycles": len(every),
        "rollback_ms_p50": pct(every, 50),
        "rollback_ms_p95": pct(every, 95),
        "rollback_ms_max": round(max(every), 2),
        "warm_pool_cycles": len(warm),
        "rollback_ms_p95_warm_pool": pct(warm, 95),
        "cold_pool_cycles": len(cold),
        "rollback_ms_p95_cold_pool": pct(cold, 95),
        "rollback_ms_each": [round(x, 2) for x in every],
        "requests_during_rollback": len(during),
        "requests_failed_during_rollback": sum(1 for r in during if not r[2]),
        "requests_total": len(records),
        "requests_failed_total": sum(1 for r in records if not r[2]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="2,8,32", help="fleet sizes, comma-separated")
    parser.add_argument("--cycles", type=int, default=20, help="per fleet size")
    parser.add_argument("--rps", type=float, default=150.0)
    parser.add_argument("--events", type=int, default=30_000, help="training events per version")
    parser.add_argument("--renewals", type=int, default=40, help="timed lease renewals per size")
    parser.add_argument("--leases", default="15,30,60,90", help="leases to cost, seconds")
    parser.add_argument("--out", type=Path, default=RESULTS / "rollback.json")
    args = parser.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]

    with scratch_dir(prefix="relay-bench-rollback-") as tmp:
        os.environ.update(
            RELAY_HOME=str(tmp / "home"),  # this process's own release_events (chdb)
            RELAY_MODEL_STORE_URL=f"file://{tmp / 'store'}",
            RELAY_SERVING_ADMIN_TOKEN=TOKEN,
        )
        os.environ.pop("RELAY_CLICKHOUSE_DSN", None)
        by_size = _run_sizes(tmp, sizes, args)

    def each(field: str) -> dict[str, Any]:
        return {n: f[field] for n, f in by_size.items()}

    figures = {
        "rollback_ms_p95_by_workers": each("rollback_ms_p95"),
        "rollback_ms_p50_by_workers": each("rollback_ms_p50"),
        "rollback_ms_p95_warm_pool_by_workers": each("rollback_ms_p95_warm_pool"),
        "rollback_ms_p95_cold_pool_by_workers": each("rollback_ms_p95_cold_pool"),
        "requests_failed_by_workers": each("requests_failed_total"),
        "lease_cost_at_workers": {
            "workers": max(sizes),
            "renewal": by_size[str(max(sizes))]["renewal"],
            "by_lease": lease_table(
                by_size[str(max(sizes))]["renewal"], [float(x) for x in args.leases.split(",")]
            ),
        },
        "measured_from": "verdict_at (the flow's) -> the deploy's on_rollback hook has every "
        "worker at weight 0 with the canary unloaded, as that hook records it",
        "by_workers": by_size,
        "cycles_per_size": args.cycles,
        "traffic_rps": args.rps,
        "engine_threads_per_worker": 1,
        "cpu_count": os.cpu_count(),
    }
    save(args.out, figures)
    print(json.dumps(figures, indent=2))


def _run_sizes(tmp: Path, sizes: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Train the two versions, then each fleet size in turn under one Prefect server."""
    from contextlib import ExitStack

    from prefect.settings import get_current_settings

    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay_testing.versions import train_and_publish
    from serving.process import start_worker
    from simulation.shop import ShopConfig, generate_events
    from simulation.traffic import request_bodies
    from tasks.training import TrainConfig

    store = ModelStore(LocalBackend(tmp / "store"))
    frame = generate_events(ShopConfig(seed=3), args.events, datetime(2026, 11, 1, tzinfo=UTC))
    stable, _ = train_and_publish(store, frame, TrainConfig(seed=1, epochs=1), tmp / "v1", "bench")
    canary, _ = train_and_publish(store, frame, TrainConfig(seed=2, epochs=1), tmp / "v2", "bench")
    bodies_path = tmp / "bodies.json"
    bodies = request_bodies(frame.iloc[:4000], 20)
    for i, body in enumerate(bodies):
        body["session"]["session_id"] = f"bench-{i // 4}"
    bodies_path.write_text(json.dumps(bodies))
    env = {
        "RELAY_MODEL_STORE_URL": f"file://{tmp / 'store'}",
        "RELAY_CLICKHOUSE_DSN": f"chdb://{tmp / 'never-opened'}",
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_STABLE_REF": stable.version,
        "RELAY_SERVING_ENGINE_THREADS": "1",
        "RELAY_SERVING_MAX_BATCH_ROWS": "256",
    }
    by_size: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        if not get_current_settings().api.url:  # no server configured: a temporary one
            from prefect.testing.utilities import prefect_test_harness

            stack.enter_context(prefect_test_harness(server_startup_timeout=120))
        for n in sizes:
            home = tmp / f"fleet-{n}"
            workers = [
                start_worker({**env, "RELAY_HOME": str(home / f"w{i}")}, home / f"w{i}.log")
                for i in range(n)
            ]
            try:
                for w in workers:
                    w.wait_ready(timeout_s=300)
                renewal = renewal_cost(
                    [w.http_url for w in workers],
                    [w.process.pid for w in workers],
                    stable.version,
                    canary.version,
                    args.renewals,
                )
                by_size[str(n)] = measure_fleet(
                    [w.http_url for w in workers],
                    stable.version,
                    canary.version,
                    bodies_path,
                    args,
                    home / "traffic.json",
                ) | {"renewal": renewal}
            finally:
                for w in workers:
                    w.stop()
            print(json.dumps(by_size[str(n)]), flush=True)
    return by_size


if __name__ == "__main__":
    main()

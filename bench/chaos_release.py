"""Part 3 of bench.chaos: release flows SIGKILLed mid-canary on a deployed local stack.

See bench.chaos for what is measured; this module holds the release-kill loop and its figures.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RELEASE = "retrain-and-release/retrain-and-release"
GUARD = "release-guard/release-guard"
END = datetime(2026, 7, 1, tzinfo=UTC)
CRASH_WAIT_S = 240.0  # the automation needs 90 s of silence, then its own evaluation
STEP = 50  # the one canary step of every release: the weight the kill happens at


def _release_params(seed: int, lease_s: float) -> dict[str, Any]:
    """A small release whose one canary step outlasts the kill (many short windows)."""
    return {
        "window_end": END.isoformat(),
        "window_days": 7.0,
        # as the deployment tests: enough to be blessed on 40k events
        "training": {"epochs": 3, "batch_size": 512, "seed": seed},
        "data": {"min_rows": 5_000},
        "canary_steps": [STEP],
        "analysis_window_s": max(lease_s, 10.0),
        # at the shop's rate on 2 busy cores (~10 req/s served) the plan needs this many windows
        # to call the step reachable; the kill comes long before the first look ends
        "gate": {"max_windows": 80},
        "approval_timeout_s": 60,
        "impact_report_after": False,
        "tensorrt_wait_s": 0,
        "actor": "bench.chaos",
    }


def _poll(found: Callable[[], Any], timeout_s: float, every_s: float = 0.25) -> Any:
    """`found()` once truthy, or None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(every_s)
    return None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def release_kills(root: Path, kills: int, lease_s: float, events: int) -> dict[str, Any]:
    """Kill `kills` releases mid-canary on a deployed local stack; what became of each."""
    from relay_testing.deployed_stack import DeployedStack, finish

    stack = DeployedStack(root / "stack", extra_env={"RELAY_SERVING_CANARY_LEASE_S": str(lease_s)})
    rng = random.Random(5)
    kills_out: list[dict[str, Any]] = []
    try:
        world = {"seed": 51, "n_users": 3_000, "n_items": 1_000}
        seeding = stack.seed_events(events, END, world)
        stack.start(serving_workers=2)
        stack.start_shop(rate_rps=60.0, shop=world)  # the canaries' traffic, as `make up` runs it
        finish(seeding)
        first = stack.wait_for_run(
            stack.run_deployment(RELEASE, _release_params(1, lease_s)), timeout_s=600
        )
        if first.get("state_type") != "COMPLETED" or stack.store().get_alias("champion") is None:
            outcome = stack.artifacts(first["id"]).get("release-outcome", {}).get("data")
            raise SystemExit(
                f"the first release made no champion: {first['state_name']}: {outcome}"
            )
        skipped: list[dict[str, Any]] = []
        tried: list[dict[str, Any]] = []  # every release started, kill or not, in order
        for attempt in range(2 * kills):  # a release that ends before its canary is not a kill
            if len(kills_out) == kills:
                break
            mode = "pool" if len(kills_out) % 2 == 0 else "embedded"
            outcome = _kill_one_release(stack, mode, 10 + attempt, lease_s, rng)
            (kills_out if "orphan_canary_s" in outcome else skipped).append(outcome)
            tried.append(outcome)
            print(json.dumps(outcome), flush=True)
        # the last kill's successor: one more release must leave the queue and start running;
        # then it is cancelled (what it would do is the first release's business)
        last = stack.run_deployment(RELEASE, {**_release_params(99, lease_s), "deploy": False})
        started = _poll(lambda: stack.api("GET", f"/flow_runs/{last}")["start_time"], 600, 1.0)
        tried.append({"run": last, "run_started": started is not None})
        # each kill's successor is the release started right after it: did Prefect run it?
        for killed, successor in itertools.pairwise(tried):
            if "orphan_canary_s" in killed:
                killed["next_release_started"] = bool(successor.get("run_started"))
                killed["next_release_run"] = successor.get("run")
        stack.api("POST", f"/flow_runs/{last}/set_state", {"state": {"type": "CANCELLING"}})
        stack.wait_for_run(last, timeout_s=120)
    finally:
        stack.stop()
    return _release_figures(kills_out, lease_s) | {"releases_ended_before_their_canary": skipped}


def _kill_one_release(
    stack: Any, mode: str, seed: int, lease_s: float, rng: random.Random
) -> dict[str, Any]:
    """Start a release (`pool` or `embedded`), SIGKILL it in its canary step, watch the aftermath."""
    champion = stack.store().get_alias("champion")
    _poll(lambda: not stack.active_runs(), 600, 1.0)  # nothing else holds the embedded ClickHouse
    before = {r["id"] for r in stack.flow_runs_of(RELEASE, include_adhoc=True)}
    params = _release_params(seed, lease_s)
    embedded = None
    if mode == "pool":
        run_id = stack.run_deployment(RELEASE, params)
    else:
        embedded = stack.run_embedded_release(params, stack.root / f"embedded-{seed}.log")
        new = _poll(
            lambda: [
                r["id"]
                for r in stack.flow_runs_of(RELEASE, include_adhoc=True)
                if r["id"] not in before
            ],
            300,
            1.0,
        )
        run_id = new[0] if new else ""

    def ended() -> dict[str, Any] | None:
        run = stack.api("GET", f"/flow_runs/{run_id}") if run_id else {"state_type": "FAILED"}
        return run if run["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"} else None

    _poll(lambda: stack.canary_weights() == {STEP} or ended(), 600)
    started = stack.api("GET", f"/flow_runs/{run_id}") if run_id else {}
    if stack.canary_weights() != {STEP}:  # e.g. its plan paused and nobody answered
        if embedded is not None:
            _kill_group(embedded.pid)
            embedded.wait(timeout=30)
        final = ended() or {}
        return {
            "mode": mode,
            "run": run_id,
            "run_started": bool(started.get("start_time")),
            "ended": final.get("state_name", "still running"),
        }
    time.sleep(rng.uniform(0, lease_s / 3))  # anywhere between two renewals
    pids = [embedded.pid] if embedded is not None else stack.flow_run_pids()
    killed = time.monotonic()
    for pid in pids:
        _kill_group(pid)
    if embedded is not None:
        embedded.wait(timeout=30)
    off = _poll(lambda: stack.canary_weights() == {0}, 3 * lease_s + 60)
    orphan_s = time.monotonic() - killed if off else None
    final = _poll(
        lambda: (r := stack.api("GET", f"/flow_runs/{run_id}"))["state_type"] != "RUNNING" and r,
        CRASH_WAIT_S,
        1.0,
    )
    unloaded = _poll(
        lambda: {w.canary_version for w in stack.fleet_state()} == {None}, CRASH_WAIT_S, 0.5
    )
    return {
        "mode": mode,
        "run": run_id,
        "deployment_run": bool(started.get("deployment_id")),
        "run_started": bool(started.get("start_time")),
        "killed_pids": len(pids),
        "orphan_canary_s": None if orphan_s is None else round(orphan_s, 2),
        "canary_unloaded_s": round(time.monotonic() - killed, 1) if unloaded else None,
        "prefect_state_after": final["state_name"] if final else "Running",
        "prefect_state_message": (final or {}).get("state", {}).get("message", "")[:200],
        "champion_unchanged": stack.store().get_alias("champion") == champion,
        "next_release_started": None,  # the next release's own run_started, filled in after it
    }


def _release_figures(kills: list[dict[str, Any]], lease_s: float) -> dict[str, Any]:
    orphan = [k["orphan_canary_s"] for k in kills if k.get("orphan_canary_s") is not None]
    # One lease after the last renewal, which came before the kill; + the watchdog's 0.1 s tick
    # and this bench's 0.25 s poll of the fleet, rounded up.
    bound = lease_s + 1.0
    return {
        "release_kills": len(kills),
        "release_kill_modes": sorted({k["mode"] for k in kills}),
        "lease_s": lease_s,
        "orphan_canary_bound_s": round(bound, 2),
        "orphan_canary_s_max": max(orphan) if orphan else None,
        "orphan_canary_s_median": round(statistics.median(orphan), 2) if orphan else None,
        "orphans_within_bound": sum(1 for s in orphan if s <= bound),
        "prefect_state_after": sorted({k["prefect_state_after"] for k in kills}),
        "champion_unchanged": all(k.get("champion_unchanged") for k in kills),
        "next_release_started": all(k.get("next_release_started") for k in kills),
        "kills": kills,
    }

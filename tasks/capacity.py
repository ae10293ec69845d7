"""The capacity check: a bounded, paired load test of candidate against champion, before any user.

Runs right after the canary is loaded at weight 0 (flows/release.py). It reads the fleet's peak
request rate of the last `history_days` from ClickHouse (the busiest second of served requests,
shared over the workers; `floor_rps` when there is no history), then drives ONE worker at a
ladder of offered rates from that peak upwards, in short rounds that alternate champion (the
`stable` slot) and candidate (the `canary` slot) on the same worker, so the host's noise falls
on both alike. Requests are pinned to the slot with the admin token and logged as slot
`loadtest` (serving/load_test.py): no user is routed to the candidate, no gate, experiment or
impact query counts them. A hard wall budget bounds the whole check; the decision is
core/gate/capacity.py's. The curve and the verdict are published as a markdown artifact.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from core.gate.capacity import (
    CANDIDATE,
    CHAMPION,
    CapacityRules,
    Round,
    curve,
    judge_capacity,
    ladder_done,
    refined_plan,
    round_order,
)
from logstore.peaks import query_peak_rate
from logstore.release_events import EventKind
from relay.settings import Settings
from relay.types import GateResult, Release
from serving.load_test import pinned_requests, run_round
from tasks.canary import record
from tasks.canary_analysis import LOG_STORE_ERRORS, reader

SLOT_OF = {CHAMPION: "stable", CANDIDATE: "canary"}
DRAIN_S = 1.0  # after a round: what is still unanswered then counts as an error
BODIES = 400


@dataclass(frozen=True)
class CapacityRun:
    """What one capacity check did: its verdict, the rounds it ran, how long it took."""

    result: GateResult
    rounds: tuple[Round, ...]
    peak_rps: float
    wall_s: float
    worker_url: str


def fleet_urls(settings: Settings) -> list[str]:
    return [u.strip().rstrip("/") for u in settings.serving_fleet_urls.split(",") if u.strip()]


def read_peak_per_worker(
    settings: Settings, rules: CapacityRules, workers: int
) -> tuple[float, str]:
    """The busiest second of the last `history_days`, per worker, and where the figure came from;
    the rules' `peak_rps` instead, where the operator set one."""
    if rules.peak_rps is not None:
        return rules.peak_rps, f"peak {rules.peak_rps:g} req/s per worker, as the run set it"
    end = datetime.now(UTC)
    try:
        fleet_peak = query_peak_rate(
            reader(settings), end - timedelta(days=rules.history_days), end
        )
    except LOG_STORE_ERRORS as exc:  # no figure to go on: the floor, and say so
        return rules.floor_rps, f"floor {rules.floor_rps:g} req/s (log store unreadable: {exc})"
    per_worker = fleet_peak / max(workers, 1)
    if per_worker < rules.floor_rps:
        return rules.floor_rps, (
            f"floor {rules.floor_rps:g} req/s (peak of the last {rules.history_days:g} days: "
            f"{fleet_peak:.0f} req/s over {workers} worker(s))"
        )
    return (
        per_worker,
        f"peak of the last {rules.history_days:g} days: {fleet_peak:.0f} req/s over {workers} worker(s)",
    )


def request_docs(n: int) -> list[dict[str, Any]]:
    """`n` predict bodies from the simulated shop (20 candidates each), sessions marked as load."""
    from simulation.shop import ShopConfig, generate_events
    from simulation.traffic import request_bodies

    events = generate_events(ShopConfig(seed=11), n * 20, datetime(2026, 11, 1, tzinfo=UTC))
    docs = request_bodies(events, 20)
    for i, doc in enumerate(docs):
        doc["session"]["session_id"] = f"loadtest-{i}"
    return docs


async def _ladder(
    url: str,
    requests: dict[str, list[bytes]],
    peak_rps: float,
    slo_ms: float,
    rules: CapacityRules,
    started: float,
) -> list[Round]:
    """The bracketing ladder, then the refined rates inside each version's bracket, within the
    wall budget."""
    rounds: list[Round] = []

    async def pairs(rate: float, count: int, seconds: float) -> bool:
        for pair in range(count):
            for version in round_order(pair):
                if time.monotonic() - started + seconds + DRAIN_S > rules.wall_budget_s:
                    return False  # the budget is hard: judge what was measured
                got = await run_round(
                    url, requests[version], rate, seconds, rules.connections, DRAIN_S
                )
                rounds.append(
                    Round(version, rate, tuple(got.latencies_ms), got.errors, got.achieved_rps)
                )
        return True

    for rate in rules.bracket_rates(peak_rps):
        if not await pairs(rate, 1, rules.round_s):
            return rounds
        if ladder_done(rounds, rate, slo_ms, rules):
            break
    for rate in refined_plan(rounds, slo_ms, rules):
        if not await pairs(rate, rules.pairs_per_rate, rules.round_s):
            break
    return rounds


def run_capacity_check(
    settings: Settings, slo_p95_ms: float, rules: CapacityRules, url: str | None = None
) -> CapacityRun:
    """Load-test champion and candidate on one worker (the fleet's first, or `url`); judge them."""
    started = time.monotonic()
    urls = fleet_urls(settings)
    url = url or (urls[0] if urls else "")
    peak, basis = read_peak_per_worker(settings, rules, len(urls) or 1)
    fault, rounds = "", []
    if not url:
        fault = "no worker to load: RELAY_SERVING_FLEET_URLS is empty"
    else:
        token = settings.serving_admin_token.get_secret_value()
        docs = request_docs(BODIES)
        requests = {v: pinned_requests(docs, url, SLOT_OF[v], token) for v in (CHAMPION, CANDIDATE)}
        coro = _ladder(url, requests, peak, slo_p95_ms, rules, started)
        try:  # on a thread of its own: the caller may already run an event loop
            with ThreadPoolExecutor(1, thread_name_prefix="capacity") as pool:
                rounds = pool.submit(asyncio.run, coro).result()
        except OSError as exc:
            fault = f"cannot reach the worker {url}: {exc}"
    judged = judge_capacity(rounds, peak, slo_p95_ms, rules, fault)
    wall = time.monotonic() - started
    where = f"{basis}; {len(rounds)} rounds on {url or 'no worker'} in {wall:.0f} s"
    result = judged.model_copy(
        update={
            "reason": f"{judged.reason} ({where})",
            "measurements": {**judged.measurements, "wall_s": wall},
        }
    )
    return CapacityRun(result, tuple(rounds), peak, wall, url)


def curve_markdown(run: CapacityRun, slo_p95_ms: float) -> str:
    """The artifact: the verdict, then rate -> P95 (and achieved rate) per version."""
    champ = {p.offered_rps: p for p in curve(run.rounds, CHAMPION)}
    cand = {p.offered_rps: p for p in curve(run.rounds, CANDIDATE)}

    def cell(p: Any) -> str:
        return (
            "—"
            if p is None
            else f"{p.p95_ms:.1f} ms ({p.achieved_rps:.0f} req/s, {p.error_rate:.1%} err)"
        )

    return "\n".join(
        [
            f"# Capacity check: {run.result.verdict.value}",
            "",
            run.result.reason,
            "",
            f"Worker {run.worker_url}; SLO P95 <= {slo_p95_ms:g} ms; method: {run.result.method}.",
            "",
            "| offered req/s | champion P95 (achieved) | candidate P95 (achieved) |",
            "|---|---|---|",
            *[
                f"| {rate:.0f} | {cell(champ.get(rate))} | {cell(cand.get(rate))} |"
                for rate in sorted(champ.keys() | cand.keys())
            ],
        ]
    )


@task(name="check-capacity", cache_policy=NO_CACHE)
def check_capacity(
    settings: Settings, release: Release, slo_p95_ms: float, rules: CapacityRules
) -> GateResult:
    """The candidate's capacity against the champion's, before any user: a verdict, an event, an artifact."""
    run = run_capacity_check(settings, slo_p95_ms, rules)
    result = run.result
    record(
        settings,
        release,
        EventKind.capacity,
        result.verdict,
        result.reason,
        **result.measurements,
        **{f"threshold_{k}": v for k, v in result.thresholds.items()},
    )
    create_markdown_artifact(
        key="capacity-check", markdown=curve_markdown(run, slo_p95_ms), description=result.reason
    )
    print(f"capacity check: {result.verdict.value}: {result.reason}")
    return result

"""Live traffic for the embedded setup: shoppers calling the serving fleet.

Each simulated session sends a few predict requests (20 candidates from the shop) to the fleet,
paced to a target rate and bounded in count and time. Each answered feed is clicked (and
ordered from) by the shop's ground truth at the positions the served scores gave
(`simulation.shoppers`), and what the shopper did is posted to `/v1/feedback`. An optional
planted drift (`simulation.drift`) shifts the candidates' features. The latency each shopper experiences is
measured on the client, and their session's length, orders and GMV are drawn from it by
`simulation.sessions.session_outcomes`, so GMV responds to real serving latency. No flow calls
it: the shop process (`simulation.shop_service`) does, as real users would call the fleet, and
benchmarks and tests that need traffic of their own (`in_background`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import pandas as pd

from serving.schema import CONTEXT_FIELDS, ITEM_FIELDS, SESSION_FIELDS, USER_FIELDS
from simulation.drift import Drift, apply_drift
from simulation.sessions import session_outcomes
from simulation.shop import DEVICES, ShopConfig, generate_events, make_population
from simulation.shoppers import SERVE_POSITION, feed_quality, feedback_body


@dataclass(frozen=True)
class LiveTraffic:
    """How hard and how long to drive the fleet. Both limits stop the driver by themselves."""

    rate_rps: float = 40.0
    duration_s: float = 15.0
    max_requests: int = 20_000
    candidates: int = 20
    requests_per_session: int = 4
    concurrency: int = 8
    gmv_per_ms: float = -0.05  # the planted effect of latency on GMV (simulation.sessions)
    seed: int = 0
    # Shoppers click and order on what was served and post it to /v1/feedback: the canary's
    # click-through check and training on served traffic read it.
    feedback: bool = True
    drift: Drift | None = None

    def __post_init__(self) -> None:
        if not 0 < self.rate_rps <= 5_000:
            raise ValueError(f"rate_rps must be in (0, 5000], got {self.rate_rps}")
        if not 0 < self.duration_s <= 3_600:
            raise ValueError(f"duration_s must be in (0, 3600], got {self.duration_s}")


@dataclass
class TrafficReport:
    """What the driver sent and saw."""

    requests: int = 0
    failed: int = 0  # transport errors and non-200 answers
    by_slot: dict[str, int] = field(default_factory=dict)
    clicks_by_slot: dict[str, int] = field(default_factory=dict)
    feedback_failed: int = 0
    sessions: pd.DataFrame = field(default_factory=pd.DataFrame)


_INT_ITEM_FIELDS = ("item_id", "category_id", "brand_id", "position")


def request_bodies(events: pd.DataFrame, candidates: int) -> list[dict]:
    """Group consecutive events into home-feed requests that share user, session and context."""
    n = len(events) // candidates
    if n == 0:
        return []
    # Column-wise to Python lists once: row-wise pandas access costs seconds per thousand bodies.
    first = events.iloc[: n * candidates : candidates]
    users = {
        f: (first[f].astype(int) if f == "user_id" else first[f].astype(float)).tolist()
        for f in USER_FIELDS
    }
    sessions = {f: first[f].astype(float).tolist() for f in SESSION_FIELDS}
    contexts = {f: first[f].astype(int).tolist() for f in CONTEXT_FIELDS}
    items = events.iloc[: n * candidates]
    item_columns = {
        f: (items[f].astype(int) if f in _INT_ITEM_FIELDS else items[f].astype(float)).tolist()
        for f in ITEM_FIELDS
    }
    return [
        {
            "user": {f: users[f][i] for f in USER_FIELDS},
            "session": {f: sessions[f][i] for f in SESSION_FIELDS},
            "context": {f: contexts[f][i] for f in CONTEXT_FIELDS},
            "candidates": [
                {f: item_columns[f][j] for f in ITEM_FIELDS}
                for j in range(i * candidates, (i + 1) * candidates)
            ],
        }
        for i in range(n)
    ]


def served_impressions(
    events: pd.DataFrame, candidates: int = 20, requests_per_session: int = 4
) -> pd.DataFrame:
    """The impressions the fleet logs when `request_bodies(events, candidates)` is served.

    Each feed's candidates share the feed's first event's user, session and context fields, and
    `requests_per_session` consecutive feeds are one session (as `_feeds` ids them): served
    traffic is far more clustered than the seeder's sessions of about 8 events, which is what the
    drift detectors see in production.
    """
    out = events.iloc[: len(events) // candidates * candidates].reset_index(drop=True)
    first = np.arange(len(out)) // candidates * candidates
    for name in (*USER_FIELDS, *SESSION_FIELDS, *CONTEXT_FIELDS):
        out[name] = out[name].to_numpy()[first]
    per_session = candidates * requests_per_session
    out["session_id"] = [f"served-{i // per_session}" for i in range(len(out))]
    out["position"] = SERVE_POSITION
    return out


def _feeds(traffic: LiveTraffic, shop: ShopConfig | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The predict bodies a drive sends, in order, and the shopper session each belongs to."""
    n_requests = min(traffic.max_requests, max(1, int(traffic.rate_rps * traffic.duration_s)))
    events = generate_events(
        shop or ShopConfig(),
        n_requests * traffic.candidates,
        datetime.now(UTC),
        days=0.05,
        chunk=traffic.seed,
    )
    events["position"] = SERVE_POSITION
    if traffic.drift is not None:
        events = apply_drift(events, traffic.drift, np.random.default_rng(traffic.seed))
    bodies = request_bodies(events, traffic.candidates)
    run = uuid.uuid4().hex[:8]
    session_of = [f"live-{run}-{i // traffic.requests_per_session}" for i in range(len(bodies))]
    for body, session_id in zip(bodies, session_of, strict=True):
        body["session"]["session_id"] = session_id
    return bodies, session_of


def _report(
    bodies: list[dict[str, Any]],
    session_of: list[str],
    traffic: LiveTraffic,
    latencies: np.ndarray,
    sent_at: np.ndarray,
    slots: list[str | None],
    clicks: np.ndarray,
    quality: np.ndarray,
    feedback_failed: np.ndarray,
) -> TrafficReport:
    """What a drive's requests met: counts by slot, clicks, failures, and the sessions' rows."""
    sent_mask = ~np.isnan(sent_at)  # a worker that took an index after the stop sent nothing
    report = TrafficReport(requests=int(sent_mask.sum()))
    report.failed = int((sent_mask & np.isnan(latencies)).sum())
    for slot, clicked in zip(slots, clicks.tolist(), strict=True):
        if slot is not None:
            report.by_slot[slot] = report.by_slot.get(slot, 0) + 1
            report.clicks_by_slot[slot] = report.clicks_by_slot.get(slot, 0) + clicked
    report.feedback_failed = int(feedback_failed.sum())
    report.sessions = _sessions(bodies, session_of, latencies, sent_at, traffic, quality)
    return report


def drive(
    urls: Sequence[str],
    traffic: LiveTraffic,
    shop: ShopConfig | None = None,
    stop: threading.Event | None = None,
) -> TrafficReport:
    """Send paced predict requests round-robin to `urls`; return what happened per session.

    Ends at the traffic's limits, or sooner once `stop` is set.
    """
    if not urls:
        raise ValueError("no serving worker URLs to drive traffic to")
    bodies, session_of = _feeds(traffic, shop)
    population = make_population(shop or ShopConfig()) if traffic.feedback else None
    salt = uuid.uuid4().int & 0xFFFFFFFF  # each drive's shoppers draw their own clicks
    latencies = np.full(len(bodies), np.nan)
    sent_at = np.full(len(bodies), np.nan)  # wall clock (Unix s): a session starts at its first
    slots: list[str | None] = [None] * len(bodies)
    clicks = np.zeros(len(bodies), dtype=np.int64)
    quality = np.full(len(bodies), np.nan)  # what each answered feed was worth to its shopper
    feedback_failed = np.zeros(len(bodies), dtype=bool)
    lock = threading.Lock()
    next_index = 0
    started = time.monotonic()
    deadline = started + traffic.duration_s
    interval = 1.0 / traffic.rate_rps

    def worker(client: httpx.Client) -> None:
        nonlocal next_index
        while True:
            with lock:
                i = next_index
                next_index += 1
            if i >= len(bodies):
                return
            due = started + i * interval  # open-loop pacing: a slow answer does not slow arrivals
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                return
            sent_at[i], sent = time.time(), time.perf_counter()
            try:
                response = client.post(f"{urls[i % len(urls)]}/v1/predict", json=bodies[i])
                if response.status_code == 200:
                    latencies[i] = (time.perf_counter() - sent) * 1000
                    answer = response.json()
                    slots[i] = answer["slot"]
                    if population is not None:
                        quality[i] = feed_quality(population, bodies[i], answer["scores"])
                        rng = np.random.default_rng([traffic.seed, salt, i])
                        clicks[i] = _send_feedback(
                            client, urls[i % len(urls)], population, bodies[i], answer, rng
                        )
            except httpx.HTTPError:
                feedback_failed[i] = not np.isnan(latencies[i])

    with ThreadPoolExecutor(traffic.concurrency) as pool:
        clients = [httpx.Client(timeout=10.0) for _ in range(traffic.concurrency)]
        try:
            list(pool.map(worker, clients))
        finally:
            for c in clients:
                c.close()

    return _report(
        bodies, session_of, traffic, latencies, sent_at, slots, clicks, quality, feedback_failed
    )


@contextmanager
def in_background(
    urls: Sequence[str], traffic: LiveTraffic, shop: ShopConfig | None = None
) -> Iterator[None]:
    """Shoppers calling the fleet from a thread while the block runs (benchmarks); stopped after."""
    stop = threading.Event()
    thread = threading.Thread(target=drive, args=(urls, traffic, shop, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _send_feedback(
    client: httpx.Client,
    url: str,
    population: Any,
    body: dict,
    answer: dict,
    rng: np.random.Generator,
) -> int:
    """Post the shopper's clicks and orders on one answered feed; the clicks sent."""
    fb = feedback_body(population, body, answer["request_id"], answer["scores"], rng)
    if fb is None:
        return 0
    response = client.post(f"{url}/v1/feedback", json=fb)
    response.raise_for_status()
    return sum(e["event"] == "click" for e in fb["events"])


def _sessions(
    bodies: list[dict],
    session_of: list[str],
    latencies: np.ndarray,
    sent_at: np.ndarray,
    traffic: LiveTraffic,
    quality: np.ndarray,
) -> pd.DataFrame:
    """One user_sessions row per session that got at least one answer, started at its first.

    Its GMV responds to the latency it saw and to how well its feeds were ranked.
    """
    frame = pd.DataFrame(
        {
            "session_id": session_of,
            "user_id": [b["user"]["user_id"] for b in bodies],
            "user_age": [b["user"]["user_age"] for b in bodies],
            "device": [b["context"]["device_type"] for b in bodies],
            "latency_ms": latencies,
            "sent_at": sent_at,
            "quality": quality,
        }
    ).dropna(subset=["latency_ms"])
    if frame.empty:
        return frame
    per = frame.groupby("session_id", sort=True).agg(
        user_id=("user_id", "first"),
        user_age=("user_age", "first"),
        device=("device", "first"),
        latency_ms=("latency_ms", "mean"),
        started_at=("sent_at", "min"),
        quality=("quality", "mean"),  # NaN (no feedback simulated) counts as unranked below
    )
    rng = np.random.default_rng(traffic.seed)
    outcomes = session_outcomes(
        per["latency_ms"].to_numpy(),
        per["device"].to_numpy(),
        per["user_age"].to_numpy(),
        rng,
        traffic.gmv_per_ms,
        feed_quality=per["quality"].fillna(1.0).to_numpy(),
    )
    return pd.DataFrame(
        {
            "session_id": per.index.to_numpy(),
            "user_id": per["user_id"].to_numpy().astype(np.uint64),
            "started_at": pd.to_datetime(per["started_at"].to_numpy(), unit="s", utc=True),
            "user_age": per["user_age"].to_numpy().astype(np.float32),
            "device_type": np.asarray(DEVICES, dtype=object)[per["device"].to_numpy().astype(int)],
            "session_length_s": outcomes.session_length_s.astype(np.float32),
            "orders": outcomes.orders.astype(np.uint16),
            "gmv": outcomes.gmv,
        }
    )

"""Seeded user sessions whose GMV responds to latency by a known, planted amount.

The ground truth is the causal graph the impact report assumes:

    device_type -> latency_ms          (older Android phones on slower networks wait longer)
    device_type -> gmv                 (iOS users spend more, Android users less)
    user_age    -> gmv
    latency_ms  -> session_length_s -> gmv

Because device type drives both latency and spending, a naive correlation of latency with GMV is
biased; adjusting for device type (back-door) or going through session length (front-door)
recovers the planted effect. `session_outcomes` is the one place outcomes are drawn, so a canary
traffic driver can feed it the latencies it really measured.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np
import pandas as pd
from clickhouse_connect.driver.client import Client

from logstore.impact import insert_inference_logs, insert_user_sessions
from simulation.shop import DEVICES

STABLE = "stable"
CANARY = "canary"


@dataclass(frozen=True)
class SessionWorld:
    """The shop's fixed behaviour; the latency effect itself is a separate argument."""

    gmv_per_session_s: float = 0.2  # GMV per extra second of session (mediator -> outcome)
    base_session_s: float = 300.0
    reference_latency_ms: float = 150.0  # latency at which a session lasts base_session_s
    session_noise_s: float = 80.0
    min_session_s: float = 5.0
    device_latency_ms: tuple[float, float, float] = (100.0, 120.0, 200.0)  # web, ios, android
    device_gmv: tuple[float, float, float] = (30.0, 50.0, 5.0)
    gmv_per_year_of_age: float = 0.6
    mean_age: float = 36.0
    avg_order_value: float = 40.0
    order_value_shape: float = 2.0  # gamma shape of one order's value
    device_share: tuple[float, float, float] = (0.3, 0.35, 0.35)
    # GMV per unit of feed quality above an unranked feed (simulation.shoppers.feed_quality):
    # the hidden reward for ranking well. Additive, so latency's planted effect is unchanged.
    gmv_per_feed_quality: float = 30.0


@dataclass(frozen=True)
class SlotTraffic:
    """One serving slot's model version and how much latency it adds on top of the device."""

    slot: str
    model_version: str
    lineage_id: str
    share: float
    extra_latency_ms: float = 0.0


@dataclass(frozen=True)
class TrafficConfig:
    """What to simulate: how many sessions, the planted effect, the slots serving them."""

    n_sessions: int
    gmv_per_ms: float = -0.05  # the planted total effect of +1 ms mean latency on session GMV
    seed: int = 17
    mean_requests: float = 20.0
    network_sigma: float = 0.35  # session-to-session spread of network quality (lognormal)
    request_sigma: float = 0.25  # request-to-request spread within a session (lognormal)
    session_prefix: str = "imp"
    slots: tuple[SlotTraffic, ...] = (
        SlotTraffic(STABLE, "v-stable", "stable_lineage_0_0", 0.9),
        SlotTraffic(CANARY, "v-canary", "canary_lineage_0_0", 0.1, extra_latency_ms=15.0),
    )
    world: SessionWorld = field(default_factory=SessionWorld)


@dataclass(frozen=True)
class SessionOutcomes:
    """Per-session outcomes, aligned with the inputs of `session_outcomes`."""

    session_length_s: np.ndarray
    orders: np.ndarray
    gmv: np.ndarray


def session_outcomes(
    latency_ms: np.ndarray,
    device: np.ndarray,
    user_age: np.ndarray,
    rng: np.random.Generator,
    effect: float,
    world: SessionWorld | None = None,
    feed_quality: np.ndarray | None = None,
) -> SessionOutcomes:
    """Session length, orders and GMV for sessions that experienced `latency_ms` (mean per session).

    `device` holds codes 0 web, 1 ios, 2 android. `effect` is the total causal effect of +1 ms on
    expected GMV; it flows entirely through session length, so effect=0 means latency changes
    nothing downstream. `feed_quality` (1 = an unranked feed, the default) adds
    `gmv_per_feed_quality` per unit above 1: what the session's feeds were worth.
    """
    world = world or SessionWorld()
    latency_ms = np.asarray(latency_ms, dtype=np.float64)
    device = np.asarray(device, dtype=np.int64)
    user_age = np.asarray(user_age, dtype=np.float64)
    if not (latency_ms.shape == device.shape == user_age.shape):
        raise ValueError(
            f"latency_ms, device and user_age must align, got shapes "
            f"{latency_ms.shape}, {device.shape}, {user_age.shape}"
        )
    if device.size and (device.min() < 0 or device.max() >= len(DEVICES)):
        raise ValueError(f"device codes must be 0..{len(DEVICES) - 1}, got {np.unique(device)}")
    seconds_per_ms = effect / world.gmv_per_session_s
    length = (
        world.base_session_s
        + seconds_per_ms * (latency_ms - world.reference_latency_ms)
        + rng.normal(0.0, world.session_noise_s, latency_ms.shape)
    )
    # The floor bends linearity only far in the tails (<0.1% of sessions with the defaults).
    length = np.maximum(length, world.min_session_s)
    expected_gmv = (
        np.asarray(world.device_gmv)[device]
        + world.gmv_per_year_of_age * (user_age - world.mean_age)
        + world.gmv_per_session_s * length
    )
    if feed_quality is not None:
        expected_gmv = expected_gmv + world.gmv_per_feed_quality * (
            np.asarray(feed_quality, dtype=np.float64) - 1.0
        )
    expected_gmv = np.maximum(expected_gmv, 0.0)
    # Orders arrive as a Poisson count and each has a gamma-distributed value, so
    # E[gmv | inputs] = expected_gmv exactly while single sessions stay realistically lumpy.
    orders = rng.poisson(expected_gmv / world.avg_order_value)
    shape = orders * world.order_value_shape
    scale = world.avg_order_value / world.order_value_shape
    gmv = np.where(orders > 0, rng.gamma(np.maximum(shape, 1e-9), scale), 0.0)
    return SessionOutcomes(
        session_length_s=length, orders=orders.astype(np.int64), gmv=np.round(gmv, 2)
    )


@dataclass(frozen=True)
class SimulatedTraffic:
    """Sessions (user_sessions rows) and their requests (inference_logs rows)."""

    sessions: pd.DataFrame
    logs: pd.DataFrame


def simulate_traffic(config: TrafficConfig, start: datetime, end: datetime) -> SimulatedTraffic:
    """Sessions starting uniformly in [start, end) and one log row per request they made.

    Request timestamps fall inside each session's length, so a session that starts near `end`
    may log requests shortly after it.
    """
    shares = _checked_shares(config, start, end)
    world = config.world
    rng = np.random.default_rng([config.seed, config.n_sessions, int(start.timestamp())])
    n = config.n_sessions

    device = rng.choice(len(DEVICES), n, p=list(world.device_share))
    age = np.clip(rng.normal(world.mean_age, 12.0, n), 16, 85).round()
    slot_index = rng.choice(len(config.slots), n, p=shares)
    extra = np.array([s.extra_latency_ms for s in config.slots])[slot_index]
    level = np.asarray(world.device_latency_ms)[device] * rng.lognormal(0, config.network_sigma, n)
    level = level + extra

    requests = 1 + rng.poisson(max(config.mean_requests - 1.0, 0.0), n)
    owner = np.repeat(np.arange(n), requests)
    latency = level[owner] * rng.lognormal(0, config.request_sigma, owner.size)
    # What the session experienced is the mean over the requests it actually made.
    experienced = np.bincount(owner, weights=latency, minlength=n) / np.maximum(requests, 1)
    outcomes = session_outcomes(experienced, device, age, rng, config.gmv_per_ms, world)

    span_ms = (end - start).total_seconds() * 1000.0
    start_ms = np.sort(rng.uniform(0.0, span_ms, n))
    started_at = pd.to_datetime(start.timestamp() * 1000.0 + start_ms, unit="ms", utc=True)
    offset_ms = rng.uniform(0.0, 1.0, owner.size) * outcomes.session_length_s[owner] * 1000.0
    ts = pd.to_datetime(
        start.timestamp() * 1000.0 + start_ms[owner] + offset_ms, unit="ms", utc=True
    )

    session_ids = _ids(rng, config.session_prefix, n)
    user_ids = rng.integers(1_000_000, 1_020_000, n).astype(np.uint64)
    sessions = pd.DataFrame(
        {
            "session_id": session_ids,
            "user_id": user_ids,
            "started_at": started_at,
            "user_age": age.astype(np.float32),
            "device_type": np.asarray(DEVICES, dtype=object)[device],
            "session_length_s": outcomes.session_length_s.astype(np.float32),
            "orders": outcomes.orders.astype(np.uint16),
            "gmv": outcomes.gmv.astype(np.float64),
        }
    )
    requests_of = pd.DataFrame(
        {"ts": ts, "user_id": user_ids[owner], "session_id": session_ids[owner]}
    )
    logs = _request_logs(rng, config.slots, requests_of, slot_index[owner], latency)
    return SimulatedTraffic(sessions=sessions, logs=logs)


def _checked_shares(config: TrafficConfig, start: datetime, end: datetime) -> np.ndarray:
    """The slots' shares, after checking the counts, the window and that the shares sum to 1."""
    if config.n_sessions < 0:
        raise ValueError(f"n_sessions must be >= 0, got {config.n_sessions}")
    if end <= start:
        raise ValueError(f"end must be after start, got [{start}, {end})")
    shares = np.array([s.share for s in config.slots], dtype=np.float64)
    if not config.slots or np.any(shares < 0) or not np.isclose(shares.sum(), 1.0):
        raise ValueError(f"slot shares must be >= 0 and sum to 1, got {shares.tolist()}")
    return shares


def _request_logs(
    rng: np.random.Generator,
    slots: tuple[SlotTraffic, ...],
    requests: pd.DataFrame,
    slot_of_row: np.ndarray,
    latency: np.ndarray,
) -> pd.DataFrame:
    """inference_logs rows for `requests` (ts, user_id, session_id), latency split into stages.

    The stages split the way a serving worker reports them. Draws continue `rng` in a fixed
    order (stages, failures, request ids, batch sizes, input sizes): the same seed, same rows.
    """
    rows = len(requests)
    queue = latency * rng.uniform(0.05, 0.25, rows)
    pre = latency * rng.uniform(0.05, 0.15, rows)
    post = latency * 0.05
    compute = latency - queue - pre - post
    failed = rng.random(rows) < 0.002
    request_ids = _ids(rng, "r", rows)

    def per_slot(values: list[str]) -> np.ndarray:
        return np.asarray(values, dtype=object)[slot_of_row]

    return pd.DataFrame(
        {
            "ts": requests["ts"],
            "request_id": request_ids,
            "user_id": requests["user_id"],
            "session_id": requests["session_id"],
            "slot": per_slot([s.slot for s in slots]),
            "model_version": per_slot([s.model_version for s in slots]),
            "lineage_id": per_slot([s.lineage_id for s in slots]),
            "latency_ms": latency.astype(np.float32),
            "queue_ms": queue.astype(np.float32),
            "preprocess_ms": pre.astype(np.float32),
            "compute_ms": compute.astype(np.float32),
            "postprocess_ms": post.astype(np.float32),
            "batch_size": rng.integers(1, 65, rows).astype(np.uint16),
            "input_bytes": rng.integers(900, 1300, rows).astype(np.uint32),
            "status": np.where(failed, 503, 200).astype(np.uint16),
            "error_code": np.where(failed, "overloaded", "").astype(object),
        }
    )


def _ids(rng: np.random.Generator, prefix: str, n: int) -> np.ndarray:
    """`n` distinct ids `prefix-<hex>` drawn from the seed (reproducible, unlike uuid4)."""
    salt = uuid.UUID(int=int(rng.integers(0, 2**63))).hex[:8]
    return np.char.add(f"{prefix}-{salt}-", np.arange(n).astype(str)).astype(object)


def seed_traffic(
    client: Client,
    config: TrafficConfig,
    start: datetime,
    end: datetime,
    chunk_sessions: int = 100_000,
) -> tuple[int, int]:
    """Simulate and insert sessions and their log rows in bounded chunks; return (sessions, rows).

    Chunks split [start, end) into consecutive slices with their own seeds, so memory is bounded
    by the chunk size rather than the total.
    """
    if chunk_sessions <= 0:
        raise ValueError(f"chunk_sessions must be positive, got {chunk_sessions}")
    chunks = max(1, -(-config.n_sessions // chunk_sessions))
    slice_len = (end - start) / chunks
    sessions = rows = 0
    for index in range(chunks):
        n = min(chunk_sessions, config.n_sessions - index * chunk_sessions)
        part = replace(
            config,
            n_sessions=n,
            seed=config.seed * 1_000_003 + index,
            session_prefix=f"{config.session_prefix}{index}",
        )
        lo = start + slice_len * index
        traffic = simulate_traffic(part, lo, lo + slice_len if index < chunks - 1 else end)
        sessions += insert_user_sessions(client, traffic.sessions)
        rows += insert_inference_logs(client, traffic.logs)
    return sessions, rows

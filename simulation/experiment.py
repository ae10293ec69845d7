"""A planted release: a candidate with a known business effect against an equal-cost twin.

Users are the shop's own (simulation.shop.Population): how often they come back, how readily
they click and what they spend persist from one period to the next, as real shoppers' do, which
is what CUPED's pre-period covariate exploits. Each user is assigned canary or baseline at
random (as the serving fleet's keyed hash does) and shops in two periods:

    [start − pre_length, start)     everyone on stable: the pre-canary behaviour
    [start, start + length)         the canary and baseline slots, equal in latency (twins)

In the canary period only, the canary's users order `order_lift` more often, pay
`order_value_lift` more per order and click `click_lift` more; everything else is drawn the same
way for both cohorts. The truth of each metric's relative effect is therefore known exactly
(`PlantedRelease.truth`). The rows are the four log tables the experiment query reads:
inference_logs, impressions, feedback, user_sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from clickhouse_connect.driver.client import Client

from logstore.impact import insert_inference_logs, insert_user_sessions
from simulation.sessions import SessionWorld
from simulation.shop import DEVICES, USER_ID_OFFSET, Population

BASE_CLICK_LOGIT = -2.2
BASE_ORDERS_PER_SESSION = 0.35
SESSION_SPAN_S = 600.0  # a session's requests fall within its first ten minutes


@dataclass(frozen=True)
class PlantedRelease:
    """One release's canary, its twin baseline and the effect planted on the canary's users."""

    canary_version: str
    baseline_version: str
    start: datetime
    length: timedelta = timedelta(hours=1)
    pre_length: timedelta = timedelta(hours=1)
    users: int = 1_000
    # Sessions of a user of average activity: during the canary, and over the (longer)
    # pre-canary period, whose length the experiment's pre-period setting chooses.
    sessions_per_user: float = 1.5
    pre_sessions_per_user: float = 6.0
    requests_per_session: float = 2.0
    candidates: int = 3  # impressions per request
    order_lift: float = 0.0
    order_value_lift: float = 0.0
    click_lift: float = 0.0
    canary_extra_latency_ms: float = 0.0  # 0: an equal-cost twin
    canary_share: float = 0.5
    seed: int = 0  # also names the rows' ids: releases sharing a database need distinct seeds
    users_from: int | None = None  # the shop's users [users_from, +users); None: a random draw

    @property
    def pre_start(self) -> datetime:
        return self.start - self.pre_length

    @property
    def end(self) -> datetime:
        return self.start + self.length

    @property
    def truth(self) -> dict[str, float]:
        """Each metric's true relative effect of the canary (canary / baseline − 1)."""
        return {
            "click_through": self.click_lift,
            "orders_per_user": self.order_lift,
            "gmv_per_user": (1 + self.order_lift) * (1 + self.order_value_lift) - 1,
            "latency_ms": 0.0 if self.canary_extra_latency_ms == 0 else float("nan"),
        }


@dataclass(frozen=True)
class PlantedRows:
    """The log rows of one planted release, ready to insert."""

    inference_logs: pd.DataFrame
    impressions: pd.DataFrame
    feedback: pd.DataFrame
    user_sessions: pd.DataFrame

    @property
    def rows(self) -> int:
        return sum(
            len(f)
            for f in (self.inference_logs, self.impressions, self.feedback, self.user_sessions)
        )


def plant_release(population: Population, release: PlantedRelease) -> PlantedRows:
    """The release's rows: both periods, both cohorts, the planted effect on the canary's users."""
    rng = np.random.default_rng([release.seed, 7919])
    if release.users > len(population.user_age):
        raise ValueError(f"users {release.users} > the shop's {len(population.user_age)} users")
    if release.users_from is None:
        users = rng.choice(len(population.user_age), release.users, replace=False)
    elif release.users_from + release.users <= len(population.user_age):
        users = np.arange(release.users_from, release.users_from + release.users)
    else:
        raise ValueError(f"users [{release.users_from}, +{release.users}) beyond the shop's")
    canary = rng.random(release.users) < release.canary_share
    # A user's latency level persists (their device and network), as in simulation.sessions.
    level = np.asarray(SessionWorld().device_latency_ms)[population.user_device[users]]
    level = level * rng.lognormal(0.0, 0.35, release.users)
    cohort = (users, canary, level)
    periods = [
        _period(population, release, rng, cohort, release.pre_start, release.start, False),
        _period(population, release, rng, cohort, release.start, release.end, True),
    ]
    return PlantedRows(*(pd.concat([p[i] for p in periods], ignore_index=True) for i in range(4)))


def _period(
    population: Population,
    release: PlantedRelease,
    rng: np.random.Generator,
    cohort: tuple[np.ndarray, np.ndarray, np.ndarray],
    start: datetime,
    end: datetime,
    in_canary: bool,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    users, canary, level = cohort
    span_s = (end - start).total_seconds()
    activity = population.user_activity[users] / population.user_activity.mean()
    per_user = release.sessions_per_user if in_canary else release.pre_sessions_per_user
    n_sessions = rng.poisson(per_user * activity)
    owner = np.repeat(np.arange(len(users)), n_sessions)  # session -> index into users
    treated = canary[owner] & in_canary
    started_s = rng.uniform(0, span_s, owner.size)
    session_ids = np.char.add(
        f"x{release.seed}-{int(in_canary)}-", np.arange(owner.size).astype(str)
    ).astype(object)
    user_ids = (users[owner] + USER_ID_OFFSET).astype(np.uint64)
    propensity = population.user_propensity[users][owner]
    # Orders: the user's taste (propensity) sets the rate; the canary's users order more.
    order_rate = BASE_ORDERS_PER_SESSION * np.exp(0.5 * propensity)
    orders = rng.poisson(order_rate * np.where(treated, 1 + release.order_lift, 1.0))
    order_value = population.user_price[users][owner] * np.where(
        treated, 1 + release.order_value_lift, 1.0
    )
    gmv = np.where(orders > 0, rng.gamma(np.maximum(orders * 2.0, 1e-9), order_value / 2.0), 0.0)
    t0 = pd.Timestamp(start)
    sessions = pd.DataFrame(
        {
            "session_id": session_ids,
            "user_id": user_ids,
            "started_at": t0 + pd.to_timedelta(started_s, unit="s"),
            "user_age": population.user_age[users][owner].astype(np.float32),
            "device_type": np.asarray(DEVICES, dtype=object)[population.user_device[users][owner]],
            "session_length_s": np.full(owner.size, SESSION_SPAN_S, dtype=np.float32),
            "orders": orders.astype(np.uint16),
            "gmv": np.round(gmv, 2),
        }
    )
    logs, impressions, feedback = _requests(
        release, rng, session_ids, user_ids, treated, canary[owner], propensity, level[owner],
        started_s, span_s, t0, in_canary,
    )  # fmt: skip
    return logs, impressions, feedback, sessions


def _requests(
    release: PlantedRelease,
    rng: np.random.Generator,
    session_ids: np.ndarray,
    user_ids: np.ndarray,
    treated: np.ndarray,
    is_canary: np.ndarray,
    propensity: np.ndarray,
    level: np.ndarray,
    started_s: np.ndarray,
    span_s: float,
    t0: pd.Timestamp,
    in_canary: bool,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    per_session = 1 + rng.poisson(max(release.requests_per_session - 1, 0.0), session_ids.size)
    s = np.repeat(np.arange(session_ids.size), per_session)  # request -> session
    offset = rng.uniform(0, SESSION_SPAN_S, s.size)
    ts_s = np.minimum(started_s[s] + offset, span_s - 0.001)  # stay inside the period
    ts = t0 + pd.to_timedelta(ts_s, unit="s")
    slot = np.where(is_canary[s], "canary", "baseline") if in_canary else np.full(s.size, "stable")
    version = (
        np.where(is_canary[s], release.canary_version, release.baseline_version)
        if in_canary
        else np.full(s.size, release.baseline_version)
    )
    latency = level[s] * rng.lognormal(0.0, 0.25, s.size) + np.where(
        treated[s], release.canary_extra_latency_ms, 0.0
    )
    request_ids = np.char.add(
        f"q{release.seed}-{int(in_canary)}-", np.arange(s.size).astype(str)
    ).astype(object)
    logs = _log_frame(ts, request_ids, user_ids[s], session_ids[s], slot, version, latency)
    k = release.candidates
    r = np.repeat(np.arange(s.size), k)  # impression -> request
    rank = np.tile(np.arange(1, k + 1), s.size)
    p = 1 / (1 + np.exp(-(BASE_CLICK_LOGIT + 0.8 * propensity[s][r] - 0.3 * np.log(rank))))
    p = np.minimum(p * np.where(treated[s][r], 1 + release.click_lift, 1.0), 1.0)
    clicked = rng.random(r.size) < p
    # k consecutive items per feed: never the same item twice in one request
    items = (rng.integers(5_000_000, 5_005_000 - k, s.size)[r] + rank - 1).astype(np.uint64)
    impressions = pd.DataFrame(
        {
            "ts": ts[r],
            "request_id": request_ids[r],
            "rank": rank.astype(np.uint16),
            "slot": slot[r],
            "model_version": version[r],
            "lineage_id": "planted",
            "session_id": session_ids[s][r],
            "score": rng.random(r.size).astype(np.float32),
            "user_id": user_ids[s][r],
            "item_id": items,
        }
    )
    c = np.flatnonzero(clicked)
    feedback = pd.DataFrame(
        {
            "ts": ts[r][c] + pd.to_timedelta(1.0, unit="s"),
            "feedback_id": np.char.add("f-", request_ids[r][c].astype(str)).astype(object),
            "request_id": request_ids[r][c],
            "item_id": items[c],
            "event": "click",
            "order_value": 0.0,
        }
    )
    return logs, impressions, feedback


def _log_frame(ts, request_ids, user_ids, session_ids, slot, version, latency) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    n = len(request_ids)
    zeros = np.zeros(n, dtype=np.float32)
    return pd.DataFrame(
        {
            "ts": ts,
            "request_id": request_ids,
            "user_id": user_ids,
            "session_id": session_ids,
            "slot": slot,
            "model_version": version,
            "lineage_id": "planted",
            "latency_ms": latency.astype(np.float32),
            "queue_ms": zeros,
            "preprocess_ms": zeros,
            "compute_ms": latency.astype(np.float32),
            "postprocess_ms": zeros,
            "batch_size": np.ones(n, dtype=np.uint16),
            "input_bytes": np.full(n, 1_000, dtype=np.uint32),
            "status": np.full(n, 200, dtype=np.uint16),
            "error_code": "",
        }
    )


def insert_planted(client: Client, rows: PlantedRows) -> int:
    """Insert a planted release's rows into the log tables; return how many were written."""
    insert_inference_logs(client, rows.inference_logs)
    insert_user_sessions(client, rows.user_sessions)
    # impressions' feature columns default to 0: the experiment reads none of them
    client.insert_df("impressions", rows.impressions)
    if len(rows.feedback):
        client.insert_df("feedback", rows.feedback)
    return rows.rows

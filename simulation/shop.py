"""A seeded shop whose clicks come from a hidden ground-truth CTR with real signal.

Users have favourite categories, a price level, a device and a click propensity; items have a
category, brand, price and latent quality. Sessions scroll the home feed; each impression is
clicked with probability `true_ctr(...)`. The training task never calls this module: it reads
what was written to ClickHouse.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

from relay.features import LABEL

N_CATEGORIES = 64
N_BRANDS = 2_000
DEVICES = ("web", "ios", "android")
# Ids are offset so they look like real ids rather than row numbers; shoppers subtract them to
# find the latent attributes behind an id (simulation.shoppers).
USER_ID_OFFSET = 1_000_000
ITEM_ID_OFFSET = 5_000_000


@dataclass(frozen=True)
class ShopConfig:
    """How big the shop is and which seed draws it."""

    seed: int = 7
    n_users: int = 20_000
    n_items: int = 5_000
    events_per_session: float = 8.0


@dataclass
class Population:
    """Latent and observable attributes of users and items."""

    user_age: np.ndarray
    user_device: np.ndarray
    user_region: np.ndarray
    user_tenure: np.ndarray
    user_favs: np.ndarray  # (n_users, 3) favourite categories
    user_price: np.ndarray
    user_propensity: np.ndarray
    user_activity: np.ndarray
    item_category: np.ndarray
    item_brand: np.ndarray
    item_price: np.ndarray
    item_quality: np.ndarray
    item_rating: np.ndarray
    item_reviews: np.ndarray
    item_age: np.ndarray
    item_popularity: np.ndarray
    items_by_category: list[np.ndarray]


def make_population(cfg: ShopConfig) -> Population:
    """Draw users and items from the seed."""
    rng = np.random.default_rng(cfg.seed)
    nu, ni = cfg.n_users, cfg.n_items
    item_category = rng.integers(0, N_CATEGORIES, ni)
    category_price = rng.lognormal(3.2, 0.8, N_CATEGORIES)
    quality = rng.normal(0, 1, ni)
    return Population(
        user_age=np.clip(rng.normal(36, 12, nu), 16, 85).round(),
        user_device=rng.choice(3, nu, p=[0.3, 0.35, 0.35]),
        user_region=rng.integers(0, 32, nu),
        user_tenure=rng.exponential(400, nu).round(),
        user_favs=rng.integers(0, N_CATEGORIES, (nu, 3)),
        user_price=rng.lognormal(3.4, 0.7, nu),
        user_propensity=rng.normal(0, 0.6, nu),
        user_activity=rng.lognormal(1.5, 1.0, nu),
        item_category=item_category,
        item_brand=rng.integers(0, N_BRANDS, ni),
        item_price=category_price[item_category] * rng.lognormal(0, 0.5, ni),
        item_quality=quality,
        item_rating=np.clip(3.6 + 0.5 * quality + rng.normal(0, 0.4, ni), 1, 5).round(1),
        item_reviews=rng.lognormal(3 + 0.5 * quality, 1.2, ni).round(),
        item_age=rng.exponential(200, ni).round(),
        item_popularity=rng.lognormal(6 + 0.6 * quality, 1.0, ni).round(),
        items_by_category=[np.flatnonzero(item_category == c) for c in range(N_CATEGORIES)],
    )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def true_ctr(
    affinity: np.ndarray,
    position: np.ndarray,
    quality: np.ndarray,
    propensity: np.ndarray,
    price_ratio: np.ndarray,
    discount: np.ndarray,
    hour: np.ndarray,
    device: np.ndarray,
) -> np.ndarray:
    """The hidden ground truth: P(click) for each impression."""
    logit = (
        -3.4
        + 2.0 * affinity
        - 0.45 * np.log(position)
        + 0.7 * quality
        + 0.8 * propensity
        - 0.6 * np.abs(np.log(price_ratio))
        + 1.2 * discount
        + 0.25 * ((hour >= 18) & (hour <= 22))
        + np.array([0.0, 0.15, -0.1])[device]
    )
    return _sigmoid(logit)


def _session_timeline(
    cfg: ShopConfig,
    pop: Population,
    rng: np.random.Generator,
    n_events: int,
    end: datetime,
    days: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, pd.DatetimeIndex]:
    """Sessions: a user (heavy users come back more), a start time, a feed scrolled in order.

    Per event: its session, the session's user, its 0-based depth in the session, the seconds
    since the session began, and its timestamp.
    """
    n_sessions = max(1, int(n_events / cfg.events_per_session))
    user_weights = pop.user_activity / pop.user_activity.sum()
    session_user = rng.choice(len(user_weights), n_sessions, p=user_weights)
    evening = rng.random(n_sessions) < 0.35
    start_s = rng.uniform(0, days * 86_400, n_sessions)
    start_s = np.where(
        evening,
        np.floor(start_s / 86_400) * 86_400 + rng.uniform(18, 23, n_sessions) * 3_600,
        start_s,
    )
    start_s = np.minimum(start_s, days * 86_400 - 3_600)

    session = np.sort(rng.integers(0, n_sessions, n_events))
    first = np.searchsorted(session, session, side="left")
    depth = np.arange(n_events) - first
    gaps = rng.exponential(12.0, n_events)
    elapsed = np.cumsum(gaps) - np.cumsum(gaps)[first] + gaps[first]
    ts_s = start_s[session] + elapsed
    t0 = end - timedelta(days=days)
    ts = pd.to_datetime(t0.timestamp() + ts_s, unit="s", utc=True)
    return session, session_user[session], depth, elapsed, ts


def _feed_items(
    cfg: ShopConfig, pop: Population, rng: np.random.Generator, user: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """What the feed shows each event's user (mostly their favourite categories): item, category."""
    n_events = len(user)
    fav_pick = rng.integers(0, 3, n_events)
    from_favs = rng.random(n_events) < 0.6
    category = np.where(
        from_favs, pop.user_favs[user, fav_pick], rng.integers(0, N_CATEGORIES, n_events)
    )
    item = np.empty(n_events, dtype=np.int64)
    for c in range(N_CATEGORIES):
        rows = np.flatnonzero(category == c)
        pool = pop.items_by_category[c]
        if len(pool) == 0:
            pool = np.arange(cfg.n_items)
            category[rows] = pop.item_category[pool[0]]
        item[rows] = pool[rng.integers(0, len(pool), len(rows))]
    return item, pop.item_category[item]


def generate_events(
    cfg: ShopConfig, n_events: int, end: datetime, days: float = 7.0, chunk: int = 0
) -> pd.DataFrame:
    """`n_events` impressions with click labels, spread over `days` before `end` (UTC).

    Chunks share the seed's users and items but draw their own sessions (ids prefixed by chunk).
    """
    pop = make_population(cfg)
    rng = np.random.default_rng([cfg.seed, chunk, n_events, int(end.timestamp())])
    session, user, depth, elapsed, ts = _session_timeline(cfg, pop, rng, n_events, end, days)
    item, category = _feed_items(cfg, pop, rng, user)

    is_fav = (pop.user_favs[user] == category[:, None]).any(axis=1)
    affinity = np.clip(np.where(is_fav, 0.7, 0.05) + rng.normal(0, 0.1, n_events), 0, 1)
    position = np.minimum(depth + 1, 50)
    discount = np.where(rng.random(n_events) < 0.3, rng.uniform(0.05, 0.5, n_events), 0.0)
    price = pop.item_price[item] * (1 - discount)
    price_ratio = price / pop.user_price[user]
    hour = ts.hour.to_numpy()
    device = pop.user_device[user]
    p_click = true_ctr(
        affinity,
        position,
        pop.item_quality[item],
        pop.user_propensity[user],
        price_ratio,
        discount,
        hour,
        device,
    )
    clicked = (rng.random(n_events) < p_click).astype(np.uint8)
    noisy_user_ctr = np.clip(
        _sigmoid(-3.0 + 0.8 * pop.user_propensity[user]) + rng.normal(0, 0.005, n_events), 0, 1
    )
    noisy_item_ctr = np.clip(
        _sigmoid(-3.0 + 0.7 * pop.item_quality[item]) + rng.normal(0, 0.005, n_events), 0, 1
    )
    clicks_30d = rng.poisson(pop.user_activity[user] * 3)

    return pd.DataFrame(
        {
            "ts": ts,
            "session_id": np.char.add(f"s{chunk}-", session.astype(str)).astype(object),
            "user_id": (user + USER_ID_OFFSET).astype(np.uint64),
            "item_id": (item + ITEM_ID_OFFSET).astype(np.uint64),
            "category_id": category.astype(np.uint16),
            "brand_id": pop.item_brand[item].astype(np.uint32),
            "device_type": device.astype(np.uint8),
            "hour": hour.astype(np.uint8),
            "weekday": ts.day_of_week.to_numpy().astype(np.uint8),
            "position": position.astype(np.uint8),
            "region_id": pop.user_region[user].astype(np.uint8),
            "price": price.astype(np.float32),
            "discount_pct": discount.astype(np.float32),
            "item_rating": pop.item_rating[item].astype(np.float32),
            "item_review_count": pop.item_reviews[item].astype(np.float32),
            "item_age_days": pop.item_age[item].astype(np.float32),
            "item_ctr_7d": noisy_item_ctr.astype(np.float32),
            "item_impressions_7d": pop.item_popularity[item].astype(np.float32),
            "user_age": pop.user_age[user].astype(np.float32),
            "user_tenure_days": pop.user_tenure[user].astype(np.float32),
            "user_clicks_30d": clicks_30d.astype(np.float32),
            "user_orders_30d": rng.binomial(clicks_30d, 0.08).astype(np.float32),
            "user_ctr_30d": noisy_user_ctr.astype(np.float32),
            "user_avg_price": pop.user_price[user].astype(np.float32),
            "user_category_affinity": affinity.astype(np.float32),
            "session_depth": depth.astype(np.float32),
            "session_duration_s": elapsed.astype(np.float32),
            "seconds_since_last_click": rng.exponential(3_600, n_events).astype(np.float32),
            "price_to_user_avg": price_ratio.astype(np.float32),
            LABEL: clicked,
        }
    )


def now_utc() -> datetime:
    return datetime.now(UTC)

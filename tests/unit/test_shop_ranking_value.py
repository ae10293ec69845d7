"""The shop's hidden ground truth pays for ranking: a better-ranked feed earns more orders."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from simulation.sessions import SessionWorld, session_outcomes
from simulation.shop import ShopConfig, generate_events, make_population
from simulation.shoppers import click_probabilities, feed_quality
from simulation.traffic import request_bodies

SHOP = ShopConfig(seed=5, n_users=2_000, n_items=800)


def bodies(n: int) -> list[dict]:
    events = generate_events(SHOP, n * 20, datetime(2026, 5, 1, tzinfo=UTC), days=0.1)
    return request_bodies(events, 20)


def test_ranking_by_the_truth_beats_an_unranked_feed_and_reversing_it_loses() -> None:
    population = make_population(SHOP)
    best, worst = [], []
    for body in bodies(200):
        truth = click_probabilities(population, body, np.zeros(20))  # every item at rank ties
        best.append(feed_quality(population, body, truth))
        worst.append(feed_quality(population, body, -truth))
    assert np.mean(best) > 1.05 and np.mean(worst) < 0.97
    order = list(range(20, 0, -1))  # scores that keep the request's own order
    assert feed_quality(population, bodies(1)[0], order) == 1.0


def test_feed_quality_adds_its_known_gmv_and_leaves_latencys_effect_alone() -> None:
    n = 400_000
    device = np.zeros(n, dtype=np.int64)
    age = np.full(n, 36.0)
    latency = np.full(n, 150.0)
    world = SessionWorld()
    plain = session_outcomes(latency, device, age, np.random.default_rng(1), -0.05, world)
    better = session_outcomes(
        latency, device, age, np.random.default_rng(2), -0.05, world, feed_quality=np.full(n, 1.2)
    )
    lift = better.gmv.mean() - plain.gmv.mean()
    assert abs(lift - 0.2 * world.gmv_per_feed_quality) < 0.5  # +6 GMV per session, known
    assert better.orders.mean() > plain.orders.mean() * 1.05
    slower = session_outcomes(
        latency + 100, device, age, np.random.default_rng(3), -0.05, world,
        feed_quality=np.full(n, 1.2),
    )  # fmt: skip
    assert abs((slower.gmv.mean() - better.gmv.mean()) - (-5.0)) < 0.5  # -0.05 GMV/ms × 100 ms

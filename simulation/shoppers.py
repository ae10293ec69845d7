"""Shoppers who click on what the serving model ranked, by the shop's hidden ground truth.

A feed view shows a request's candidates in the order of the scores the fleet returned; the
shopper clicks each item with probability `simulation.shop.true_ctr` at the position it was
shown (so position bias acts on the served rank), and orders a clicked item with
`order_rate`. A model that ranks the truly attractive items higher therefore earns more clicks,
as a better model does in a real shop. The clicks and orders become a `POST /v1/feedback` body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulation.shop import ITEM_ID_OFFSET, USER_ID_OFFSET, Population, true_ctr

# Before ranking the shop cannot know where an item will be shown, so every candidate is scored
# as if at the top slot: the model's position effect then shifts all scores alike.
SERVE_POSITION = 1


@dataclass(frozen=True)
class ShopperBehaviour:
    """How shoppers act on a feed beyond the click ground truth."""

    order_rate: float = 0.1  # P(order | click)


def shown_ranks(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based rank of each candidate by score, ties in request order (as the worker ranks)."""
    values = np.asarray(scores, dtype=np.float64)
    rank = np.empty(len(values), dtype=np.int64)
    rank[np.argsort(-values, kind="stable")] = np.arange(1, len(values) + 1)
    return rank


def click_probabilities(
    population: Population, body: dict[str, Any], scores: Sequence[float] | np.ndarray
) -> np.ndarray:
    """The ground-truth P(click) of each candidate at the position its score put it."""
    candidates = body["candidates"]
    items = np.array([c["item_id"] for c in candidates], dtype=np.int64) - ITEM_ID_OFFSET
    user = int(body["user"]["user_id"]) - USER_ID_OFFSET
    n = len(candidates)
    context = body["context"]
    return true_ctr(
        np.array([c["user_category_affinity"] for c in candidates], dtype=np.float64),
        shown_ranks(scores),
        population.item_quality[items],
        np.full(n, population.user_propensity[user]),
        np.array([c["price_to_user_avg"] for c in candidates], dtype=np.float64),
        np.array([c["discount_pct"] for c in candidates], dtype=np.float64),
        np.full(n, context["hour"]),
        np.full(n, context["device_type"], dtype=np.int64),
    )


def feedback_body(
    population: Population,
    body: dict[str, Any],
    request_id: str,
    scores: Sequence[float],
    rng: np.random.Generator,
    behaviour: ShopperBehaviour = ShopperBehaviour(),
) -> dict[str, Any] | None:
    """The shopper's clicks and orders on one answered request, or None if they did nothing."""
    p = click_probabilities(population, body, scores)
    clicked = rng.random(len(p)) < p
    ordered = clicked & (rng.random(len(p)) < behaviour.order_rate)
    events: list[dict[str, Any]] = []
    for j in np.flatnonzero(clicked):
        candidate = body["candidates"][j]
        events.append({"item_id": int(candidate["item_id"]), "event": "click"})
        if ordered[j]:
            events.append(
                {
                    "item_id": int(candidate["item_id"]),
                    "event": "order",
                    "order_value": round(float(candidate["price"]), 2),
                }
            )
    return {"request_id": request_id, "events": events} if events else None


def feed_quality(population: Population, body: dict[str, Any], scores: Sequence[float]) -> float:
    """Expected clicks on the feed as served over expected clicks in the request's own order.

    The request lists candidates in no particular order, so 1.0 is an unranked feed; a model
    that puts the truly attractive items on top scores above 1, a reversed ranking below. The
    shop's sessions earn GMV by it (simulation.sessions), so a better ranker earns more orders.
    """
    served = click_probabilities(population, body, scores).sum()
    unranked = click_probabilities(population, body, -np.arange(len(scores), dtype=float)).sum()
    return float(served / unranked) if unranked > 0 else 1.0

"""Stable/canary routing: one immutable table, replaced whole, and sticky per-user assignment.

Every change (load, weight, promote, rollback, injected latency) builds a new table from the
old one and the worker swaps the reference in one assignment, so a request reads either the
old table or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from serving.schema import RequestRejected

STABLE = "stable"
CANARY = "canary"
SLOTS = (STABLE, CANARY)
MAX_INJECTED_MS = 60_000.0


class Servable(Protocol):
    @property
    def version(self) -> str: ...


M = TypeVar("M", bound=Servable)


def route_bucket(user_id: int, salt: str) -> int:
    """The user's bucket 0-99 for this canary: the same in every process and on every worker.

    Python's hash() is salted per process, so a keyed blake2b is used. The canary's version is
    the key: each canary draws a fresh cohort, and raising the weight only adds users to it.
    """
    digest = hashlib.blake2b(
        user_id.to_bytes(8, "little", signed=False), digest_size=8, key=salt.encode()[:64]
    ).digest()
    return int.from_bytes(digest, "little") % 100


@dataclass(frozen=True)
class RoutingTable(Generic[M]):
    """Which model serves each slot, the canary's share of users, and injected latency."""

    stable: M | None = None
    canary: M | None = None
    canary_weight: int = 0
    stable_latency_ms: float = 0.0
    canary_latency_ms: float = 0.0

    def route(self, user_id: int) -> tuple[str, M] | None:
        """(slot, model) for this user, or None when nothing can serve them."""
        canary = self.canary
        if (
            canary is not None
            and self.canary_weight > 0
            and route_bucket(user_id, canary.version) < self.canary_weight
        ):
            return CANARY, canary
        if self.stable is None:
            return None
        return STABLE, self.stable

    def model(self, slot: str) -> M | None:
        return self.stable if slot == STABLE else self.canary

    def injected_ms(self, slot: str) -> float:
        return self.stable_latency_ms if slot == STABLE else self.canary_latency_ms

    def models(self) -> set[M]:
        return {m for m in (self.stable, self.canary) if m is not None}

    # -- transitions: each returns a new table or raises RequestRejected ------------------------
    def with_loaded(self, slot: str, model: M) -> RoutingTable[M]:
        """`model` in `slot`. A newly loaded canary takes no traffic until a weight is set."""
        check_slot(slot)
        if slot == STABLE:
            return replace(self, stable=model)
        return replace(self, canary=model, canary_weight=0)

    def with_weight(self, weight: int) -> RoutingTable[M]:
        if type(weight) is not int or not 0 <= weight <= 100:
            raise RequestRejected("bad_weight", f"weight must be an integer 0-100, got {weight!r}")
        if weight > 0 and self.canary is None:
            raise RequestRejected("no_canary", "no canary is loaded: load one first", 409)
        return replace(self, canary_weight=weight)

    def promoted(self) -> RoutingTable[M]:
        """The canary becomes stable; the canary slot empties."""
        if self.canary is None:
            raise RequestRejected("no_canary", "no canary is loaded: nothing to promote", 409)
        return replace(self, stable=self.canary, canary=None, canary_weight=0)

    def rolled_back(self) -> RoutingTable[M]:
        """Weight 0 and the canary unloaded. Rolling back with no canary changes nothing."""
        return replace(self, canary=None, canary_weight=0)

    def with_latency(self, slot: str, ms: float) -> RoutingTable[M]:
        check_slot(slot)
        if type(ms) not in (int, float) or not 0.0 <= ms <= MAX_INJECTED_MS:
            raise RequestRejected(
                "bad_latency", f"injected latency must be 0-{MAX_INJECTED_MS:g} ms, got {ms!r}"
            )
        if slot == STABLE:
            return replace(self, stable_latency_ms=float(ms))
        return replace(self, canary_latency_ms=float(ms))


def check_slot(slot: object) -> str:
    if slot not in SLOTS:
        raise RequestRejected("bad_slot", f"slot must be one of {', '.join(SLOTS)}, got {slot!r}")
    return str(slot)

"""The worker's canary: its weight, the lease that holds it, and the one way it leaves traffic.

A canary weight above 0 holds only under a lease the release renews; the watchdog takes a
canary whose lease ran out to weight 0 on its own. Every way a canary leaves a worker — the
fleet's rollback for a verdict, a dead release, an orphan, a champion rollback, an operator, and
the lease running out — goes through `take_canary_out` with its reason
(`relay.types.CanaryRemoval`), which the worker logs and counts (`canary_removals` in
/admin/state). A part of `serving.worker.Worker` (its base class), apart so that the canary's
rules read in one place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from relay.settings import Settings
from relay.types import CanaryRemoval
from serving.routing import RoutingTable, grant_lease
from serving.schema import RequestRejected

log = logging.getLogger("serving.worker")

LEASE_CHECK_S = 0.1  # a lapsed canary keeps its users at most this much longer


class CanaryControl:
    """The canary's admin operations and lease watchdog; `Worker` provides what is declared."""

    settings: Settings
    table: RoutingTable[Any]
    clock: Callable[[], float]
    canary_removals: dict[str, int]
    _admin_lock: asyncio.Lock

    def _swap(self, table: RoutingTable[Any]) -> None:
        raise NotImplementedError  # the worker's: one swap of the routing table

    def state(self) -> dict[str, Any]:
        raise NotImplementedError  # the worker's: what /admin/state shows

    async def set_weight(self, weight: int, lease_s: object = None) -> dict[str, Any]:
        """Canary (and baseline) weight; above 0 it holds for `lease_s` seconds unless renewed."""
        async with self._admin_lock:
            max_s = self.settings.serving_canary_lease_max_s
            lease = None if lease_s is None else grant_lease(lease_s, self.clock(), max_s)
            table = self.table.with_weight(weight, lease)
            if table.canary_weight > 0 and lease is None:
                raise RequestRejected(
                    "missing_field",
                    "a canary weight above 0 holds only under a lease: the body needs "
                    f"'lease_s' (seconds, at most {max_s:g}), renewed through /admin/renew",
                )
            self._swap(table)
            if lease is not None and weight > 0:
                log.info("canary weight set to %d, leased for %g s", weight, lease.length_s)
            else:
                log.info("canary weight set to %d", weight)
            return self.state()

    async def renew(self, lease_s: object) -> dict[str, Any]:
        """A fresh lease for the canary's current weight; 409 if it has none or it ran out."""
        async with self._admin_lock:
            self.expire_lease()  # a lease already past its end is over, whether or not noticed
            now = self.clock()
            lease = grant_lease(lease_s, now, self.settings.serving_canary_lease_max_s)
            self._swap(self.table.renewed(lease, now))
            log.debug("canary lease renewed for %g s", lease.length_s)
            return self.state()

    def expire_lease(self) -> bool:
        """Take the canary's weight to 0 if its lease has run out; True if it did now."""
        return self.take_canary_out(CanaryRemoval.lease_expired)

    def take_canary_out(self, reason: CanaryRemoval) -> bool:
        """The worker's one way to take a canary out of traffic, for `reason`; True if it did.

        A lease that ran out moves only the weight (stable, canary and baseline stay loaded: the
        release may still be alive behind a slow renewal, and the guard unloads an orphan); every
        other reason is the fleet's rollback: weight 0, canary and baseline unloaded. Not
        awaited, so the lease watchdog takes a canary out without waiting on the admin lock.
        """
        table = self.table
        if reason is CanaryRemoval.lease_expired:
            after = table.lapsed(self.clock())
            acts = after is not table
        else:
            after = table.rolled_back()
            acts = table.canary is not None or table.baseline is not None or table.canary_weight > 0
        if not acts:
            return False
        self._swap(after)
        self.canary_removals[reason.value] = self.canary_removals.get(reason.value, 0) + 1
        canary = table.canary.version if table.canary else "(none)"
        if reason is CanaryRemoval.lease_expired:
            lease = table.lease
            log.warning(
                "canary %s: its %g s lease ran out without a renewal (is the release still "
                "running?): weight %d -> 0; stable %s and baseline %s serve as before",
                canary,
                lease.length_s if lease else 0.0,
                table.canary_weight,
                table.stable.version if table.stable else "(none)",
                table.baseline.version if table.baseline else "(none)",
            )
        else:
            log.info(
                "canary %s taken out (%s): weight %d -> 0, canary and baseline unloaded",
                canary,
                reason.value,
                table.canary_weight,
            )
        return True

    @property
    def lease_expirations(self) -> int:
        return self.canary_removals.get(CanaryRemoval.lease_expired.value, 0)

    async def _watch_leases(self) -> None:
        while True:
            await asyncio.sleep(LEASE_CHECK_S)
            try:
                self.expire_lease()
            except Exception:  # a bug here must not stop the watchdog for good
                log.exception("canary lease check failed")

    async def rollback(self, reason: CanaryRemoval = CanaryRemoval.operator) -> dict[str, Any]:
        """The fleet's rollback on this worker: `take_canary_out` under the admin lock."""
        async with self._admin_lock:
            self.take_canary_out(reason)
            return self.state()

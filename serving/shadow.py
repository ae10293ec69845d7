"""The shadow: a share of stable's requests also scored by the canary slot, after the answer.

While a shadow is on (`POST /admin/shadow`, leased like the canary weight: a release that dies
leaves it on for one lease at most), a request stable answered is, when a keyed hash of its id
falls under the share, handed to the canary slot's batcher once its own answer is on its way
(`loop.call_soon` after the transport was told: the reply is written first). The mirrored
answer never reaches the user and never counts as served: it has no inference_logs row, no
impressions (the worker's batch hook skips it) and no feedback can name it. What it leaves is
one `shadow_pairs` row (logstore.log_tables.SHADOW_PAIRS) through the same durable spool:
both latencies, the shadow's error code, both top-k item ids.

Both latencies are measured alike, so a pair compares like with like: from the request's
arrival to its scores (injected holds included), the shadow's time before its own queue taken
as stable's (the parse and routing both share). Mirrors in flight are bounded (`max_queue`);
one more, or one whose pair log is behind, is dropped and counted — never queued, so a slow
candidate cannot hold memory or users' answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from logstore.spool import RequestLogWriter
from relay.settings import Settings
from serving.batching import BatchTiming
from serving.exchange import Exchange, Served
from serving.routing import CANARY, Injection, RoutingTable
from serving.schema import RAW_ORDER, RequestRejected

SHADOW = "shadow"  # the transport of a mirrored exchange: never a user's
_ITEM_ID = RAW_ORDER.index("item_id")


@dataclass(frozen=True)
class ShadowSetting:
    """What /admin/shadow set: the share mirrored, the in-flight bound, the lease."""

    share: float
    max_queue: int
    length_s: float
    until: float  # on the worker's monotonic clock

    def seconds_left(self, now: float) -> float:
        return max(self.until - now, 0.0)


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise RequestRejected("bad_shadow", f"'{name}' must be a number, got {value!r}")
    return float(value)


def shadow_setting(body: dict[str, Any], settings: Settings, now: float) -> ShadowSetting | None:
    """The setting a /admin/shadow body asks for (None: off); 400 naming the field at fault."""
    share = _number(body, "share", settings.serving_shadow_share)
    if share == 0:
        return None
    if not 0 < share <= settings.serving_shadow_max_share:
        raise RequestRejected(
            "bad_shadow",
            f"'share' must be above 0 and at most {settings.serving_shadow_max_share:g} "
            f"(RELAY_SERVING_SHADOW_MAX_SHARE), or 0 to stop, got {share:g}",
        )
    queue = body.get("max_queue", settings.serving_shadow_queue)
    cap = settings.serving_shadow_max_queue
    if type(queue) is not int or not 1 <= queue <= cap:
        raise RequestRejected(
            "bad_shadow",
            f"'max_queue' must be a whole number 1-{cap} (RELAY_SERVING_SHADOW_MAX_QUEUE), "
            f"got {queue!r}",
        )
    if "lease_s" not in body:
        raise RequestRejected(
            "missing_field",
            "a shadow holds only under a lease: the body needs 'lease_s' (seconds, at most "
            f"{settings.serving_canary_lease_max_s:g}); call again to renew, 'share': 0 to stop",
        )
    lease = _number(body, "lease_s", 0.0)
    if not 0 < lease <= settings.serving_canary_lease_max_s:
        raise RequestRejected(
            "bad_lease",
            f"lease_s must be above 0 and at most {settings.serving_canary_lease_max_s:g} "
            f"(RELAY_SERVING_CANARY_LEASE_MAX_S), got {lease:g}",
        )
    return ShadowSetting(share, queue, lease, now + lease)


def mirrored(request_id: str, share: float) -> bool:
    """Whether a request is mirrored: a keyed hash of its id under the share (stable per id)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8, key=b"shadow").digest()
    return int.from_bytes(digest, "little") < share * 2**64


def top_k(raw: np.ndarray, scores: np.ndarray, k: int) -> list[int]:
    """The item ids of the `k` best-scored candidates, best first (ties in arrival order)."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:k]
    return [int(i) for i in raw[order, _ITEM_ID]]


@dataclass
class ShadowCounts:
    """What /metrics and /admin/state show of the shadow, since the worker started."""

    mirrored: int = 0  # handed to the canary slot
    dropped: int = 0  # chosen but not mirrored: the queue was full or the pair log behind
    errors: int = 0  # mirrored, and the canary slot answered with an error
    lapsed: int = 0  # shadows whose lease ran out without a renewal


class ShadowMirror:
    """The worker's shadow: its setting, the mirrors in flight, and the pair log."""

    def __init__(
        self,
        settings: Settings,
        pair_log: RequestLogWriter | None,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.pair_log = pair_log
        self.clock = clock
        self.setting: ShadowSetting | None = None
        self.in_flight = 0
        self.counts = ShadowCounts()

    def set(self, setting: ShadowSetting | None) -> None:
        self.setting = setting

    def active(self) -> ShadowSetting | None:
        """The setting while its lease holds; a lease that ran out turns the shadow off."""
        setting = self.setting
        if setting is not None and self.clock() >= setting.until:
            self.setting = setting = None
            self.counts.lapsed += 1
        return setting

    def chooses(self, request_id: str) -> bool:
        """Whether this request, now being routed to stable, is to be mirrored once answered."""
        setting = self.active()
        return setting is not None and mirrored(request_id, setting.share)

    def after_answer(
        self,
        done: Callable[[Exchange], None],
        request_id: str,
        raw: np.ndarray,
        table: RoutingTable[Served],
    ) -> Callable[[Exchange], None]:
        """`done`, then (if this stable request is chosen) mirrored to the canary once answered."""
        canary = table.canary
        if canary is None or not self.chooses(request_id):
            return done
        injection, ranking = table.injection(CANARY), table.ranking(CANARY)

        def answered(ex: Exchange) -> None:
            done(ex)  # the transport resumes first: call_soon runs after it was woken
            asyncio.get_running_loop().call_soon(self.mirror, ex, raw, canary, injection, ranking)

        return answered

    def mirror(
        self,
        ex: Exchange,
        raw: np.ndarray,
        canary: Served,
        injection: Injection,
        ranking: str,
    ) -> None:
        """Score stable's answered `ex` on the canary slot; its pair row follows. On the loop."""
        setting = self.setting
        if ex.status != 200 or ex.scores is None or setting is None:
            return  # stable did not answer (nothing to pair), or the shadow just stopped
        answered_s = time.perf_counter() - ex.t0
        limit = self.settings.serving_log_max_pending_rows
        pair_log = self.pair_log
        log_behind = pair_log is not None and (
            pair_log.pending > limit or pair_log.spool.over_cap  # never at the answers' cost
        )
        if self.in_flight >= setting.max_queue or log_behind:
            self.counts.dropped += 1
            return
        self.in_flight += 1
        self.counts.mirrored += 1
        shadow = Exchange(SHADOW, ex.ts, time.perf_counter())
        shadow.request_id, shadow.user_id, shadow.session_id = (
            ex.request_id,
            ex.user_id,
            ex.session_id,
        )
        shadow.slot, shadow.version, shadow.lineage_id = (
            CANARY,
            canary.model.version,
            canary.model.lineage_id,
        )
        shadow.ranking = ranking
        before_queue = ex.t_enqueued - ex.t0  # parse and routing: the pair's shared part
        stable = (ex, answered_s, top_k(raw, ex.scores, self.settings.serving_shadow_top_k))

        def scored(
            scores: np.ndarray | None, batch: BatchTiming | None, error: RequestRejected | None
        ) -> None:
            if error is not None:
                shadow.reject(error)
            elif scores is None or not np.isfinite(scores).all():
                shadow.reject(RequestRejected("non_finite_score", "NaN/inf", 500))
            else:
                shadow.scores = scores
            if injection.holds and injection.applies(ex.request_id):
                injection.delay(shadow.t0, lambda _took_s: self._pair(shadow, raw, stable))
            else:
                self._pair(shadow, raw, stable)

        shadow.t_enqueued = shadow.t0
        shadow.t0 -= before_queue  # as if it had arrived with stable's request
        canary.batcher.submit(raw, scored, shadow)

    def _pair(
        self, shadow: Exchange, raw: np.ndarray, stable: tuple[Exchange, float, list[int]]
    ) -> None:
        self.in_flight -= 1
        ex, stable_s, stable_top = stable
        shadow_s = time.perf_counter() - shadow.t0
        if shadow.status != 200:
            self.counts.errors += 1
        shadow_top = (
            top_k(raw, shadow.scores, self.settings.serving_shadow_top_k)
            if shadow.scores is not None and shadow.status == 200
            else []
        )
        if self.pair_log is not None:
            self.pair_log.append(
                (
                    ex.ts,
                    ex.request_id,
                    ex.user_id,
                    ex.version,
                    shadow.version,
                    stable_s * 1000,
                    shadow_s * 1000,
                    shadow.error_code,
                    ex.rows,
                    stable_top,
                    shadow_top,
                )
            )

    def state(self) -> dict[str, Any]:
        """What /admin/state shows of the shadow."""
        setting = self.active()
        return {
            "on": setting is not None,
            "share": setting.share if setting else 0.0,
            "max_queue": setting.max_queue if setting else 0,
            "seconds_left": round(setting.seconds_left(self.clock()), 3) if setting else None,
            "in_flight": self.in_flight,
            "mirrored": self.counts.mirrored,
            "dropped": self.counts.dropped,
            "errors": self.counts.errors,
            "lapsed": self.counts.lapsed,
            "pair_log": self.pair_log is not None,
        }

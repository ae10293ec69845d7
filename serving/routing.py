"""Stable/baseline/canary routing: one immutable table, replaced whole, sticky per-user cohorts.

During a canary the users split three ways by one keyed hash: the canary's weight w of them go
to the canary, the next w to the baseline (the stable version loaded fresh into its own slot
with its own batcher), and the rest to stable. Canary and baseline therefore see equal shares,
equally warm engines and equally full batches, so the gate compares like with like (Kayenta's
design); stable keeps serving everyone else.

Every change (load, weight, promote, rollback, injected latency, a lease running out) builds a
new table from the old one and the worker swaps the reference in one assignment, so a request
reads either the old table or the new one, never a mix.

A canary weight above 0 is leased (the worker's admin API grants no weight without one): the
release renews the lease while it watches the canary, and a lease that runs out takes the
canary's weight to 0 on this worker alone, with stable, canary and baseline left loaded. A
release controller that dies therefore cannot leave users on an unjudged version for longer
than one lease, and the workers need not talk to each other to converge on stable.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

import numpy as np

from relay.types import CanaryRemoval
from serving.batching import EngineFault
from serving.schema import RequestRejected

STABLE = "stable"
CANARY = "canary"
BASELINE = "baseline"
SLOTS = (STABLE, CANARY, BASELINE)
# The slot value of a load test's log rows (a request pinned to a slot by an admin, see
# serving/api/predict.py): never a routing slot, so no gate, drift, experiment or impact query
# that selects stable, canary or baseline counts it, and it writes no impressions.
LOAD_TEST = "loadtest"
PINNABLE = (STABLE, CANARY)
# Where a request's time goes (its inference_logs row splits latency into these).
STAGES = ("queue", "preprocess", "compute", "postprocess")
# "hold": the request is held after scoring and the time booked to `stage` (rehearses a slow
# canary); "engine": the stage itself runs slower on the engine thread (a real cause: it is
# measured by the stage's timer and queues the requests behind it), preprocess or compute only;
# "cpu": the request's handler burns the time on the CPU after scoring, on the event loop and
# holding the GIL, so every other request waits behind it (a costlier request path: what a
# capacity test must see, where a hold or an engine-thread sleep costs the worker no CPU).
INJECTION_MODES = ("hold", "engine", "cpu")
ENGINE_STAGES = ("preprocess", "compute")
MAX_INJECTED_MS = 60_000.0
# A cpu-mode request blocks the event loop for its whole burn (health checks, lease renewals and
# the admin call that would clear it wait behind): a costlier request path, never a frozen worker.
MAX_CPU_BURN_MS = 50.0
BURN_WALL_FACTOR = 20.0  # spend_cpu gives up after this many times its burn in wall time
MAX_SLOWDOWN = 100.0
# How a slot ranks its answers: by the model's scores, or (to rehearse a version that is fast
# but serves worse feeds, as a train/serve skew would) its scores reversed or shuffled.
RANKINGS = ("model", "reversed", "shuffled")


@dataclass(frozen=True)
class CanaryLease:
    """How long the canary's weight holds without a renewal, on the worker's monotonic clock."""

    length_s: float
    until: float
    lapsed: bool = False  # ran out: the weight went to 0 and stays there until set again

    def seconds_left(self, now: float) -> float:
        return 0.0 if self.lapsed else max(self.until - now, 0.0)


def grant_lease(lease_s: object, now: float, max_s: float) -> CanaryLease:
    """A lease of `lease_s` seconds from `now`; refused (400) unless 0 < lease_s <= max_s."""
    length = math.nan  # for anything but a number (True is an int to Python, not seconds)
    if isinstance(lease_s, int | float) and not isinstance(lease_s, bool):
        length = float(lease_s)
    if not 0 < length <= max_s:  # NaN fails here, and so does inf
        raise RequestRejected(
            "bad_lease",
            f"lease_s must be a number of seconds above 0 and at most {max_s:g} "
            f"(RELAY_SERVING_CANARY_LEASE_MAX_S), got {lease_s!r}",
        )
    return CanaryLease(length, now + length)


@dataclass(frozen=True)
class Injection:
    """Latency added to a slot's requests, to rehearse a slow canary: `ms` plus a slowdown.

    `factor` 1.5 makes every request take 1.5x as long as it did (multiplicative, like a slower
    model), `ms` adds a fixed delay on top. `stage` is where the added time is booked in the
    request's log row and trace, so a test or the demo can plant a cause (a slower model is
    `compute`, a slower feature pipeline `preprocess`) for root-cause attribution to find.
    """

    ms: float = 0.0
    factor: float = 1.0
    stage: str = "compute"
    mode: str = "hold"  # one of INJECTION_MODES
    # Of the slot's requests, the share held (a keyed hash of the request id, so a mirrored
    # request is held as its twin would be): below 1 it plants a tail, a few per cent of
    # requests several times slower, which moves the P95 far more than the mean. Hold or cpu.
    share: float = 1.0

    @property
    def holds(self) -> bool:
        """Whether requests are delayed after scoring: held (mode hold) or burning CPU (cpu)."""
        return self.mode in ("hold", "cpu") and (self.ms > 0 or self.factor > 1)

    @property
    def burns(self) -> bool:
        """Whether the delay is spent on the CPU, blocking the event loop (mode cpu)."""
        return self.mode == "cpu" and self.holds

    def delay(self, started: float, then: Callable[[float], None]) -> None:
        """Delay a scored request that began at `started` (perf_counter) by this injection, then
        call `then` with the seconds the delay really took (timer lateness included): on the
        CPU at once (mode cpu), or on the running event loop's timer (mode hold)."""
        began = time.perf_counter()
        extra = self.extra_s(began - started)
        if self.burns:
            self.spend_cpu(extra)
            then(time.perf_counter() - began)
        else:
            asyncio.get_running_loop().call_later(extra, lambda: then(time.perf_counter() - began))

    def spend_cpu(self, seconds: float) -> None:
        """Spend `seconds` of the calling thread's own CPU time (at most MAX_CPU_BURN_MS).

        CPU time, not wall time: on a shared core a wall-clock burn spent less CPU the busier
        the host was, so a planted "costlier request" cost whatever the neighbours left it (a
        unit test saw 2 ms of CPU in 12 ms of wall). A wall-clock bound of BURN_WALL_FACTOR
        times the burn ends it on a starved core rather than hold the event loop indefinitely.
        """
        burn = min(seconds, MAX_CPU_BURN_MS / 1000)
        end = time.thread_time() + burn
        give_up = time.perf_counter() + BURN_WALL_FACTOR * burn + 0.1
        while time.thread_time() < end and time.perf_counter() < give_up:
            pass

    def applies(self, request_id: str) -> bool:
        """Whether this request is one of the `share` held."""
        if self.share >= 1.0:
            return True
        digest = hashlib.blake2b(request_id.encode(), digest_size=8, key=b"inject").digest()
        return int.from_bytes(digest, "little") < self.share * 2**64

    def engine_fault(self) -> EngineFault | None:
        """What the engine thread must spend (mode engine), None otherwise."""
        if self.mode != "engine" or (self.ms <= 0 and self.factor <= 1):
            return None
        return EngineFault(self.stage, self.ms, self.factor)

    def extra_s(self, elapsed_s: float) -> float:
        """Seconds to hold a request that has taken `elapsed_s` so far."""
        return self.ms / 1000 + (self.factor - 1.0) * elapsed_s


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
    """Which model serves each slot, the canary's (and baseline's) share of users, injections."""

    stable: M | None = None
    canary: M | None = None
    baseline: M | None = None
    canary_weight: int = 0  # the baseline, when loaded, takes the same share
    lease: CanaryLease | None = None  # what keeps canary_weight above 0; None at weight 0
    injections: dict[str, Injection] = field(default_factory=dict)  # never mutated: replaced
    rankings: dict[str, str] = field(default_factory=dict)  # slot -> one of RANKINGS, likewise

    def route(self, user_id: int) -> tuple[str, M] | None:
        """(slot, model) for this user, or None when nothing can serve them."""
        canary = self.canary
        if canary is not None and self.canary_weight > 0:
            bucket = route_bucket(user_id, canary.version)
            if bucket < self.canary_weight:
                return CANARY, canary
            if self.baseline is not None and bucket < 2 * self.canary_weight:
                return BASELINE, self.baseline
        if self.stable is None:
            return None
        return STABLE, self.stable

    def model(self, slot: str) -> M | None:
        return {STABLE: self.stable, CANARY: self.canary, BASELINE: self.baseline}.get(slot)

    def injection(self, slot: str) -> Injection:
        return self.injections.get(slot, Injection())

    def ranking(self, slot: str) -> str:
        return self.rankings.get(slot, "model")

    def models(self) -> set[M]:
        return {m for m in (self.stable, self.canary, self.baseline) if m is not None}

    # -- transitions: each returns a new table or raises RequestRejected ------------------------
    def with_loaded(self, slot: str, model: M) -> RoutingTable[M]:
        """`model` in `slot`. A newly loaded canary or baseline takes no traffic until a weight is set."""
        check_slot(slot)
        if slot == STABLE:
            return replace(self, stable=model)
        if slot == BASELINE:
            if self.canary_weight > 50:
                raise RequestRejected(
                    "bad_weight",
                    f"the canary takes {self.canary_weight}% of users: no room for an equal baseline",
                    409,
                )
            return replace(self, baseline=model)
        return replace(self, canary=model, canary_weight=0, lease=None)

    def with_weight(self, weight: int, lease: CanaryLease | None = None) -> RoutingTable[M]:
        """The canary (and baseline) take `weight` % of users each, held by `lease`."""
        if type(weight) is not int or not 0 <= weight <= 100:
            raise RequestRejected("bad_weight", f"weight must be an integer 0-100, got {weight!r}")
        if weight > 0 and self.canary is None:
            raise RequestRejected("no_canary", "no canary is loaded: load one first", 409)
        if weight > 50 and self.baseline is not None:
            raise RequestRejected(
                "bad_weight",
                f"with a baseline the canary can take at most 50% of users (the baseline takes as many), got {weight}",
            )
        return replace(self, canary_weight=weight, lease=lease if weight > 0 else None)

    def renewed(self, lease: CanaryLease, now: float) -> RoutingTable[M]:
        """The same weight held by a fresh lease; refused (409) when there is nothing to renew."""
        if self.canary is None:
            raise RequestRejected("no_canary", "no canary is loaded: nothing to renew", 409)
        held = self.lease
        if held is not None and held.lapsed:
            raise RequestRejected(
                "lease_expired",
                f"the canary's {held.length_s:g} s lease ran out {now - held.until:.1f} s ago and "
                "its weight went to 0: set the weight again with a new lease",
                409,
            )
        if self.canary_weight == 0 or held is None:
            raise RequestRejected(
                "no_lease", "the canary takes no traffic (weight 0): no lease to renew", 409
            )
        return replace(self, lease=lease)

    def lapsed(self, now: float) -> RoutingTable[M]:
        """Weight 0 if the canary's lease has run out by `now`, else this same table."""
        lease = self.lease
        if lease is None or lease.lapsed or self.canary_weight == 0 or now < lease.until:
            return self
        return replace(self, canary_weight=0, lease=replace(lease, lapsed=True))

    def promoted(self) -> RoutingTable[M]:
        """The canary becomes stable; the canary and baseline slots empty."""
        if self.canary is None:
            raise RequestRejected("no_canary", "no canary is loaded: nothing to promote", 409)
        return replace(
            self, stable=self.canary, canary=None, baseline=None, canary_weight=0, lease=None
        )

    def rolled_back(self) -> RoutingTable[M]:
        """Weight 0, canary and baseline unloaded. Rolling back with no canary changes nothing."""
        return replace(self, canary=None, baseline=None, canary_weight=0, lease=None)

    def with_latency(
        self,
        slot: str,
        ms: float,
        factor: float = 1.0,
        stage: str = "compute",
        mode: str = "hold",
        share: float = 1.0,
    ) -> RoutingTable[M]:
        """`share` of `slot`'s requests take `factor` times as long, plus `ms`, in `stage`."""
        check_slot(slot)
        if mode not in INJECTION_MODES:
            raise RequestRejected(
                "bad_mode", f"mode must be one of {', '.join(INJECTION_MODES)}, got {mode!r}"
            )
        stages = ENGINE_STAGES if mode == "engine" else STAGES
        if stage not in stages:
            raise RequestRejected(
                "bad_stage",
                f"stage must be one of {', '.join(stages)} in mode {mode}, got {stage!r}",
            )
        if type(ms) not in (int, float) or not 0.0 <= ms <= MAX_INJECTED_MS:
            raise RequestRejected(
                "bad_latency", f"injected latency must be 0-{MAX_INJECTED_MS:g} ms, got {ms!r}"
            )
        if type(factor) not in (int, float) or not 1.0 <= factor <= MAX_SLOWDOWN:
            raise RequestRejected(
                "bad_latency", f"slowdown factor must be 1-{MAX_SLOWDOWN:g}, got {factor!r}"
            )
        if type(share) not in (int, float) or not 0.0 < share <= 1.0:
            raise RequestRejected(
                "bad_latency", f"share must be above 0 and at most 1, got {share!r}"
            )
        if mode == "cpu" and ms > MAX_CPU_BURN_MS:
            raise RequestRejected(
                "bad_latency",
                f"mode cpu burns at most {MAX_CPU_BURN_MS:g} ms per request on the event loop, "
                f"got {ms!r}",
            )
        if share < 1.0 and mode == "engine":
            raise RequestRejected(
                "bad_mode", "a share below 1 delays single requests: mode hold or cpu only"
            )
        injection = Injection(float(ms), float(factor), stage, mode, float(share))
        injections = {**self.injections, slot: injection}
        return replace(self, injections=injections)

    def with_ranking(self, slot: str, ranking: str) -> RoutingTable[M]:
        """Answers of `slot` ranked `ranking` (see RANKINGS); latency is untouched."""
        check_slot(slot)
        if ranking not in RANKINGS:
            raise RequestRejected(
                "bad_ranking", f"ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}"
            )
        return replace(self, rankings={**self.rankings, slot: ranking})


def perturbed(scores: np.ndarray, ranking: str, rng: np.random.Generator) -> np.ndarray:
    """The same scores, moved so that the feed they rank is `ranking`'s.

    `reversed` gives the best-scored candidate the lowest score and so on (a feed upside down);
    `shuffled` hands the scores out at random. The set of scores is unchanged (so is their
    distribution), but each item's score no longer matches how likely it is to be clicked.
    """
    if ranking == "model" or len(scores) < 2:
        return scores
    if ranking == "shuffled":
        return rng.permutation(scores)
    out = np.empty_like(scores)
    order = np.argsort(-scores, kind="stable")
    out[order] = np.sort(scores, kind="stable")
    return out


def check_pinned_slot(slot: object) -> str:
    """The slot a load-test request is pinned to (400 unless stable or canary)."""
    if slot not in PINNABLE:
        raise RequestRejected(
            "bad_slot", f"a load test pins one of {', '.join(PINNABLE)}, got {slot!r}"
        )
    return str(slot)


def check_slot(slot: object) -> str:
    if slot not in SLOTS:
        raise RequestRejected("bad_slot", f"slot must be one of {', '.join(SLOTS)}, got {slot!r}")
    return str(slot)


# A lease runs out on the worker itself: no caller may say so.
_GIVEN_REASONS = {r.value: r for r in CanaryRemoval if r is not CanaryRemoval.lease_expired}


def check_removal_reason(reason: object) -> CanaryRemoval:
    """Why the fleet takes this canary out (400 unless a CanaryRemoval a caller may give)."""
    if not isinstance(reason, str) or reason not in _GIVEN_REASONS:
        raise RequestRejected(
            "bad_reason", f"reason must be one of {', '.join(_GIVEN_REASONS)}, got {reason!r}"
        )
    return _GIVEN_REASONS[reason]

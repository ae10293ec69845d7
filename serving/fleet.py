"""Fleet control: admin operations across every serving worker, two-phase where traffic moves.

A canary deploy first loads and warms the version on every worker (weight untouched), and the
baseline (the stable version, loaded fresh into its own slot), then verifies every worker is
ready with the same canary and baseline, and only then switches weights. If a load or the
check fails anywhere, canary and baseline are unloaded everywhere and no weight moved.
Each call returns a FleetResult: the phase reached, why it stopped, and every worker's answer.

Every weight goes out with a lease (`lease_s`, RELAY_SERVING_CANARY_LEASE_S by default): a
weight above 0 holds on a worker only until its lease runs out, unless renewed (`renew`, or
`renewing` around a stretch of analysis). A release controller that dies stops renewing, and
every worker takes the canary to weight 0 on its own.

    fleet = FleetClient.from_settings(get_settings())       # or FleetClient(urls, token)
    fleet.deploy_canary("v42", weight=5, baseline="v41")     # load+warm all, verify, weight 5
    fleet.set_weight(25); fleet.renew(); fleet.promote(); fleet.rollback(); fleet.state()
    with fleet.renewing():                                   # renewed until the block ends
        watch_the_canary()
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from opentelemetry import propagate

from relay.errors import ConfigError
from relay.settings import Settings
from relay.types import CanaryRemoval
from serving.admin_channel import AdminCalls, HttpxCalls, PooledChannel, Reply
from serving.routing import BASELINE, CANARY, STABLE, check_slot

log = logging.getLogger("serving.fleet")

LOAD_TIMEOUT_S = 300.0  # a load downloads, verifies and warms an engine
CALL_TIMEOUT_S = 10.0
DEFAULT_LEASE_S: float = Settings.model_fields["serving_canary_lease_s"].default
RENEWALS_PER_LEASE = 3  # a lease sees this many renewals, so one or two may fail


@dataclass(frozen=True)
class WorkerResult:
    """One worker's answer to one admin call."""

    url: str
    ok: bool
    status: int | None  # HTTP status; None when the worker could not be reached
    error: str = ""  # the worker's error code, or "unreachable"
    detail: str = ""
    state: dict[str, Any] = field(default_factory=dict)  # the worker's state after the call

    @property
    def canary_version(self) -> str | None:
        return self.version_in(CANARY)

    @property
    def stable_version(self) -> str | None:
        return self.version_in(STABLE)

    @property
    def baseline_version(self) -> str | None:
        return self.version_in(BASELINE)

    def version_in(self, slot: str) -> str | None:
        """The version the worker holds in `slot` after the call, None if empty."""
        held = self.state.get("slots", {}).get(slot)
        return held["version"] if held else None


@dataclass(frozen=True)
class FleetResult:
    """An operation across the fleet: whether it completed, where it stopped, and why."""

    operation: str
    ok: bool
    phase: str  # the last phase attempted: load, verify, switch (or the one-phase op's name)
    reason: str
    workers: list[WorkerResult]
    undo: list[WorkerResult] = field(default_factory=list)  # calls made to undo a failed phase

    def failed(self) -> list[WorkerResult]:
        return [w for w in self.workers if not w.ok]

    def details(self) -> dict[str, Any]:
        """The phase and each worker's answer, as a release event keeps them."""
        return {
            "phase": self.phase,
            "workers": [
                {"url": w.url, "ok": w.ok, "status": w.status, "error": w.error, "detail": w.detail}
                for w in self.workers
            ],
        }


class FleetClient:
    """Drives every worker's admin API; calls to different workers run in parallel."""

    def __init__(
        self,
        urls: Sequence[str],
        token: str,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
        lease_s: float = DEFAULT_LEASE_S,
        calls: AdminCalls | None = None,
    ) -> None:
        """`calls` (default: pooled connections for http workers, httpx for https or a given
        `transport`) is closed with this client only if this client made it."""
        if not urls:
            raise ConfigError("the fleet has no workers: set RELAY_SERVING_FLEET_URLS")
        if not token:
            raise ConfigError("no admin token: set RELAY_SERVING_ADMIN_TOKEN")
        self.urls = [u.rstrip("/") for u in urls]
        self.lease_s = lease_s
        self.timeout_s = timeout_s
        self._owns_calls = calls is None
        if calls is not None:
            self._calls = calls
        elif transport is None and all(u.startswith("http://") for u in self.urls):
            self._calls = PooledChannel(token)
        else:
            self._calls = HttpxCalls(token, transport)

    @classmethod
    def from_settings(cls, settings: Settings, urls: Sequence[str] | None = None) -> FleetClient:
        """The fleet's workers (or those of `urls`) on the process's shared pool: a rollback
        reuses the connections the deploy and the lease renewals opened, rather than opening one
        per worker after the verdict."""
        if urls is None:
            urls = [u.strip() for u in settings.serving_fleet_urls.split(",") if u.strip()]
        token = settings.serving_admin_token.get_secret_value()
        plain = bool(urls) and all(u.startswith("http://") for u in urls)
        return cls(
            urls,
            token,
            lease_s=settings.serving_canary_lease_s,
            calls=shared_channel(token) if plain and token else None,
        )

    def close(self) -> None:
        if self._owns_calls:
            self._calls.close()

    def __enter__(self) -> FleetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations ----------------------------------------------------------------------------
    def state(self) -> FleetResult:
        """Every worker's state."""
        results = self._each("GET", "/admin/state")
        return self._one_phase("state", results)

    def load(self, slot: str, version: str) -> FleetResult:
        """Load `version` into `slot` everywhere, then verify every worker holds it and is ready."""
        check_slot(slot)
        loaded = self._each(
            "POST", "/admin/load", {"slot": slot, "version": version}, LOAD_TIMEOUT_S
        )
        if not all(r.ok for r in loaded):
            return FleetResult("load", False, "load", _why(loaded), loaded)
        return self._verify("load", slot, loaded)

    def deploy_canary(
        self,
        version: str,
        weight: int,
        baseline: str | None = None,
        lease_s: float | None = None,
    ) -> FleetResult:
        """Load+warm `version` as canary (and `baseline` beside it) everywhere, verify, set `weight`.

        The weight holds for `lease_s` (default: this client's lease) unless renewed. If any
        worker fails to load or verify either, canary and baseline are rolled back on every
        worker and no weight changes: nothing is left loaded.
        """
        slots = [(CANARY, version)] + ([(BASELINE, baseline)] if baseline else [])
        loaded: list[WorkerResult] = []
        for slot, ref in slots:
            loaded = self._each(
                "POST", "/admin/load", {"slot": slot, "version": ref}, LOAD_TIMEOUT_S
            )
            if not all(r.ok for r in loaded):
                undo = self._each("POST", "/admin/rollback")
                why = f"{slot} {ref}: {_why(loaded)}"
                return FleetResult("deploy_canary", False, "load", why, loaded, undo)
        for slot, _ in slots:
            verified = self._verify("deploy_canary", slot, loaded)
            if not verified.ok:
                undo = self._each("POST", "/admin/rollback")
                return FleetResult(
                    "deploy_canary", False, "verify", verified.reason, verified.workers, undo
                )
        switched = self._each("POST", "/admin/weight", self._weight_body(weight, lease_s))
        return self._switch_result("deploy_canary", switched)

    def set_weight(self, weight: int, lease_s: float | None = None) -> FleetResult:
        """Verify every worker serves the same ready canary (and baseline), then move the weight.

        The weight holds for `lease_s` (default: this client's lease) unless renewed.
        """
        states = self._each("GET", "/admin/state")
        check = self._verify("set_weight", CANARY, states)
        if check.ok and any(r.baseline_version for r in states):
            check = self._verify("set_weight", BASELINE, states)
        if not check.ok and weight > 0:
            return check
        return self._switch_result(
            "set_weight", self._each("POST", "/admin/weight", self._weight_body(weight, lease_s))
        )

    def renew(self, lease_s: float | None = None) -> FleetResult:
        """A fresh lease of `lease_s` (default: this client's) for the canary's weight everywhere.

        A worker whose lease already ran out answers 409 `lease_expired`: its canary is at
        weight 0 until a weight is set again.
        """
        body = {"lease_s": self.lease_s if lease_s is None else lease_s}
        return self._one_phase("renew", self._each("POST", "/admin/renew", body))

    @contextmanager
    def renewing(
        self, lease_s: float | None = None, every_s: float | None = None
    ) -> Iterator[list[FleetResult]]:
        """Renew the lease now, every `every_s` (a third of the lease) while the block runs,
        and once more if the block ends without an exception.

        Yields the renewals' results. A failed renewal is logged, not raised: a worker whose
        lease ran out serves stable, which the analysis sees as less canary traffic.
        """
        lease = self.lease_s if lease_s is None else lease_s
        period = every_s if every_s is not None else lease / RENEWALS_PER_LEASE
        results: list[FleetResult] = []
        stop = threading.Event()

        def renew_once() -> None:
            result = self.renew(lease)
            results.append(result)
            if not result.ok:
                log.warning("canary lease renewal failed: %s", result.reason)

        def keep_renewing() -> None:
            while not stop.wait(period):
                renew_once()

        renew_once()
        thread = threading.Thread(target=keep_renewing, name="canary-lease", daemon=True)
        thread.start()
        try:
            yield results
        finally:
            stop.set()
            thread.join()
        renew_once()  # only after a block that ended normally: a failed one is rolled back

    def promote(self) -> FleetResult:
        """Verify every worker serves the same ready canary, then make it stable everywhere."""
        check = self._verify("promote", CANARY, self._each("GET", "/admin/state"))
        if not check.ok:
            return check
        return self._switch_result("promote", self._each("POST", "/admin/promote"))

    def take_canary_out(self, reason: CanaryRemoval) -> FleetResult:
        """Weight 0, canary and baseline unloaded on every worker, each independently (best
        effort), the reason told to each. Release code calls `tasks.canary_removal`, which
        records it."""
        body = {"reason": reason.value}
        return self._one_phase("rollback", self._each("POST", "/admin/rollback", body))

    def rollback(self) -> FleetResult:
        """`take_canary_out` by a person or a bench at the admin API."""
        return self.take_canary_out(CanaryRemoval.operator)

    def set_injected_latency(
        self,
        slot: str,
        ms: float,
        factor: float = 1.0,
        stage: str = "compute",
        mode: str = "hold",
        share: float = 1.0,
    ) -> FleetResult:
        """`share` of `slot`'s requests take `factor` times as long plus `ms` in `stage`, on
        every worker: held after scoring (mode hold), burnt on the CPU after scoring (mode cpu),
        or spent in the engine's batches (mode engine, every request)."""
        check_slot(slot)
        body = {"slot": slot, "ms": ms, "factor": factor, "stage": stage, "mode": mode}
        body["share"] = share
        return self._one_phase("set_injected_latency", self._each("POST", "/admin/latency", body))

    def set_shadow(self, share: float, max_queue: int, lease_s: float) -> FleetResult:
        """Mirror `share` of stable's answers to the canary slot on every worker, leased; the
        same call renews it. A worker from before the shadow answers 404."""
        body = {"share": share, "max_queue": max_queue, "lease_s": lease_s}
        return self._one_phase("set_shadow", self._each("POST", "/admin/shadow", body))

    def stop_shadow(self) -> FleetResult:
        """The shadow off on every worker (its lease would end it anyway)."""
        return self._one_phase("stop_shadow", self._each("POST", "/admin/shadow", {"share": 0}))

    def set_ranking(self, slot: str, ranking: str) -> FleetResult:
        """Answers of `slot` ranked by the model (`model`), upside down (`reversed`) or at random
        (`shuffled`), on every worker: a version that is fast but serves worse feeds."""
        check_slot(slot)
        body = {"slot": slot, "ranking": ranking}
        return self._one_phase("set_ranking", self._each("POST", "/admin/ranking", body))

    def _weight_body(self, weight: int, lease_s: float | None) -> dict[str, Any]:
        return {"weight": weight, "lease_s": self.lease_s if lease_s is None else lease_s}

    # -- phases --------------------------------------------------------------------------------
    def _verify(self, operation: str, slot: str, answers: list[WorkerResult]) -> FleetResult:
        """Every worker answered, is ready, and holds one and the same version in `slot`."""

        def version_of(r: WorkerResult) -> str | None:
            return r.version_in(slot)

        problems = []
        for r in answers:
            if not r.ok:
                problems.append(f"{r.url}: {r.error or r.status} {r.detail}".strip())
            elif not r.state.get("ready"):
                problems.append(f"{r.url}: not ready ({r.state.get('reason')})")
            elif version_of(r) is None:
                problems.append(f"{r.url}: no {slot} model loaded")
        versions = {version_of(r) for r in answers if r.ok and version_of(r) is not None}
        if len(versions) > 1:
            problems.append(f"workers hold different {slot} versions: {sorted(map(str, versions))}")
        if problems:
            return FleetResult(operation, False, "verify", "; ".join(problems), answers)
        return FleetResult(
            operation, True, "verify", f"{slot} {versions.pop()} ready on all", answers
        )

    def _switch_result(self, operation: str, results: list[WorkerResult]) -> FleetResult:
        if all(r.ok for r in results):
            return FleetResult(operation, True, "switch", "switched on every worker", results)
        return FleetResult(
            operation,
            False,
            "switch",
            f"switched on {sum(r.ok for r in results)} of {len(results)} workers: {_why(results)}",
            results,
        )

    def _one_phase(self, operation: str, results: list[WorkerResult]) -> FleetResult:
        ok = all(r.ok for r in results)
        return FleetResult(
            operation, ok, operation, "done on every worker" if ok else _why(results), results
        )

    def _each(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[WorkerResult]:
        """The same call on every worker, all at once; results in fleet order.

        The caller's current span goes with each call as W3C `traceparent`, so the workers'
        spans join its trace.
        """
        trace_headers: dict[str, str] = {}
        propagate.inject(trace_headers)
        replies = self._calls.call_each(
            self.urls,
            method,
            path,
            None if body is None else orjson.dumps(body),
            timeout_s or self.timeout_s,
            trace_headers,
        )
        return [_worker_result(url, reply) for url, reply in zip(self.urls, replies, strict=True)]


def _worker_result(url: str, reply: Reply) -> WorkerResult:
    """A worker's answer as the fleet reads it: its state on 200, its error code otherwise."""
    if reply.status is None:
        return WorkerResult(url, False, None, "unreachable", reply.error)
    try:
        payload = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        payload = {"detail": reply.body[:200].decode(errors="replace")}
    if not isinstance(payload, dict):
        payload = {"detail": str(payload)[:200]}
    if reply.status == 200:
        return WorkerResult(url, True, 200, state=payload)
    return WorkerResult(
        url,
        False,
        reply.status,
        str(payload.get("error", f"http_{reply.status}")),
        str(payload.get("detail", "")),
    )


@functools.cache
def shared_channel(token: str) -> PooledChannel:
    """The process's one pool of admin connections (made on first use, never at import)."""
    return PooledChannel(token)


def _why(results: list[WorkerResult]) -> str:
    return "; ".join(f"{r.url}: {r.error} {r.detail}".strip() for r in results if not r.ok)

"""The worker's core, shared by both transports: routing, loading, completion, timing, logging.

Everything here runs on the event loop thread except model loading (a worker thread) and the
engine calls (each model's batcher thread). Admin operations are serialised by one lock and
end in a single swap of the routing table. A watchdog task takes a canary whose lease ran out
to weight 0 without that lock, so a slow load never delays it.

Transports call `record` before they send an answer: it returns once the request's log row is
in the operating system's hands (`logstore.spool.RequestLogWriter.append`). A scored batch's
impressions are written before that, on the engine thread (`_finish_batch`), as one columnar
record. When a log writer falls behind (more than RELAY_SERVING_LOG_MAX_PENDING_ROWS rows not
yet out), new predict requests are refused with 503 `log_backpressure`, counted in /metrics,
until it catches up: load is shed in the open, and no answered request goes unlogged.
While a shadow is on (`serving.shadow`), a share of stable's answered requests is handed to the
canary slot after the answer: the mirror is never served and never logged as served.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from opentelemetry.trace import Span

from logstore.spool import RequestLogWriter
from model_store import ModelStore
from relay.errors import VersionNotFound
from relay.settings import Settings
from serving.batching import Batcher, BatchTiming
from serving.canary_lease import CanaryControl
from serving.exchange import Exchange, Served
from serving.feedback import FeedbackLog
from serving.loading import load_model
from serving.metrics import ServingMetrics, WorkerSnapshot
from serving.routing import (
    LOAD_TEST,
    SLOTS,
    STABLE,
    RoutingTable,
    check_slot,
    perturbed,
)
from serving.schema import PredictRequest, RequestRejected
from serving.shadow import SHADOW, ShadowMirror, shadow_setting
from serving.tracing import RequestTracer, traceparent_of
from serving.worker_state import worker_snapshot, worker_state

log = logging.getLogger("serving.worker")


def _rng() -> np.random.Generator:
    # A fresh generator per use: engine threads of two slots may shuffle at once, and a
    # Generator is not thread-safe. Only a `shuffled` ranking (fault injection) draws.
    return np.random.default_rng()


ADMIN = "admin"  # the slot value of admin requests' log rows: never a model's slot
RETIRE_AFTER_S = 0.5  # a model swapped out frees its engine this much later


class Worker(CanaryControl):
    """Slots, models and request bookkeeping of one serving process."""

    def __init__(
        self,
        settings: Settings,
        store: ModelStore,
        metrics: ServingMetrics,
        log_writer: RequestLogWriter | None,
        clock: Callable[[], float] = time.monotonic,
        tracer: RequestTracer | None = None,
        feedback_log: FeedbackLog | None = None,
        shadow_log: RequestLogWriter | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock  # what canary leases are measured on; tests pass their own
        self.store = store
        self.metrics = metrics
        self.log_writer = log_writer
        self.feedback_log = feedback_log
        self.log_writers = [
            *([log_writer] if log_writer is not None else []),
            *(feedback_log.writers if feedback_log is not None else ()),
        ]
        self.table: RoutingTable[Served] = RoutingTable()
        self.worker_id = f"{socket.gethostname()}-{secrets.token_hex(3)}"
        self.tracer = tracer or RequestTracer(settings, self.worker_id)
        self.draining = False
        self.binary_connections = 0
        self._ids = itertools.count(1)
        self._admin_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self.started_at = time.time()
        self.canary_removals: dict[str, int] = {}  # by CanaryRemoval reason
        self.backpressure_rejections = 0
        self.shadow = ShadowMirror(settings, shadow_log, clock)
        metrics.watch(self.snapshot)

    def start(self) -> None:
        """Start the canary-lease watchdog on the running event loop."""
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_leases())

    # -- requests ------------------------------------------------------------------------------
    def exchange(self, transport: str) -> Exchange:
        return Exchange(transport, time.time(), time.perf_counter())

    def next_request_id(self) -> str:
        return f"{self.worker_id}-{next(self._ids):x}"

    def submit(
        self,
        ex: Exchange,
        request: PredictRequest,
        done: Callable[[Exchange], None],
        pinned: str | None = None,
    ) -> None:
        """Route and queue a decoded request; `done(ex)` runs on the loop once it is answered.

        `pinned` (stable or canary, an admin's load test) skips routing: the slot's model answers
        whatever its weight, the row is logged as slot `loadtest`, and no impression is written.
        """
        ex.request_id = request.request_id or self.next_request_id()
        ex.user_id, ex.session_id, ex.input_bytes, ex.rows = (
            request.user_id,
            request.session_id,
            request.input_bytes,
            request.raw.shape[0],
        )
        table = self.table  # one read: this request sees one table, whatever changes meanwhile
        route = table.route(request.user_id) if pinned is None else self._pinned(table, pinned)
        if pinned is not None and route is None and not self.draining:
            ex.slot = LOAD_TEST
            ex.reject(RequestRejected("empty_slot", f"no model is loaded in {pinned}", 409))
            done(ex)
            return
        if route is None or self.draining:
            reason = "the worker is shutting down" if self.draining else "no stable model yet"
            ex.reject(RequestRejected("not_ready", reason, 503))
            done(ex)
            return
        behind = self.log_behind()
        if behind is not None:
            self.backpressure_rejections += 1
            ex.reject(RequestRejected("log_backpressure", behind, 503))
            done(ex)
            return
        slot, served = route
        ex.slot = slot if pinned is None else LOAD_TEST
        ex.version, ex.lineage_id = served.model.version, served.model.lineage_id
        injection = table.injection(slot)
        ex.injection = injection if injection.holds and injection.applies(ex.request_id) else None
        ex.ranking = table.ranking(slot)
        ex.t_enqueued = time.perf_counter()
        if pinned is None and slot == STABLE:  # a load test's pinned request is never mirrored
            done = self.shadow.after_answer(done, ex.request_id, request.raw, table)
        served.batcher.submit(request.raw, lambda s, b, e: self._scored(ex, done, s, b, e), ex)

    @staticmethod
    def _pinned(table: RoutingTable[Served], slot: str) -> tuple[str, Served] | None:
        served = table.model(slot)
        return None if served is None else (slot, served)

    def log_behind(self) -> str | None:
        """Why the log path cannot take another request now (a writer is behind), or None."""
        limit = self.settings.serving_log_max_pending_rows
        for writer in self.log_writers:
            if writer.pending > limit:
                return (
                    f"the {writer.spool.table.name} log has {writer.pending} rows not yet "
                    f"written out, over RELAY_SERVING_LOG_MAX_PENDING_ROWS={limit}: retry shortly"
                )
        return None

    def _finish_batch(
        self, exchanges: list[Exchange], sizes: list[int], raw: np.ndarray, scores: np.ndarray
    ) -> np.ndarray:
        """On the engine thread: each slot's ranking applied, the batch's impressions written."""
        served = scores
        shadowed = [ex.transport == SHADOW for ex in exchanges]
        if any(ex.ranking != "model" for ex in exchanges):
            served, at = scores.copy(), 0
            for ex, n in zip(exchanges, sizes, strict=True):
                served[at : at + n] = perturbed(scores[at : at + n], ex.ranking, _rng())
                at += n
        if self.feedback_log is not None and not all(shadowed):
            if any(shadowed):  # a mirrored answer was shown to no one: no impressions
                rows = np.repeat([not s for s in shadowed], sizes)
                users = [ex for ex, s in zip(exchanges, shadowed, strict=True) if not s]
                kept = [n for n, s in zip(sizes, shadowed, strict=True) if not s]
                self.feedback_log.write_impressions(users, kept, raw[rows], served[rows])
            else:
                self.feedback_log.write_impressions(exchanges, sizes, raw, served)
        return served

    def _scored(
        self,
        ex: Exchange,
        done: Callable[[Exchange], None],
        scores: np.ndarray | None,
        batch: BatchTiming | None,
        error: RequestRejected | None,
    ) -> None:
        if error is not None:
            ex.reject(error)
        elif scores is None or not np.isfinite(scores).all():
            ex.reject(
                RequestRejected("non_finite_score", f"model {ex.version} produced NaN/inf", 500)
            )
            ex.batch = batch
        else:
            ex.scores, ex.batch = scores, batch
        if ex.injection is not None:

            def release(took_s: float) -> None:
                # What the delay really took, timer lateness included: the time is the
                # injection's, and booking it elsewhere would plant a second cause.
                ex.injected_s = took_s
                done(ex)

            ex.injection.delay(ex.t0, release)
        else:
            done(ex)

    def record(self, ex: Exchange) -> None:
        """Close the exchange: metrics and its inference_logs row, with the time split.

        Called before the answer is sent: once it returns, the row survives this process.
        """
        now = time.perf_counter()
        latency = now - ex.t0
        batch = ex.batch
        if batch is not None:
            queue = max(batch.started - ex.t_enqueued, 0.0)
            preprocess = (ex.t_enqueued - ex.t0) + batch.preprocess_s
            compute = batch.compute_s
            batch_size = batch.requests
        else:
            queue = compute = 0.0
            preprocess = (ex.t_enqueued or now) - ex.t0
            batch_size = 0
        if ex.injection is not None:  # postprocess, the remainder, takes it without being told
            stage = ex.injection.stage
            queue += ex.injected_s if stage == "queue" else 0.0
            preprocess += ex.injected_s if stage == "preprocess" else 0.0
            compute += ex.injected_s if stage == "compute" else 0.0
        postprocess = max(latency - queue - preprocess - compute, 0.0)
        self.metrics.observe_request(
            ex.transport, ex.slot, ex.version, ex.status, ex.error_code, latency
        )
        if ex.status == 200 and ex.transport != ADMIN:
            self.metrics.observe_stages(ex.slot, queue, preprocess, compute, postprocess)
        ex.request_id = ex.request_id or self.next_request_id()
        if ex.span is None:  # an admin call's span is open around it already
            ex.span = self._request_span(ex, queue, preprocess, compute, postprocess, batch_size)
        ex.traceparent = traceparent_of(ex.span)
        if self.log_writer is not None:
            self.log_writer.append(
                (
                    ex.ts,
                    ex.request_id,
                    ex.user_id,
                    ex.session_id,
                    ex.slot,
                    ex.version,
                    ex.lineage_id,
                    latency * 1000,
                    queue * 1000,
                    preprocess * 1000,
                    compute * 1000,
                    postprocess * 1000,
                    batch_size,
                    ex.input_bytes,
                    ex.status,
                    ex.error_code,
                    ex.rows,
                    ex.traceparent[3:35],  # the trace id
                )
            )

    def _request_span(
        self,
        ex: Exchange,
        queue: float,
        preprocess: float,
        compute: float,
        postprocess: float,
        batch_size: int,
    ) -> Span:
        """The request's ended span (recorded or not), from the times its log row holds."""
        return self.tracer.request_span(
            f"{ex.transport} predict",
            ex.parent,
            int(ex.ts * 1e9),
            {
                "queue": queue,
                "preprocess": preprocess,
                "compute": compute,
                "postprocess": postprocess,
            },
            lambda: {
                "relay.request_id": ex.request_id,
                "relay.transport": ex.transport,
                "relay.slot": ex.slot,
                "relay.model_version": ex.version,
                "relay.lineage_id": ex.lineage_id,
                "relay.batch_size": batch_size,
                "relay.rows": ex.rows,
                "relay.input_size_bytes": ex.input_bytes,
                "relay.status": ex.status,
                "relay.error_code": ex.error_code,
            },
            ex.error_code,
        )

    # -- admin ---------------------------------------------------------------------------------
    async def load(self, slot: str, ref: str) -> dict[str, Any]:
        """Load and warm `ref` (version or alias) into `slot`, then switch to it in one swap."""
        check_slot(slot)
        if not isinstance(ref, str) or not ref:
            raise RequestRejected("missing_field", "'version' must name a version or alias")
        async with self._admin_lock:
            try:
                manifest = await asyncio.to_thread(self.store.resolve, ref)
            except (VersionNotFound, ValueError) as exc:
                raise RequestRejected("unknown_version", str(exc), 404) from None
            current = self.table.model(slot)
            if current is not None and current.version == manifest.version:
                return {"changed": False, **self.state()}  # idempotent: a retried load is safe
            s = self.settings
            held = len(self.table.models())
            if current is None and held >= s.serving_max_models:
                raise RequestRejected(
                    "no_room",
                    f"this worker holds {held} engines, its limit (RELAY_SERVING_MAX_MODELS="
                    f"{s.serving_max_models}): no room to load {ref} into {slot}",
                    507,
                )
            try:
                with self.tracer.inner_span(
                    "load and warm", {"relay.slot": slot, "relay.model_version": manifest.version}
                ):
                    model = await asyncio.to_thread(
                        load_model,
                        self.store,
                        manifest,
                        ref,
                        s.resolved_serving_cache_dir,
                        threads=s.serving_engine_threads,
                        max_batch_rows=s.serving_max_batch_rows,
                    )
            except Exception as exc:  # store, runtime or warm-up: this version cannot serve here
                log.exception("loading %s into %s failed", ref, slot)
                raise RequestRejected("load_failed", f"could not load {ref}: {exc}", 422) from None
            version = model.version
            batcher = Batcher(
                model,
                max_rows=s.serving_max_batch_rows,
                max_delay_s=s.serving_max_batch_delay_ms / 1000,
                on_batch=lambda t: self.metrics.observe_batch(version, t),
                finish=self._finish_batch,
            )
            self._swap(self.table.with_loaded(slot, Served(model, batcher)))
            log.info(
                "loaded %s (lineage %s, engine %s, warm-up %.1f ms) into %s",
                version,
                model.lineage_id,
                model.engine.name,
                model.warmup_ms,
                slot,
            )
            return {"changed": True, **self.state()}

    async def promote(self) -> dict[str, Any]:
        async with self._admin_lock:
            self._swap(self.table.promoted())
            log.info("promoted %s to stable", self.table.stable and self.table.stable.version)
            return self.state()

    async def set_latency(self, slot: str, ms: float, **knobs: Any) -> dict[str, Any]:
        """An injection on `slot` (RoutingTable.with_latency checks it and names its knobs)."""
        async with self._admin_lock:
            self._swap(self.table.with_latency(slot, ms, **knobs))
            log.info("injected %s on %s", self.table.injection(slot), slot)
            return self.state()

    async def set_shadow(self, body: dict[str, Any]) -> dict[str, Any]:
        """Mirror a share of stable's answers to the canary slot under a lease, or stop (share 0)."""
        async with self._admin_lock:
            setting = shadow_setting(body, self.settings, self.clock())
            if setting is not None and self.table.canary is None:
                raise RequestRejected("no_canary", "no canary is loaded: nothing to mirror to", 409)
            was_on = self.shadow.active() is not None
            self.shadow.set(setting)
            if setting is None:
                log.info("shadow off")
            elif not was_on:
                log.info(
                    "shadow on: %g of stable's requests mirrored to %s, at most %d in flight, "
                    "leased for %g s",
                    setting.share,
                    self.table.canary and self.table.canary.version,
                    setting.max_queue,
                    setting.length_s,
                )
            return self.state()

    async def set_ranking(self, slot: str, ranking: str) -> dict[str, Any]:
        async with self._admin_lock:
            self._swap(self.table.with_ranking(slot, ranking))
            log.info("answers of %s ranked %s", slot, ranking)
            return self.state()

    def _swap(self, table: RoutingTable[Served]) -> None:
        leaving = self.table.models() - table.models()
        self.table = table
        for slot in SLOTS:  # an engine-mode injection runs inside the slot's batches
            if (served := getattr(table, slot)) is not None:
                served.batcher.fault = table.injection(slot).engine_fault()
        for served in leaving:  # drain what they already queued, then free their engines
            task = asyncio.get_running_loop().create_task(self._retire(served))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, served: Served) -> None:
        # Freeing an engine joins its thread and releases its session on this loop: a few ms of
        # CPU. Done a moment after the swap, so that the admin call's answer never waits on it
        # and, where many workers share a host, it does not compete with the same rollback
        # still landing on the others (32 workers on 2 cores: p50 71 -> see docs/serving.md).
        await asyncio.sleep(RETIRE_AFTER_S)
        await served.batcher.close()

    # -- state ---------------------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "shutting down"
        if self.table.stable is None:
            return False, "no stable model is loaded"
        if self.log_writer is not None and self.log_writer.spool.over_cap:
            return False, "inference-log spool is over its cap: ingest it"
        if self.log_writer is not None and self.log_writer.wal_error is not None:
            return (
                False,
                f"cannot write log rows ahead, keeping them in memory: {self.log_writer.wal_error}",
            )
        problem = self.feedback_log.problem() if self.feedback_log is not None else None
        if problem is not None:
            return False, problem
        return True, "ready"

    def state(self) -> dict[str, Any]:
        """What /admin/state answers: slots, weight, lease, injections, batching."""
        return worker_state(self)

    def snapshot(self) -> WorkerSnapshot:
        """What /metrics reads of the worker at each scrape."""
        return worker_snapshot(self)

    async def close(self) -> None:
        """Stop taking requests, finish queued ones, free engines, write every log row."""
        self.draining = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        await asyncio.gather(*(m.batcher.close() for m in self.table.models()), *self._retiring)
        if self.log_writer is not None:
            await asyncio.to_thread(self.log_writer.close)
        await asyncio.to_thread(self.tracer.close)
        if self.feedback_log is not None:
            await asyncio.to_thread(self.feedback_log.close)
        if self.shadow.pair_log is not None:
            await asyncio.to_thread(self.shadow.pair_log.close)

"""A worker's state as /admin/state shows it and as /metrics exports it, read in one pass."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from serving.exchange import Served
from serving.metrics import WorkerSnapshot
from serving.routing import SLOTS, RoutingTable

if TYPE_CHECKING:
    from serving.worker import Worker


def worker_state(worker: Worker) -> dict[str, Any]:
    """What /admin/state answers: slots, weight, lease, injections, batching."""
    t = worker.table
    ready, reason = worker.ready()
    return {
        "worker_id": worker.worker_id,
        "ready": ready,
        "reason": reason,
        "slots": {
            slot: (m.model.describe() if (m := t.model(slot)) is not None else None)
            for slot in SLOTS
        },
        "canary_weight": t.canary_weight,
        "canary_lease": _lease_state(worker, t),
        "canary_removals": dict(worker.canary_removals),  # by CanaryRemoval reason
        "inject_latency_ms": {slot: t.injection(slot).ms for slot in SLOTS},
        "inject_slowdown": {slot: t.injection(slot).factor for slot in SLOTS},
        "inject_stage": {slot: t.injection(slot).stage for slot in SLOTS},
        "inject_mode": {slot: t.injection(slot).mode for slot in SLOTS},
        "inject_share": {slot: t.injection(slot).share for slot in SLOTS},
        "shadow": worker.shadow.state(),
        "ranking": {slot: t.ranking(slot) for slot in SLOTS},
        "batching": {
            "max_rows": worker.settings.serving_max_batch_rows,
            "max_delay_ms": worker.settings.serving_max_batch_delay_ms,
        },
        "request_log": worker.log_writer is not None,
        "uptime_s": round(time.time() - worker.started_at, 3),
    }


def _lease_state(worker: Worker, t: RoutingTable[Served]) -> dict[str, Any]:
    lease = t.lease
    left = lease.seconds_left(worker.clock()) if lease is not None else None
    return {
        "lease_s": lease.length_s if lease is not None else None,
        # wall clock, for people: when the weight lapses (or lapsed) without a renewal
        "expires_at": (
            round(time.time() + (lease.until - worker.clock()), 3) if lease is not None else None
        ),
        "seconds_left": round(left, 3) if left is not None else None,
        "lapsed": bool(lease and lease.lapsed),
        "expirations": worker.lease_expirations,
    }


def worker_snapshot(worker: Worker) -> WorkerSnapshot:
    """What /metrics reads of the worker at each scrape."""
    t = worker.table
    writer = worker.log_writer
    backlog = writer.spool.backlog if writer else None
    stats = writer.stats if writer else None
    pairs = worker.shadow.pair_log
    spooled = [*worker.log_writers, *([pairs] if pairs is not None else [])]
    return WorkerSnapshot(
        ready=worker.ready()[0],
        queue_depth=sum(m.batcher.depth for m in t.models()),
        queue_depth_by_slot={
            slot: m.batcher.depth for slot in SLOTS if (m := t.model(slot)) is not None
        },
        canary_weight=t.canary_weight,
        canary_lease_seconds_left=t.lease.seconds_left(worker.clock()) if t.lease else 0.0,
        canary_lease_expirations=worker.lease_expirations,
        injected_latency_ms={slot: t.injection(slot).ms for slot in SLOTS},
        injected_slowdown={slot: t.injection(slot).factor for slot in SLOTS},
        models=[
            {
                "slot": slot,
                "version": m.version,
                "lineage_id": m.model.lineage_id,
                "engine": m.model.engine.name,
            }
            for slot in SLOTS
            if (m := t.model(slot)) is not None
        ],
        binary_connections=worker.binary_connections,
        log_buffered_rows=writer.buffered if writer else 0,
        log_rows={
            "clickhouse": stats.rows_inserted if stats else 0,
            "spool": stats.rows_spooled if stats else 0,
        },
        spool_segments=backlog.segments if backlog else 0,
        spool_bytes=backlog.bytes if backlog else 0,
        spool_cap_bytes=writer.spool.max_bytes if writer else 0,
        spool_over_cap=bool(writer and writer.spool.over_cap),
        spool_over_cap_by_table={w.spool.table.name: w.spool.over_cap for w in spooled},
        log_wal_ok=not (writer and writer.wal_error),
        log_wal_failures=stats.wal_failures if stats else 0,
        log_pending_rows={w.spool.table.name: w.pending for w in worker.log_writers},
        log_pending_limit=worker.settings.serving_log_max_pending_rows,
        log_backpressure_rejections=worker.backpressure_rejections,
        log_written_rows={
            w.spool.table.name: w.stats.rows_inserted + w.stats.rows_spooled
            for w in worker.log_writers
        },
        log_segments={
            (w.spool.table.name, by): n
            for w in worker.log_writers
            for by, n in (
                ("copy", w.stats.segments_copied),
                ("segmenter", w.stats.segments_by_segmenter),
                ("writer", w.stats.segments_by_writer),
            )
        },
        shadow={
            "mirrored": worker.shadow.counts.mirrored,
            "dropped": worker.shadow.counts.dropped,
            "errors": worker.shadow.counts.errors,
        },
        trace_spans={
            "recorded": worker.tracer.counts.recorded,
            "exported": worker.tracer.counts.exported,
            "dropped": worker.tracer.counts.dropped,
        },
    )

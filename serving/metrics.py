"""Prometheus metrics of one worker, on a registry of its own (never the process-global one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serving.batching import BatchTiming

# Fine below the 300 ms SLO, where a canary gate needs resolution.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
    10.0,
)


@dataclass
class WorkerSnapshot:
    """State read at scrape time."""

    ready: bool
    queue_depth: int
    queue_depth_by_slot: dict[str, int]  # requests waiting in each slot's batcher
    canary_weight: int
    canary_lease_seconds_left: float  # 0 without a lease
    canary_lease_expirations: int
    injected_latency_ms: dict[str, float]
    injected_slowdown: dict[str, float]
    models: list[dict[str, str]]  # slot, version, lineage_id, engine
    binary_connections: int
    log_buffered_rows: int
    log_rows: dict[str, int]  # sink -> rows written
    spool_segments: int
    spool_bytes: int
    spool_cap_bytes: int
    spool_over_cap: bool
    log_wal_ok: bool
    log_wal_failures: int
    trace_spans: dict[str, int]  # recorded, exported, dropped
    log_pending_rows: dict[str, int] = field(default_factory=dict)  # table -> not yet out
    log_pending_limit: int = 0  # over it, predict requests are refused
    log_backpressure_rejections: int = 0
    log_written_rows: dict[str, int] = field(default_factory=dict)  # table -> rows out
    # (table, "copy" | "segmenter" | "writer") -> spool segments written there
    log_segments: dict[tuple[str, str], int] = field(default_factory=dict)
    spool_over_cap_by_table: dict[str, bool] = field(default_factory=dict)  # table -> over it
    shadow: dict[str, int] = field(default_factory=dict)  # mirrored, dropped, errors


class ServingMetrics:
    """Request, batch and state metrics; hot-path children are cached by label values."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "relay_requests",
            "Requests answered, by transport, slot, model version, status and error code.",
            ["transport", "slot", "version", "status", "error_code"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "relay_request_latency_seconds",
            "Time from request read to response ready, by slot and model version.",
            ["slot", "version"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._batch_requests = Histogram(
            "relay_batch_requests",
            "Requests sharing one engine call.",
            ["version"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=self.registry,
        )
        self._batch_rows = Histogram(
            "relay_batch_rows",
            "Candidate rows in one engine call.",
            ["version"],
            buckets=(1, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
            registry=self.registry,
        )
        self._engine_seconds = Histogram(
            "relay_engine_seconds",
            "Feature pipeline plus engine time of one batch.",
            ["version"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._stage_latency = Histogram(
            "relay_stage_latency_seconds",
            "Time a request spent in each stage (queue, preprocess, compute, postprocess), by "
            "slot: which stage a latency rise comes from.",
            ["slot", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._stage_children: dict[str, tuple[Callable[[float], None], ...]] = {}
        self._feedback = Counter(
            "relay_feedback_events",
            "Feedback events accepted (outcome 'accepted') or bodies refused (the error code).",
            ["outcome"],
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, str, int, str], Callable[[], None]] = {}
        self._latency_children: dict[tuple[str, str], Callable[[float], None]] = {}

    def observe_request(
        self, transport: str, slot: str, version: str, status: int, error_code: str, seconds: float
    ) -> None:
        key = (transport, slot, version, status, error_code)
        inc = self._request_children.get(key)
        if inc is None:
            inc = self._requests.labels(transport, slot, version, str(status), error_code).inc
            self._request_children[key] = inc
        inc()
        if status == 200:
            observe = self._latency_children.get((slot, version))
            if observe is None:
                observe = self._latency.labels(slot, version).observe
                self._latency_children[(slot, version)] = observe
            observe(seconds)

    def observe_stages(
        self, slot: str, queue: float, preprocess: float, compute: float, postprocess: float
    ) -> None:
        """One answered request's seconds in each stage."""
        observers = self._stage_children.get(slot)
        if observers is None:
            observers = tuple(
                self._stage_latency.labels(slot, stage).observe
                for stage in ("queue", "preprocess", "compute", "postprocess")
            )
            self._stage_children[slot] = observers
        for observe, seconds in zip(
            observers, (queue, preprocess, compute, postprocess), strict=True
        ):
            observe(seconds)

    def observe_feedback(self, outcome: str, events: int) -> None:
        self._feedback.labels(outcome).inc(events)

    def observe_batch(self, version: str, timing: BatchTiming) -> None:
        self._batch_requests.labels(version).observe(timing.requests)
        self._batch_rows.labels(version).observe(timing.rows)
        self._engine_seconds.labels(version).observe(timing.preprocess_s + timing.compute_s)

    def watch(self, snapshot: Callable[[], WorkerSnapshot]) -> None:
        """Export the worker's state, read from `snapshot` at every scrape."""
        self.registry.register(_StateCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, snapshot: Callable[[], WorkerSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield from _routing_metrics(s)
        yield from _log_metrics(s)
        yield from _shadow_and_trace_metrics(s)


def _routing_metrics(s: WorkerSnapshot) -> Iterator[Metric]:
    """Readiness, queues, the canary's weight and lease, injected faults, models, connections."""
    yield GaugeMetricFamily("relay_ready", "1 when the worker takes traffic.", value=int(s.ready))
    yield GaugeMetricFamily(
        "relay_queue_depth", "Requests waiting for an engine call.", value=s.queue_depth
    )
    by_slot = GaugeMetricFamily(
        "relay_batcher_queue_depth",
        "Requests waiting for an engine call, by slot: the signal to scale workers on.",
        labels=["slot"],
    )
    for slot, depth in s.queue_depth_by_slot.items():
        by_slot.add_metric([slot], depth)
    yield by_slot
    yield GaugeMetricFamily(
        "relay_canary_weight", "Percent of users routed to the canary.", value=s.canary_weight
    )
    yield GaugeMetricFamily(
        "relay_canary_lease_seconds_left",
        "Seconds until the canary's weight lapses to 0 unless the release renews it "
        "(0 without a lease).",
        value=s.canary_lease_seconds_left,
    )
    yield CounterMetricFamily(
        "relay_canary_lease_expirations",
        "Canary leases that ran out unrenewed, taking the canary's weight to 0.",
        value=s.canary_lease_expirations,
    )
    injected = GaugeMetricFamily(
        "relay_injected_latency_ms", "Latency added to each request, by slot.", labels=["slot"]
    )
    for slot, ms in s.injected_latency_ms.items():
        injected.add_metric([slot], ms)
    yield injected
    slowdown = GaugeMetricFamily(
        "relay_injected_slowdown",
        "Factor each request's latency is multiplied by, by slot (1 = none).",
        labels=["slot"],
    )
    for slot, factor in s.injected_slowdown.items():
        slowdown.add_metric([slot], factor)
    yield slowdown
    info = GaugeMetricFamily(
        "relay_model_info",
        "The model in each slot (value 1).",
        labels=["slot", "version", "lineage_id", "engine"],
    )
    for m in s.models:
        info.add_metric([m["slot"], m["version"], m["lineage_id"], m["engine"]], 1)
    yield info
    yield GaugeMetricFamily(
        "relay_binary_connections",
        "Open binary-protocol connections.",
        value=s.binary_connections,
    )


def _segment_metrics(s: WorkerSnapshot) -> Iterator[Metric]:
    """Spool segments written: copied as records, by the segmenter process, or by the writer."""
    segments = CounterMetricFamily(
        "relay_log_segments",
        "Spool segments written, by table and by how: `copy` (the write-ahead file's records "
        "copied as they are, RELAY_SERVING_LOG_SEGMENTER=copy), `segmenter` (encoded by the "
        "segmenter process) or `writer` (encoded on the log writer's own thread: "
        "RELAY_SERVING_LOG_SEGMENTER=thread, rows with no write-ahead file, a failed segmenter, "
        "or one that fell behind).",
        labels=["table", "by"],
    )
    for (table, by), n in s.log_segments.items():
        segments.add_metric([table, by], n)
    yield segments


def _log_metrics(s: WorkerSnapshot) -> Iterator[Metric]:
    """The durable log path: rows buffered, written ahead, spooled and written out; backpressure."""
    yield GaugeMetricFamily(
        "relay_log_buffered_rows",
        "Log rows not yet in a segment or ClickHouse (written ahead, or in memory only).",
        value=s.log_buffered_rows,
    )
    rows = CounterMetricFamily(
        "relay_log_rows", "Log rows written, by where they went.", labels=["sink"]
    )
    for sink, n in s.log_rows.items():
        rows.add_metric([sink], n)
    yield rows
    yield GaugeMetricFamily(
        "relay_spool_segments", "Spool segments waiting for ingestion.", value=s.spool_segments
    )
    yield GaugeMetricFamily(
        "relay_spool_bytes", "Bytes of spool waiting for ingestion.", value=s.spool_bytes
    )
    yield GaugeMetricFamily(
        "relay_spool_cap_bytes",
        "Spool size above which the worker is not ready.",
        value=s.spool_cap_bytes,
    )
    yield GaugeMetricFamily(
        "relay_spool_over_cap",
        "1 while the request log's (inference_logs) spool is over its cap; every table's spool: "
        "relay_spool_table_over_cap.",
        value=int(s.spool_over_cap),
    )
    by_table = GaugeMetricFamily(
        "relay_spool_table_over_cap",
        "1 while that table's spool is over its cap: the worker is then not ready (shadow "
        "pairs: mirroring stops instead).",
        labels=["table"],
    )
    for table, over in s.spool_over_cap_by_table.items():
        by_table.add_metric([table], int(over))
    yield by_table
    yield GaugeMetricFamily(
        "relay_log_wal_ok",
        "1 while log rows are written ahead before answers leave; 0: kept in memory only.",
        value=int(s.log_wal_ok),
    )
    yield CounterMetricFamily(
        "relay_log_wal_failures",
        "Log rows the write-ahead file could not take (kept in memory instead).",
        value=s.log_wal_failures,
    )
    pending = GaugeMetricFamily(
        "relay_log_pending_rows",
        "Log rows written ahead but not yet in a segment or ClickHouse, by table.",
        labels=["table"],
    )
    for table, n in s.log_pending_rows.items():
        pending.add_metric([table], n)
    yield pending
    written = CounterMetricFamily(
        "relay_log_written_rows",
        "Log rows written out (a spool segment or a ClickHouse insert), by table.",
        labels=["table"],
    )
    for table, n in s.log_written_rows.items():
        written.add_metric([table], n)
    yield written
    yield from _segment_metrics(s)
    yield GaugeMetricFamily(
        "relay_log_pending_limit",
        "Pending log rows of one table above which predict requests are refused.",
        value=s.log_pending_limit,
    )
    yield CounterMetricFamily(
        "relay_log_backpressure_rejections",
        "Predict requests refused (503 log_backpressure) because a log writer was behind.",
        value=s.log_backpressure_rejections,
    )


def _shadow_and_trace_metrics(s: WorkerSnapshot) -> Iterator[Metric]:
    """Mirrored requests of the shadow stage, and trace spans recorded and exported."""
    for name, text in (
        ("mirrored", "Stable's answered requests also scored by the canary slot in shadow."),
        ("dropped", "Requests chosen for the shadow but dropped: the mirror queue was full."),
        ("errors", "Mirrored requests the canary slot answered with an error."),
    ):
        yield CounterMetricFamily(f"relay_shadow_{name}", text, value=s.shadow.get(name, 0))
    spans = CounterMetricFamily(
        "relay_trace_spans",
        "Request and admin spans recorded (sampled) and exported over OTLP.",
        labels=["outcome"],
    )
    for outcome in ("recorded", "exported"):
        spans.add_metric([outcome], s.trace_spans.get(outcome, 0))
    yield spans
    yield CounterMetricFamily(
        "relay_trace_spans_dropped",
        "Spans dropped: the export queue was full or the collector did not take them.",
        value=s.trace_spans.get("dropped", 0),
    )

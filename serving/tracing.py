"""OpenTelemetry in the serving worker: a span per request, its stages as child spans.

Every request gets a trace id, whether or not its trace is recorded: the caller's, from a W3C
`traceparent` (HTTP header, or the binary PREDICT header's `traceparent` field), or a new one.
The id goes into the request's inference_logs row and back to the caller (the answer's
`traceparent`), so a slow row leads to its trace and a trace to its row. A malformed
`traceparent` is ignored: the request starts a new trace and is served as usual.

Which traces are recorded: a caller's sampled traceparent always is (parent-based sampling);
a new trace with probability RELAY_OTEL_SAMPLE_RATIO. Unrecorded requests cost one span start
(~8 µs: the SDK draws the id and asks the sampler), recorded ones ~90 µs more, so the default
ratio keeps tracing within a few percent of the worker's throughput (bench.serving measures it).

The spans are built when the request is recorded, from the times already measured for its log
row (start at arrival, the stages' durations laid end to end under it), so the request path
carries no open span and both transports share one code path. Export is OTLP/HTTP, only when
RELAY_OTEL_EXPORTER_ENDPOINT is set, from a background thread; its queue is bounded
(RELAY_OTEL_MAX_QUEUE_SPANS) and what does not fit, or fails to export, is dropped and counted
(`relay_trace_spans_dropped`): an unreachable collector never slows serving or grows memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from relay.settings import Settings

log = logging.getLogger("serving.tracing")

TRACEPARENT = "traceparent"
STAGE_SPANS = ("preprocess", "queue", "compute", "postprocess")  # the order laid end to end
_PROPAGATOR = TraceContextTextMapPropagator()


def parent_context(traceparent: object) -> Context | None:
    """The caller's span context from a `traceparent` value; None if absent or malformed."""
    if not isinstance(traceparent, str) or not traceparent:
        return None
    context = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    # extract() returns an empty context for anything it cannot parse: a new trace then
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def traceparent_of(span: Span) -> str:
    """The W3C `traceparent` naming `span`, for answers and outgoing calls; "" for no span."""
    c = span.get_span_context()
    if not c.is_valid:
        return ""
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


@dataclass
class SpanCounts:
    """Spans recorded, exported and dropped (queue full or export failed) since start."""

    recorded: int = 0
    exported: int = 0
    dropped: int = 0


class CountingExporter(SpanExporter):
    """Wraps an exporter and counts what it delivered and what it could not (dropped)."""

    def __init__(self, inner: SpanExporter, counts: SpanCounts) -> None:
        self.inner = inner
        self.counts = counts
        self.handed = 0  # spans given to export(), delivered or not
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self.handed += len(spans)
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter bug must not kill the export thread
            log.exception("span export raised")
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.counts.exported += len(spans)
            else:
                self.counts.dropped += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class BoundedSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor, counting the spans its full queue pushes out as dropped.

    The queue holds what was recorded and not yet handed to the exporter; when it is full the
    SDK drops the oldest span to make room, which is what is counted here.
    """

    def __init__(self, exporter: CountingExporter, max_queue: int, counts: SpanCounts) -> None:
        super().__init__(
            exporter,
            max_queue_size=max_queue,
            max_export_batch_size=min(512, max_queue),
            schedule_delay_millis=1000,
        )
        self._counting = exporter
        self._max_queue = max_queue
        self._counts = counts
        self._lock = threading.Lock()
        self._queue_drops = 0

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._lock:
            self._counts.recorded += 1
            queued = self._counts.recorded - 1 - self._counting.handed - self._queue_drops
            if queued >= self._max_queue:
                self._queue_drops += 1
                self._counts.dropped += 1
        super().on_end(span)


class RequestTracer:
    """Starts the worker's spans; exports them only when an endpoint is set (or `exporter` given)."""

    def __init__(
        self, settings: Settings, worker_id: str, exporter: SpanExporter | None = None
    ) -> None:
        self.counts = SpanCounts()
        self.enabled = settings.otel_tracing  # off: no ids, no spans (to measure the cost)
        self._provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(settings.otel_sample_ratio)),
            resource=Resource.create(
                {"service.name": "relay-serving", "service.instance.id": worker_id}
            ),
        )
        if exporter is None and settings.otel_exporter_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(
                endpoint=settings.otel_exporter_endpoint, timeout=settings.otel_export_timeout_s
            )
        self.exporting = exporter is not None
        if exporter is not None:
            self._provider.add_span_processor(
                BoundedSpanProcessor(
                    CountingExporter(exporter, self.counts),
                    settings.otel_max_queue_spans,
                    self.counts,
                )
            )
        self.tracer = self._provider.get_tracer("relay.serving")

    def request_span(
        self,
        name: str,
        parent: Context | None,
        start_ns: int,
        stages_s: Mapping[str, float],
        attributes: Callable[[], Mapping[str, Any]],
        error: str = "",
    ) -> Span:
        """The ended span of one request, with a child span per stage when it is recorded.

        `attributes` is called only for a recorded span: most requests' are not.
        """
        if not self.enabled:
            return INVALID_SPAN
        span = self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, start_time=start_ns
        )
        end_ns = start_ns + int(sum(stages_s.values()) * 1e9)
        if span.is_recording():
            span.set_attributes(attributes())
            if error:
                span.set_status(Status(StatusCode.ERROR, error))
            inside = trace.set_span_in_context(span)
            at = start_ns
            for stage in STAGE_SPANS:
                until = at + int(stages_s.get(stage, 0.0) * 1e9)
                child = self.tracer.start_span(stage, context=inside, start_time=at)
                child.end(end_time=until)
                at = until
        span.end(end_time=end_ns)
        return span

    @contextmanager
    def admin_span(
        self, name: str, parent: Context | None, attributes: Mapping[str, Any]
    ) -> Iterator[Span]:
        """A span around an admin operation (load, weight ...), in the caller's trace if given."""
        with self.tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            yield span

    @contextmanager
    def inner_span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """A child of the current span (e.g. a load's warm-up), in the current context."""
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span

    def close(self) -> None:
        """Export what is queued (bounded by the export timeout), then stop."""
        self._provider.shutdown()

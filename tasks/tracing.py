"""One trace per release's canary: its steps, every admin call to every worker, and what each
worker did for it (load and warm-up) appear under the same trace id.

The trace id is derived from the release id, so every canary task (deploy, weights, each
analysis window, promotion, the rollback hook) joins the same trace without the flow passing
a context from task to task (Prefect runs each task in its own context, some in other threads).
Each task's span is the child of a fixed parent span id, also derived from the release id; the
fleet client sends the current span as W3C `traceparent` on every admin call, and the worker's
admin spans (`serving.tracing`) continue it. Release traces are always sampled: there are a
handful of spans per canary step. They are exported over OTLP/HTTP when
RELAY_OTEL_EXPORTER_ENDPOINT is set, like the workers', and not at all otherwise.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from relay.settings import Settings
from relay.types import Release

T = TypeVar("T")


def release_context(release_id: str) -> SpanContext:
    """The (remote, sampled) parent every span of this release's canary hangs under."""
    digest = hashlib.sha256(f"relay-release:{release_id}".encode()).digest()
    return SpanContext(
        trace_id=int.from_bytes(digest[:16], "big") or 1,
        span_id=int.from_bytes(digest[16:24], "big") or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


@lru_cache(maxsize=4)
def _provider(endpoint: str, timeout_s: float, max_queue: int) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "relay-release"}))
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s), max_queue_size=max_queue
            )
        )
    return provider


def release_tracer(settings: Settings, exporter: SpanExporter | None = None) -> trace.Tracer:
    """The release side's tracer (per process); `exporter` replaces OTLP and gets each span as
    it ends (tests)."""
    if exporter is not None:
        provider = TracerProvider(resource=Resource.create({"service.name": "relay-release"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider.get_tracer("relay.release")
    return _provider(
        settings.otel_exporter_endpoint,
        settings.otel_export_timeout_s,
        settings.otel_max_queue_spans,
    ).get_tracer("relay.release")


@contextmanager
def release_span(
    tracer: trace.Tracer, release: Release, name: str, **attributes: Any
) -> Iterator[trace.Span]:
    """A span of `release`'s canary trace, current for the block (admin calls carry it)."""
    parent = trace.set_span_in_context(NonRecordingSpan(release_context(release.release_id)))
    with tracer.start_as_current_span(
        name,
        context=parent,
        attributes={
            "relay.release_id": release.release_id,
            "relay.model_version": release.version,
            "relay.lineage_id": release.lineage_id,
            **attributes,
        },
    ) as span:
        yield span


def traced(name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Run a `(settings, release, ...)` task body inside a span of the release's canary trace."""

    def wrap(body: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(body)
        def inner(settings: Settings, release: Release, *args: Any, **kwargs: Any) -> T:
            with release_span(release_tracer(settings), release, name):
                return body(settings, release, *args, **kwargs)

        return inner

    return wrap

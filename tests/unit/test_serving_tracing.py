"""The worker's spans: a caller's traceparent is joined, stages become child spans, a malformed
one starts a new trace, nothing is sent without an exporter, and a stuck exporter drops spans
with a count instead of holding them."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from relay.settings import Settings
from serving.tracing import RequestTracer, parent_context, traceparent_of

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STAGES = {"queue": 0.002, "preprocess": 0.001, "compute": 0.004, "postprocess": 0.0005}


def traced(tracer: RequestTracer, traceparent: object = None) -> str:
    span = tracer.request_span(
        "http predict",
        parent_context(traceparent),
        time.time_ns(),
        STAGES,
        lambda: {"relay.slot": "canary", "relay.input_size_bytes": 812, "relay.rows": 20},
    )
    return traceparent_of(span)


def test_a_callers_traceparent_is_joined_and_each_stage_is_a_child_span() -> None:
    exporter = InMemorySpanExporter()
    tracer = RequestTracer(Settings(otel_sample_ratio=0.0), "w1", exporter)
    answer = traced(tracer, CALLER)
    tracer.close()  # exports what is queued
    assert answer.startswith("00-0af7651916cd43dd8448eb211c80319c-")  # same trace, our span
    assert answer.endswith("-01") and answer != CALLER
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"http predict", "queue", "preprocess", "compute", "postprocess"}
    request = spans["http predict"]
    assert request.parent is not None and request.parent.span_id == 0xB7AD6B7169203331
    assert request.attributes == {
        "relay.slot": "canary",
        "relay.input_size_bytes": 812,
        "relay.rows": 20,
    }
    for stage, seconds in STAGES.items():
        child = spans[stage]
        assert child.parent is not None and child.parent.span_id == request.context.span_id
        assert child.end_time is not None and child.start_time is not None
        assert child.end_time - child.start_time == pytest.approx(seconds * 1e9, abs=2)
    assert request.end_time - request.start_time == pytest.approx(sum(STAGES.values()) * 1e9, abs=4)  # type: ignore[operator]


@pytest.mark.parametrize(
    "bad",
    [
        "garbage",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71-01",  # short span id
        "zz-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        12,
        "",
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace(bad: object) -> None:
    assert parent_context(bad) is None
    exporter = InMemorySpanExporter()
    tracer = RequestTracer(Settings(otel_sample_ratio=1.0), "w1", exporter)
    answer = traced(tracer, bad)
    tracer.close()
    trace_id = answer.split("-")[1]
    assert len(trace_id) == 32 and int(trace_id, 16) != 0
    assert "0af7651916cd43dd8448eb211c80319c" not in answer
    (request,) = [s for s in exporter.get_finished_spans() if s.name == "http predict"]
    assert request.parent is None and f"{request.context.trace_id:032x}" == trace_id


def test_unsampled_requests_still_get_a_trace_id_but_no_span() -> None:
    exporter = InMemorySpanExporter()
    tracer = RequestTracer(Settings(otel_sample_ratio=0.0), "w1", exporter)
    answers = {traced(tracer) for _ in range(50)}
    tracer.close()
    assert len(answers) == 50 and not any(int(a[-2:], 16) & 1 for a in answers)  # unsampled
    assert exporter.get_finished_spans() == () and tracer.counts.recorded == 0


def test_without_an_endpoint_nothing_is_exported_and_nothing_fails() -> None:
    tracer = RequestTracer(Settings(otel_sample_ratio=1.0), "w1")
    assert not tracer.exporting
    assert traced(tracer, CALLER).split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    tracer.close()
    assert tracer.counts.recorded == tracer.counts.exported == tracer.counts.dropped == 0


class StuckExporter(SpanExporter):
    """A collector that never answers until released, then refuses."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(10)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_a_stuck_collector_costs_spans_not_memory_and_every_loss_is_counted() -> None:
    exporter = StuckExporter()
    tracer = RequestTracer(Settings(otel_sample_ratio=1.0, otel_max_queue_spans=20), "w1", exporter)
    for _ in range(40):  # 5 spans each: 200 spans against a queue of 20
        traced(tracer)
    counts = tracer.counts
    assert counts.recorded == 200
    assert counts.dropped >= 200 - 20 - 20  # at most a queue and one batch in flight are held
    exporter.release.set()
    tracer.close()
    assert counts.exported == 0 and counts.dropped == 200  # the held ones failed to export


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan")])
def test_a_sampling_ratio_outside_0_1_is_refused_naming_the_setting(ratio: float) -> None:
    with pytest.raises(ValidationError, match="RELAY_OTEL_SAMPLE_RATIO"):
        Settings(otel_sample_ratio=ratio)


def test_tracing_off_gives_no_trace_ids_and_no_spans() -> None:
    exporter = InMemorySpanExporter()
    tracer = RequestTracer(Settings(otel_tracing=False, otel_sample_ratio=1.0), "w1", exporter)
    assert traced(tracer, CALLER) == ""
    tracer.close()
    assert exporter.get_finished_spans() == ()

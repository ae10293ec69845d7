"""A release's canary is one trace: every step's span hangs under the release's own parent, and
the fleet client carries the current span to every worker as `traceparent`."""

from __future__ import annotations

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relay.settings import Settings
from relay.types import Release
from serving.fleet import FleetClient
from tasks.tracing import release_context, release_span, release_tracer

RELEASE = Release("rel-42", "v42", "lineage-42")


def test_every_step_of_a_release_and_its_admin_calls_share_one_trace() -> None:
    seen: list[httpx.Request] = []

    def worker(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ready": True, "slots": {}})

    exporter = InMemorySpanExporter()
    tracer = release_tracer(Settings(), exporter)
    urls = ["http://w1:8700", "http://w2:8700"]
    with FleetClient(urls, "token", transport=httpx.MockTransport(worker)) as fleet:
        with release_span(tracer, RELEASE, "set canary weight", weight=5) as weight_span:
            fleet.state()
        with release_span(tracer, RELEASE, "canary step"):
            fleet.state()
        fleet.state()  # outside any span: no traceparent
    expected = release_context(RELEASE.release_id)
    sent = [r.headers.get("traceparent") for r in seen]
    assert len(sent) == 6 and sent[4] is None and sent[5] is None
    trace_ids = {tp.split("-")[1] for tp in sent[:4] if tp}
    assert trace_ids == {f"{expected.trace_id:032x}"}
    weight_id = weight_span.get_span_context().span_id
    assert sent[0] == sent[1] == f"00-{expected.trace_id:032x}-{weight_id:016x}-01"
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["set canary weight", "canary step"]
    for span in spans:
        assert span.parent is not None and span.parent.span_id == expected.span_id
        assert span.context.trace_id == expected.trace_id
        assert span.attributes is not None and span.attributes["relay.release_id"] == "rel-42"


def test_release_trace_ids_are_stable_and_distinct_per_release() -> None:
    assert release_context("rel-1") == release_context("rel-1")
    assert release_context("rel-1").trace_id != release_context("rel-2").trace_id
    assert release_context("rel-1").trace_flags.sampled

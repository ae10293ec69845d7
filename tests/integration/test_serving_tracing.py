"""Traces from a real worker: a caller's traceparent is in the request's log row and in the span a
real OTLP/HTTP receiver on loopback gets (protobuf, as a collector would), over both transports;
a malformed traceparent is served under a new trace; an unreachable collector costs spans, which
are counted, and never answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from logstore.spool import ingest_spool
from relay_testing.waiting import poll_until
from serving.client import BinaryClient, BinaryRequest, BinaryResult, items_matrix
from serving.process import WorkerProcess, start_worker
from tests.unit.test_serving_schema import make_doc

pytestmark = pytest.mark.slow

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"
BINARY_TRACE = "5cf92f3577b34da6a3ce929d0e0e4737"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every span it is sent, decoded from protobuf."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[Any] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def by_trace(self, trace_id: str) -> dict[str, Any]:
        with self.lock:
            return {s.name: s for s in self.spans if s.trace_id.hex() == trace_id}


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.server.lock:
            self.server.paths.append(self.path)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.server.spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def worker_env(published_version: Any, settings: Any, home: Path, endpoint: str) -> dict[str, str]:
    return {
        "RELAY_HOME": str(home),
        "RELAY_MODEL_STORE_URL": published_version.store.backend.describe(),
        "RELAY_CLICKHOUSE_DSN": settings.resolved_clickhouse_dsn,
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_ADMIN_TOKEN": "tracing-token",
        "RELAY_SERVING_STABLE_REF": published_version.manifest.version,
        "RELAY_SERVING_LOG_FLUSH_MS": "100",
        "RELAY_OTEL_EXPORTER_ENDPOINT": endpoint,
        "RELAY_OTEL_SAMPLE_RATIO": "0",  # only the callers' sampled traces are recorded
        "RELAY_OTEL_EXPORT_TIMEOUT_S": "1",
    }


@pytest.fixture(scope="module")
def worker(
    published_version: Any,
    settings: Any,
    receiver: Receiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    home = tmp_path_factory.mktemp("traced-worker")
    w = start_worker(
        worker_env(published_version, settings, home, receiver.endpoint), home / "worker.log"
    )
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def rows_of(settings: Any, spool: Path, request_ids: list[str]) -> dict[str, dict[str, Any]]:
    import logstore

    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rows: dict[str, dict[str, Any]] = {}

    def every_row_in() -> bool:  # the caller asserts on what arrived, all or not
        ingest_spool(client, spool)
        result = client.query(
            "SELECT request_id, trace_id, rows, status FROM inference_logs "
            "WHERE request_id IN {ids:Array(String)}",
            parameters={"ids": request_ids},
        )
        rows.clear()
        rows.update({r["request_id"]: r for r in result.named_results()})
        return set(rows) >= set(request_ids)

    poll_until(every_row_in, 15, interval_s=0.2)
    return rows


def wait_for(check: Any, timeout_s: float = 15) -> Any:
    """What `check` found once it found something, or its last answer after `timeout_s`."""
    return poll_until(check, timeout_s, interval_s=0.1)


def test_a_callers_trace_is_in_its_row_and_in_the_exported_spans_on_both_transports(
    worker: WorkerProcess, receiver: Receiver, settings: Any, published_version: Any
) -> None:
    doc = make_doc(n=7, seed=21)
    doc["request_id"] = "traced-http-1"
    answer = httpx.post(
        f"{worker.http_url}/v1/predict", json=doc, headers={"traceparent": CALLER}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    echoed = answer.headers["traceparent"]
    assert echoed.split("-")[1] == CALLER_TRACE and echoed.endswith("-01")

    for c in doc["candidates"]:
        c["item_id"] %= 2**24
    with BinaryClient(worker.binary_host, worker.binary_port, heartbeat_s=None) as binary:
        (result,) = binary.predict_many(
            [
                BinaryRequest(
                    doc["user"],
                    doc["session"],
                    doc["context"],
                    items_matrix(doc["candidates"]),
                    "traced-bin-1",
                    f"00-{BINARY_TRACE}-00f067aa0ba902b8-01",
                )
            ]
        )
    assert isinstance(result, BinaryResult) and result.traceparent.split("-")[1] == BINARY_TRACE

    spans = wait_for(
        lambda: len(receiver.by_trace(CALLER_TRACE)) >= 5 and receiver.by_trace(CALLER_TRACE)
    )
    assert set(spans) == {"http predict", "queue", "preprocess", "compute", "postprocess"}
    request = spans["http predict"]
    assert request.parent_span_id.hex() == "00f067aa0ba902b7"
    attributes = {a.key: a.value for a in request.attributes}
    assert attributes["relay.slot"].string_value == "stable"
    assert attributes["relay.model_version"].string_value == published_version.manifest.version
    assert attributes["relay.rows"].int_value == 7
    assert attributes["relay.input_size_bytes"].int_value > 0
    assert attributes["relay.batch_size"].int_value >= 1
    assert all(spans[s].parent_span_id == request.span_id for s in ("queue", "compute"))
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    assert "binary predict" in wait_for(lambda: receiver.by_trace(BINARY_TRACE))

    rows = rows_of(settings, worker_spool(worker), ["traced-http-1", "traced-bin-1"])
    assert rows["traced-http-1"]["trace_id"] == CALLER_TRACE
    assert rows["traced-bin-1"]["trace_id"] == BINARY_TRACE
    assert rows["traced-http-1"]["rows"] == 7


def worker_spool(worker: WorkerProcess) -> Path:
    return worker.log_path.parent / "spool"


def test_a_malformed_traceparent_is_served_under_a_new_trace(
    worker: WorkerProcess, settings: Any
) -> None:
    doc = make_doc(n=3, seed=22)
    doc["request_id"] = "traced-malformed-1"
    answer = httpx.post(
        f"{worker.http_url}/v1/predict",
        json=doc,
        headers={"traceparent": "00-not-a-trace-01"},
        timeout=10,
    )
    assert answer.status_code == 200 and len(answer.json()["scores"]) == 3
    new_trace = answer.headers["traceparent"].split("-")[1]
    assert len(new_trace) == 32 and int(new_trace, 16) != 0
    rows = rows_of(settings, worker_spool(worker), ["traced-malformed-1"])
    assert rows["traced-malformed-1"]["trace_id"] == new_trace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dropped(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("relay_trace_spans_dropped_total "):
            return float(line.split()[1])
    return 0.0


def test_an_unreachable_collector_drops_counted_spans_and_the_worker_keeps_serving(
    published_version: Any, settings: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = tmp_path_factory.mktemp("unreachable-collector")
    env = worker_env(published_version, settings, home, f"http://127.0.0.1:{free_port()}/v1/traces")
    env["RELAY_OTEL_SAMPLE_RATIO"] = "1"
    env["RELAY_OTEL_MAX_QUEUE_SPANS"] = "50"
    with start_worker(env, home / "worker.log") as w:
        w.wait_ready()
        with httpx.Client(base_url=w.http_url, timeout=10) as http:
            for i in range(60):  # 300 spans against a queue of 50
                assert http.post("/v1/predict", json=make_doc(n=2, seed=i)).status_code == 200
            assert wait_for(lambda: dropped(http.get("/metrics").text) >= 250, 20)
            assert http.get("/readyz").status_code == 200
            assert http.post("/v1/predict", json=make_doc(n=2, seed=99)).status_code == 200


def test_a_release_step_and_the_workers_load_and_warm_up_are_one_trace(
    worker: WorkerProcess, receiver: Receiver, published_version: Any
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from relay.settings import Settings
    from relay.types import Release
    from serving.fleet import FleetClient
    from tasks.tracing import release_context, release_span, release_tracer

    release = Release("rel-traced", published_version.manifest.version, "lineage")
    tracer = release_tracer(Settings(), InMemorySpanExporter())
    with FleetClient([worker.http_url], "tracing-token") as fleet:
        with release_span(tracer, release, "deploy canary") as step:
            loaded = fleet.load("canary", release.version)
        fleet.rollback()
    assert loaded.ok, loaded.reason
    trace_id = f"{release_context('rel-traced').trace_id:032x}"
    spans = wait_for(lambda: "load and warm" in (found := receiver.by_trace(trace_id)) and found)
    admin = spans["admin load"]
    assert admin.parent_span_id.hex() == f"{step.get_span_context().span_id:016x}"
    assert spans["load and warm"].parent_span_id == admin.span_id
    warm = spans["load and warm"]
    assert warm.end_time_unix_nano > warm.start_time_unix_nano

"""One real worker process (`python -m serving` on 127.0.0.1, ports picked by the OS): predict over
JSON and the binary protocol, every bad input with its code, admin auth, health, metrics, idle
reaping, a fuzz run, and one inference_logs row per request."""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from logstore.spool import ingest_spool
from relay_testing.waiting import poll_until
from serving.client import BinaryClient, BinaryRejection, BinaryRequest, BinaryResult, items_matrix
from serving.process import WorkerProcess, start_worker
from serving.protocol import Kind, encode_frame
from serving.schema import decode_json, model_input
from tests.unit.test_serving_schema import make_doc

TOKEN = "integration-admin-token-7f3a"
MAX_BODY = 65_536
MAX_CANDIDATES = 50


@pytest.fixture(scope="module")
def worker(
    published_version: Any, settings: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    home = tmp_path_factory.mktemp("serving-worker")
    env = {
        "RELAY_HOME": str(home),
        "RELAY_MODEL_STORE_URL": published_version.store.backend.describe(),
        # the session's chdb path: the worker must only spool, never open it
        "RELAY_CLICKHOUSE_DSN": settings.resolved_clickhouse_dsn,
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_STABLE_REF": published_version.manifest.version,
        "RELAY_SERVING_LOG_FLUSH_MS": "100",
        "RELAY_SERVING_BINARY_IDLE_S": "2",
        "RELAY_SERVING_MAX_CANDIDATES": str(MAX_CANDIDATES),
        "RELAY_SERVING_MAX_BODY_BYTES": str(MAX_BODY),
    }
    w = start_worker(env, home / "worker.log")
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def http(worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.http_url, timeout=10) as client:
        yield client


@pytest.fixture
def binary(worker: WorkerProcess) -> Iterator[BinaryClient]:
    with BinaryClient(worker.binary_host, worker.binary_port, heartbeat_s=None) as client:
        yield client


def expected_scores(published_version: Any, doc: dict[str, Any]) -> np.ndarray:
    """What the version's fp32 engine gives for this request, computed in this process."""
    from tasks.compilation import run_engine

    x = model_input(decode_json(json.dumps(doc).encode(), 1000).raw)
    return run_engine(published_version.workdir / "ort-fp32.onnx", x)


def binary_request(doc: dict[str, Any], request_id: str | None = None) -> BinaryRequest:
    return BinaryRequest(
        doc["user"], doc["session"], doc["context"], items_matrix(doc["candidates"]), request_id
    )


def small_ids(doc: dict[str, Any]) -> dict[str, Any]:
    for c in doc["candidates"]:
        c["item_id"] %= 2**24  # the binary payload is float32
    return doc


# -- answers -------------------------------------------------------------------------------------


def test_json_predict_scores_every_candidate_with_the_stable_model(
    http: httpx.Client, published_version: Any
) -> None:
    doc = make_doc(n=20, seed=11)
    response = http.post("/v1/predict", json=doc)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["slot"] == "stable" and body["request_id"] == doc["request_id"]
    assert body["model_version"] == published_version.manifest.version
    assert body["lineage_id"] == published_version.manifest.lineage_id
    np.testing.assert_allclose(body["scores"], expected_scores(published_version, doc), rtol=1e-5)


def test_binary_predict_matches_json_and_pipelines(
    http: httpx.Client, binary: BinaryClient, published_version: Any
) -> None:
    docs = [small_ids(make_doc(n=1 + i % 20, seed=100 + i)) for i in range(200)]
    answers = binary.predict_many(
        [binary_request(d, f"bin-{i}") for i, d in enumerate(docs)], window=32
    )
    assert all(isinstance(a, BinaryResult) for a in answers)
    assert [a.request_id for a in answers] == [f"bin-{i}" for i in range(200)]  # type: ignore[union-attr]
    for doc, answer in list(zip(docs, answers, strict=True))[:10]:
        assert isinstance(answer, BinaryResult)
        over_json = http.post("/v1/predict", json=doc).json()["scores"]
        np.testing.assert_allclose(answer.scores, over_json, rtol=1e-6)
        assert answer.model_version == published_version.manifest.version


def test_ping_answers_with_a_pong(binary: BinaryClient) -> None:
    assert 0 < binary.ping() < 1.0


# -- bad input -----------------------------------------------------------------------------------


def mutated(change: Any) -> bytes:
    doc = make_doc(n=3, seed=5)
    change(doc)
    return json.dumps(doc).encode()


BAD_HTTP = {
    "malformed_json": (b'{"user": {', 400, "bad_json"),
    "not_an_object": (b"[]", 400, "not_an_object"),
    "missing_feature": (
        mutated(lambda d: d["candidates"][0].pop("price")),
        400,
        "wrong_feature_count",
    ),
    "extra_feature": (
        mutated(lambda d: d["candidates"][1].update(colour=1)),
        400,
        "wrong_feature_count",
    ),
    "wrong_dtype": (
        mutated(lambda d: d["candidates"][0].update(price="cheap")),
        400,
        "wrong_type",
    ),
    "nan": (
        mutated(lambda d: d["candidates"][2].update(item_ctr_7d=float("nan"))),
        400,
        "non_finite",
    ),
    "inf": (mutated(lambda d: d["user"].update(user_avg_price=float("inf"))), 400, "non_finite"),
    "empty_candidates": (mutated(lambda d: d.update(candidates=[])), 400, "empty_candidates"),
    "too_many_candidates": (
        json.dumps(make_doc(n=MAX_CANDIDATES + 1)).encode(),
        400,
        "too_many_candidates",
    ),
    "oversized_body": (b" " * (MAX_BODY + 1), 413, "body_too_large"),
    "negative_id": (
        mutated(lambda d: d["candidates"][0].update(category_id=-3)),
        400,
        "bad_categorical",
    ),
    "impossible_value": (
        mutated(lambda d: d["candidates"][0].update(discount_pct=7)),
        400,
        "out_of_range",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_HTTP))
def test_bad_json_input_gets_a_4xx_naming_the_problem(http: httpx.Client, case: str) -> None:
    content, status, code = BAD_HTTP[case]
    response = http.post(
        "/v1/predict", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code and body["detail"] and body["request_id"]
    assert http.get("/healthz").status_code == 200


def test_binary_length_mismatch_is_refused_and_the_connection_carries_on(
    binary: BinaryClient,
) -> None:
    doc = small_ids(make_doc(n=4))
    header = {
        "id": 5,
        "user": doc["user"],
        "session": doc["session"],
        "context": doc["context"],
        "rows": 4,
        "cols": 13,
    }
    short = items_matrix(doc["candidates"]).tobytes()[:-8]
    (frame,) = binary.send_raw(encode_frame(Kind.PREDICT, header, short))
    kind, head, _ = frame
    assert kind == Kind.ERROR and head["id"] == 5 and head["status"] == 400
    assert head["error"] == "payload_length_mismatch" and "bytes" in head["detail"]
    assert isinstance(binary.predict_many([binary_request(doc)])[0], BinaryResult)


def test_binary_bad_fields_get_an_error_frame_per_request(binary: BinaryClient) -> None:
    good = small_ids(make_doc(n=2))
    bad = small_ids(make_doc(n=2))
    bad["user"]["user_age"] = "old"
    answers = binary.predict_many([binary_request(good), binary_request(bad)])
    assert isinstance(answers[0], BinaryResult)
    assert isinstance(answers[1], BinaryRejection) and answers[1].error == "wrong_type"


def test_an_unreadable_frame_gets_an_error_and_the_connection_is_closed(
    worker: WorkerProcess,
) -> None:
    with socket.create_connection((worker.binary_host, worker.binary_port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert b'"error":"bad_frame"' in received


# -- admin, health, metrics ----------------------------------------------------------------------


def test_admin_needs_the_bearer_token(http: httpx.Client, worker: WorkerProcess) -> None:
    missing = http.get("/admin/state")
    assert missing.status_code == 401 and missing.json()["error"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = http.get("/admin/state", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    right = http.get("/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 200 and right.json()["ready"] is True
    assert TOKEN not in worker.log_text()


def test_admin_load_of_an_unknown_version_is_404_and_changes_nothing(
    http: httpx.Client, published_version: Any
) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    response = http.post(
        "/admin/load", json={"slot": "canary", "version": "no-such-version"}, headers=auth
    )
    assert response.status_code == 404 and response.json()["error"] == "unknown_version"
    state = http.get("/admin/state", headers=auth).json()
    assert state["slots"]["canary"] is None
    assert state["slots"]["stable"]["version"] == published_version.manifest.version
    bad_slot = http.post("/admin/load", json={"slot": "blue", "version": "x"}, headers=auth)
    assert bad_slot.status_code == 400 and bad_slot.json()["error"] == "bad_slot"
    no_canary = http.post("/admin/weight", json={"weight": 10}, headers=auth)
    assert no_canary.status_code == 409 and no_canary.json()["error"] == "no_canary"
    not_json = http.post("/admin/weight", content=b"{", headers=auth)
    assert not_json.status_code == 400 and not_json.json()["error"] == "bad_json"


def test_a_canary_weight_needs_a_valid_lease_and_bad_ones_change_nothing(
    http: httpx.Client, published_version: Any
) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    version = published_version.manifest.version
    try:
        loaded = http.post("/admin/load", json={"slot": "canary", "version": version}, headers=auth)
        assert loaded.status_code == 200, loaded.text
        renew = http.post("/admin/renew", json={"lease_s": 30}, headers=auth)
        assert renew.status_code == 409 and renew.json()["error"] == "no_lease"  # weight 0
        for body, status, code in (
            ({"weight": 20}, 400, "missing_field"),
            ({"weight": 20, "lease_s": 0}, 400, "bad_lease"),
            ({"weight": 20, "lease_s": -3}, 400, "bad_lease"),
            ({"weight": 20, "lease_s": 601}, 400, "bad_lease"),  # above the default maximum
            ({"weight": 20, "lease_s": "60"}, 400, "bad_lease"),
        ):
            refused = http.post("/admin/weight", json=body, headers=auth)
            assert (refused.status_code, refused.json()["error"]) == (status, code), body
            assert refused.json()["detail"]
        state = http.get("/admin/state", headers=auth).json()
        assert state["canary_weight"] == 0 and state["canary_lease"]["lease_s"] is None
        held = http.post("/admin/weight", json={"weight": 20, "lease_s": 60}, headers=auth).json()
        assert held["canary_weight"] == 20 and held["canary_lease"]["lease_s"] == 60
        assert 59 < held["canary_lease"]["seconds_left"] <= 60
        assert held["canary_lease"]["expires_at"] == pytest.approx(time.time() + 60, abs=5)
        missing = http.post("/admin/renew", json={}, headers=auth)
        assert missing.status_code == 400 and missing.json()["error"] == "missing_field"
        renewed = http.post("/admin/renew", json={"lease_s": 120}, headers=auth).json()
        assert renewed["canary_weight"] == 20 and renewed["canary_lease"]["seconds_left"] > 119
        assert "relay_canary_lease_seconds_left 1" in http.get("/metrics").text
        zero = http.post("/admin/weight", json={"weight": 0}, headers=auth)  # no lease needed
        assert zero.status_code == 200 and zero.json()["canary_lease"]["seconds_left"] is None
    finally:
        http.post("/admin/rollback", headers=auth)


def test_a_version_that_cannot_load_is_refused_and_serving_carries_on(
    http: httpx.Client, published_version: Any, tmp_path: Path
) -> None:
    from relay.types import EngineRecord

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"these bytes are not an ONNX model")
    store, base = published_version.store, published_version.manifest
    broken = store.publish(
        base.model_copy(
            update={
                "version": f"{base.version}-broken",
                "engines": [EngineRecord(name="ort-fp32", blob=store.put_blob(junk))],
            }
        )
    )
    auth = {"authorization": f"Bearer {TOKEN}"}
    response = http.post(
        "/admin/load", json={"slot": "canary", "version": broken.version}, headers=auth
    )
    assert response.status_code == 422 and response.json()["error"] == "load_failed"
    assert http.get("/admin/state", headers=auth).json()["slots"]["canary"] is None
    assert http.post("/v1/predict", json=make_doc(n=2)).status_code == 200


def test_unknown_paths_and_methods_get_json_errors(http: httpx.Client) -> None:
    assert http.get("/v1/predict").status_code == 405
    missing = http.get("/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"] == "http_404"


def test_health_readiness_and_metrics(http: httpx.Client) -> None:
    assert http.get("/healthz").json()["status"] == "ok"
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    http.post("/v1/predict", content=b"{")
    assert http.post("/v1/predict", json=make_doc(n=3)).status_code == 200
    text = http.get("/metrics").text
    assert 'error_code="bad_json"' in text and "relay_requests_total" in text
    for name in (
        "relay_request_latency_seconds_bucket",
        "relay_batch_rows_bucket",
        "relay_batch_requests_bucket",
        "relay_queue_depth",
        "relay_spool_bytes",
        "relay_spool_over_cap 0.0",
        'relay_spool_table_over_cap{table="impressions"} 0.0',
        "relay_model_info",
        "relay_ready 1.0",
    ):
        assert name in text, name


def test_idle_binary_connections_are_reaped(worker: WorkerProcess) -> None:
    with socket.create_connection((worker.binary_host, worker.binary_port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the worker, not by us
        assert 1.0 < time.monotonic() - started < 8


def test_heartbeats_keep_a_quiet_connection_open(worker: WorkerProcess) -> None:
    with BinaryClient(worker.binary_host, worker.binary_port, heartbeat_s=0.5) as client:
        time.sleep(3.5)  # longer than the 2 s idle limit
        assert client.ping() < 1.0


# -- fuzz ----------------------------------------------------------------------------------------


def fuzz_bodies(n: int, seed: int = 0) -> list[bytes]:
    """Random bytes, truncations, byte flips and structural mutations of valid requests."""
    rng = random.Random(seed)
    junk: list[Any] = [None, True, "x", -1, 1e308, [], {}, [1, 2], 2**70, -0.0, "NaN"]
    out = []
    for i in range(n):
        doc = make_doc(n=rng.randint(1, 8), seed=i)
        kind = i % 6
        if kind == 0:
            out.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300))))
            continue
        raw = json.dumps(doc).encode()
        if kind == 1:
            out.append(raw[: rng.randint(0, len(raw))])
        elif kind == 2:
            flipped = bytearray(raw)
            for _ in range(rng.randint(1, 5)):
                flipped[rng.randrange(len(flipped))] = rng.getrandbits(8)
            out.append(bytes(flipped))
        else:
            section = rng.choice(["user", "session", "context", "candidates"])
            target = rng.choice(doc["candidates"]) if section == "candidates" else doc[section]
            key = rng.choice(list(target))
            if kind == 3:
                target[key] = rng.choice(junk)
            elif kind == 4:
                del target[key]
            else:
                doc[rng.choice(["user", "candidates", "context"])] = rng.choice(junk)
            out.append(json.dumps(doc).encode())
    return out


def test_fuzz_never_breaks_the_worker(
    http: httpx.Client, worker: WorkerProcess, published_version: Any
) -> None:
    statuses: dict[int, int] = {}
    for content in fuzz_bodies(1_000):
        response = http.post("/v1/predict", content=content)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (content[:200], response.text)
        assert "error" in response.json() or "scores" in response.json()
    assert statuses.get(400, 0) > 500  # most mutations are caught as bad input
    # binary: valid frames with garbage headers and payloads of random lengths
    binary = BinaryClient(worker.binary_host, worker.binary_port, heartbeat_s=0.5)
    rng = random.Random(1)
    frames = []
    for i in range(200):
        doc = small_ids(make_doc(n=rng.randint(1, 5), seed=i))
        header: dict[str, Any] = {
            "id": i,
            "user": doc["user"],
            "session": doc["session"],
            "context": doc["context"],
            "rows": rng.randint(-1, 6),
            "cols": rng.choice([13, 13, 12, 0]),
        }
        if i % 5 == 0:
            header["user"] = rng.choice([None, {}, "x", {"user_id": 1}])
        payload = np.random.default_rng(i).normal(0, 10, rng.randint(0, 80)).astype("<f4")
        frames.append(encode_frame(Kind.PREDICT, header, payload.tobytes()))
    for frame in frames:
        kinds = [k for k, _, _ in binary.send_raw(frame)]
        assert kinds and all(k in (Kind.RESULT, Kind.ERROR) for k in kinds)
    # and then it still answers correctly
    doc = make_doc(n=20, seed=4242)
    response = http.post("/v1/predict", json=doc)
    assert response.status_code == 200
    np.testing.assert_allclose(
        response.json()["scores"], expected_scores(published_version, doc), rtol=1e-5
    )
    assert isinstance(binary.predict_many([binary_request(small_ids(doc))])[0], BinaryResult)
    binary.close()


# -- one log row per request ---------------------------------------------------------------------


def logged(settings: Any, spool: Path, request_ids: list[str], timeout_s: float = 15) -> dict:
    """Ingest the worker's spool until every request id has its row; the rows by request id."""
    import logstore

    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rows: dict[str, list[dict]] = {}

    def every_row_in() -> bool:  # the caller asserts on what arrived, all or not
        ingest_spool(client, spool)
        result = client.query(
            "SELECT request_id, slot, model_version, lineage_id, status, error_code, latency_ms, "
            "queue_ms, preprocess_ms, compute_ms, postprocess_ms, batch_size, input_bytes, "
            "user_id, session_id FROM inference_logs WHERE request_id IN {ids:Array(String)}",
            parameters={"ids": request_ids},
        )
        rows.clear()
        for row in result.named_results():
            rows.setdefault(row["request_id"], []).append(row)
        return set(rows) >= set(request_ids)

    poll_until(every_row_in, timeout_s, interval_s=0.2)
    return rows


def test_every_request_good_or_bad_gets_exactly_one_log_row(
    http: httpx.Client,
    binary: BinaryClient,
    worker: WorkerProcess,
    settings: Any,
    published_version: Any,
) -> None:
    expected: dict[str, tuple[int, str]] = {}
    good = make_doc(n=20, seed=77)
    good["request_id"] = f"log-good-{time.time_ns()}"
    assert http.post("/v1/predict", json=good).status_code == 200
    expected[good["request_id"]] = (200, "")
    for content, status, code in BAD_HTTP.values():
        response = http.post("/v1/predict", content=content)
        expected[response.json()["request_id"]] = (status, code)
    doc = small_ids(make_doc(n=3))
    bad = small_ids(make_doc(n=3))
    bad["candidates"][0]["position"] = -2
    answers = binary.predict_many([binary_request(doc, "log-bin-ok"), binary_request(bad)])
    expected["log-bin-ok"] = (200, "")
    assert isinstance(answers[1], BinaryRejection)
    expected[answers[1].request_id] = (400, "bad_categorical")
    header = {
        "id": 9,
        "user": doc["user"],
        "session": doc["session"],
        "context": doc["context"],
        "rows": 3,
        "cols": 13,
    }
    ((_, mismatch, _),) = binary.send_raw(encode_frame(Kind.PREDICT, header, b"\0" * 12))
    expected[mismatch["request_id"]] = (400, "payload_length_mismatch")
    unknown = http.post(
        "/admin/load",
        json={"slot": "canary", "version": "nope"},
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    expected[unknown.json()["request_id"]] = (404, "unknown_version")

    rows = logged(settings, worker.log_path.parent / "spool", list(expected))
    assert {rid: len(r) for rid, r in rows.items()} == dict.fromkeys(expected, 1)
    for rid, (status, code) in expected.items():
        (row,) = rows[rid]
        assert (row["status"], row["error_code"]) == (status, code), rid
    ok = rows[good["request_id"]][0]
    assert ok["slot"] == "stable" and ok["model_version"] == published_version.manifest.version
    assert ok["lineage_id"] == published_version.manifest.lineage_id
    assert ok["user_id"] == good["user"]["user_id"] and ok["session_id"] == "s-1"
    assert ok["batch_size"] >= 1 and ok["input_bytes"] > 1000
    parts = sum(ok[k] for k in ("queue_ms", "preprocess_ms", "compute_ms", "postprocess_ms"))
    assert ok["latency_ms"] > 0 and parts == pytest.approx(ok["latency_ms"], rel=1e-3, abs=1e-3)
    assert rows["log-bin-ok"][0]["input_bytes"] == 3 * 13 * 4
    assert rows[unknown.json()["request_id"]][0]["slot"] == "admin"


def test_baseline_cohort_is_served_logged_shown_and_leaves_with_the_canary(
    http: httpx.Client, worker: WorkerProcess, settings: Any, published_version: Any
) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    version = published_version.manifest.version
    try:
        for slot in ("canary", "baseline"):  # the same version again: its own engine and batcher
            loaded = http.post("/admin/load", json={"slot": slot, "version": version}, headers=auth)
            assert loaded.status_code == 200, loaded.text
        refused = http.post("/admin/weight", json={"weight": 60, "lease_s": 60}, headers=auth)
        assert refused.status_code == 400 and "at most 50%" in refused.json()["detail"]
        set_30 = http.post("/admin/weight", json={"weight": 30, "lease_s": 60}, headers=auth)
        assert set_30.status_code == 200
        state = http.get("/admin/state", headers=auth).json()
        assert state["slots"]["baseline"]["version"] == version and state["canary_weight"] == 30
        slots: dict[str, int] = {}
        ids = []
        for user in range(300):
            doc = make_doc(n=2, seed=user)
            doc["user"]["user_id"] = 10_000 + user
            doc["request_id"] = f"cohort-{time.time_ns()}-{user}"
            answer = http.post("/v1/predict", json=doc).json()
            slots[answer["slot"]] = slots.get(answer["slot"], 0) + 1
            ids.append(doc["request_id"])
        assert set(slots) == {"canary", "baseline", "stable"}
        assert abs(slots["canary"] - slots["baseline"]) < 60  # equal shares, 30 % each
        rows = logged(settings, worker.log_path.parent / "spool", ids)
        assert {r[0]["slot"] for r in rows.values()} == {"canary", "baseline", "stable"}
        assert 'slot="baseline"' in http.get("/metrics").text
    finally:
        http.post("/admin/rollback", headers=auth)
    state = http.get("/admin/state", headers=auth).json()
    assert state["slots"]["baseline"] is None and state["slots"]["canary"] is None

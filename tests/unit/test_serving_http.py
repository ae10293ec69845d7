"""The worker's HTTP routes in process: fault injection is off unless a setting enables it, and
the predict route answers through the same log path as before the routers were split."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson

from logstore.log_tables import IMPRESSIONS
from logstore.spool import read_segment
from serving.http import build_app
from serving.worker import Worker
from tests.unit.test_serving_log_path import serve_from, worker_on
from tests.unit.test_serving_schema import make_doc

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def call(worker: Worker, calls: list[tuple[str, str, Any]]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=build_app(worker))
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
        out = [await client.request(m, path, json=body, headers=AUTH) for m, path, body in calls]
    await worker.close()
    return out


INJECTIONS = [
    ("POST", "/admin/latency", {"slot": "stable", "ms": 50}),
    ("POST", "/admin/ranking", {"slot": "stable", "ranking": "reversed"}),
]


def test_a_production_worker_answers_404_on_fault_injection(tmp_path: Path) -> None:
    worker = worker_on(tmp_path, serving_admin_token=TOKEN)
    latency, ranking, state = asyncio.run(
        call(worker, [*INJECTIONS, ("GET", "/admin/state", None)])
    )
    assert latency.status_code == ranking.status_code == 404
    assert latency.json()["error"] == "http_404"
    assert state.status_code == 200  # the rest of the admin API is there
    assert state.json()["inject_latency_ms"]["stable"] == 0.0


def test_fault_injection_works_where_the_setting_enables_it(tmp_path: Path) -> None:
    worker = worker_on(tmp_path, serving_admin_token=TOKEN, serving_fault_injection=True)
    latency, ranking = asyncio.run(call(worker, INJECTIONS))
    assert latency.status_code == ranking.status_code == 200
    assert ranking.json()["inject_latency_ms"]["stable"] == 50.0
    assert ranking.json()["ranking"]["stable"] == "reversed"


def test_an_injection_with_an_unknown_field_is_refused_naming_it_and_changes_nothing(
    tmp_path: Path,
) -> None:
    worker = worker_on(tmp_path, serving_admin_token=TOKEN, serving_fault_injection=True)
    typo = {"slot": "stable", "ms": 50, "facter": 3.0}  # a misspelt knob must not pass silently
    refused, state = asyncio.run(
        call(worker, [("POST", "/admin/latency", typo), ("GET", "/admin/state", None)])
    )
    assert refused.status_code == 400
    assert refused.json()["error"] == "unknown_field" and "'facter'" in refused.json()["detail"]
    assert state.json()["inject_latency_ms"]["stable"] == 0.0


def test_predict_answers_and_logs_through_the_split_routes(tmp_path: Path) -> None:
    async def scenario() -> list[httpx.Response]:
        worker = worker_on(tmp_path)
        serve_from(worker)
        body = orjson.dumps(make_doc(n=3, seed=1))
        return await call(worker, [("POST", "/v1/predict", orjson.loads(body))])

    (answer,) = asyncio.run(scenario())
    assert answer.status_code == 200 and len(answer.json()["scores"]) == 3
    (segment,) = tmp_path.glob("*.arrow")  # its inference_logs row, written out at close
    logged = read_segment(segment)
    assert logged.column("request_id").to_pylist() == [answer.json()["request_id"]]
    assert logged.column("status").to_pylist() == [200] and logged.column("rows")[0].as_py() == 3


def pinned_calls(
    worker: Worker, calls: list[tuple[dict[str, str], dict[str, Any]]]
) -> list[httpx.Response]:
    async def scenario() -> list[httpx.Response]:
        serve_from(worker)  # a stable slot only: the canary stays empty
        transport = httpx.ASGITransport(app=build_app(worker))
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            out = [await client.post("/v1/predict", json=b, headers=h) for h, b in calls]
        await worker.close()
        return out

    return asyncio.run(scenario())


def test_a_load_test_pins_a_slot_with_the_admin_token_and_is_logged_apart(
    tmp_path: Path,
) -> None:
    worker = worker_on(tmp_path, serving_admin_token=TOKEN)
    doc = make_doc(n=3, seed=1)
    pin = {"X-Relay-Pin-Slot": "stable", **AUTH}
    user, pinned = pinned_calls(worker, [({}, doc), (pin, doc)])
    assert user.status_code == pinned.status_code == 200
    assert pinned.json()["slot"] == "loadtest" and user.json()["slot"] == "stable"
    (segment,) = tmp_path.glob("*.arrow")
    slots = dict(
        zip(
            read_segment(segment).column("request_id").to_pylist(),
            read_segment(segment).column("slot").to_pylist(),
            strict=True,
        )
    )
    assert slots == {user.json()["request_id"]: "stable", pinned.json()["request_id"]: "loadtest"}
    impressions = IMPRESSIONS.spool_dir(tmp_path).glob("*.arrow")
    shown = {
        r
        for p in impressions
        for r in read_segment(p, IMPRESSIONS).column("request_id").to_pylist()
    }
    assert shown == {user.json()["request_id"]}  # the load test's answer was shown to nobody


def test_a_pinned_request_without_the_token_or_to_a_bad_slot_is_refused(tmp_path: Path) -> None:
    worker = worker_on(tmp_path, serving_admin_token=TOKEN)
    doc = make_doc(n=2, seed=2)
    no_token, wrong, bad_slot, empty, after = pinned_calls(
        worker,
        [
            ({"X-Relay-Pin-Slot": "canary"}, doc),
            ({"X-Relay-Pin-Slot": "canary", "Authorization": "Bearer nope"}, doc),
            ({"X-Relay-Pin-Slot": "baseline", **AUTH}, doc),
            ({"X-Relay-Pin-Slot": "canary", **AUTH}, doc),  # nothing loaded there
            ({}, doc),
        ],
    )
    assert no_token.status_code == wrong.status_code == 401
    assert bad_slot.status_code == 400 and "stable, canary" in bad_slot.json()["detail"]
    assert empty.status_code == 409 and empty.json()["error"] == "empty_slot"
    assert after.status_code == 200  # the worker keeps serving users

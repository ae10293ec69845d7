"""The worker's HTTP routes in process: fault injection is off unless a setting enables it, and
the predict route answers through the same log path as before the routers were split."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson

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

"""Impressions and feedback reach ClickHouse exactly once across a killed worker, join into
labelled events, and bad feedback bodies get a 4xx naming the field while the worker serves on."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from logstore.feedback import feedback_counts, read_labelled_window
from logstore.reading import connect_for_reading
from serving.process import WorkerProcess, start_worker
from tests.integration.test_serving_logging import logging_worker_env, worker_env
from tests.unit.test_serving_schema import make_doc


def served(http: httpx.Client, tag: str, n: int, candidates: int = 6) -> dict[str, list[int]]:
    """`n` answered predict requests; their candidates' item ids by request id."""
    out = {}
    for i in range(n):
        doc = make_doc(n=candidates, seed=1000 + i)
        doc["request_id"] = f"{tag}-{i}"
        response = http.post("/v1/predict", json=doc)
        assert response.status_code == 200, response.text
        out[doc["request_id"]] = [c["item_id"] for c in doc["candidates"]]
    return out


def click(http: httpx.Client, request_id: str, item_id: int, order: float = 0.0) -> list[str]:
    events: list[dict[str, Any]] = [{"item_id": item_id, "event": "click"}]
    if order:
        events.append({"item_id": item_id, "event": "order", "order_value": order})
    response = http.post("/v1/feedback", json={"request_id": request_id, "events": events})
    assert response.status_code == 202, response.text
    return list(response.json()["feedback_ids"])


@pytest.mark.slow
def test_impressions_and_feedback_are_in_clickhouse_once_across_a_killed_worker(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    # A long flush interval: at the SIGKILL every row exists only in the write-ahead files.
    env = logging_worker_env(published_version, settings, tmp_path, flush_ms="60000")
    tag = f"fb-{time.time_ns()}"
    start = datetime.now(UTC) - timedelta(seconds=1)
    first = start_worker(env, tmp_path / "first.log")
    first.wait_ready()
    with httpx.Client(base_url=first.http_url, timeout=10) as http:
        before = served(http, f"{tag}-a", 30)
        feedback_ids = [fid for rid, items in before.items() for fid in click(http, rid, items[0])]
    first.process.kill()  # no drain, no flush: only the write-ahead files hold the rows
    first.process.wait()

    second = start_worker(env, tmp_path / "second.log")  # recovers the dead worker's files
    second.wait_ready()
    with httpx.Client(base_url=second.http_url, timeout=10) as http:
        after = served(http, f"{tag}-b", 10)
        rid, items = next(iter(after.items()))
        feedback_ids += click(http, rid, items[1], order=25.0)
        feedback_ids += click(http, f"{tag}-never-served", 42)
    assert second.stop() == 0

    client = connect_for_reading(settings.resolved_clickhouse_dsn, tmp_path / "spool")
    impressions = client.query(
        "SELECT request_id, count(), uniqExact(rank) FROM impressions "
        "WHERE startsWith(request_id, {tag:String}) GROUP BY request_id",
        parameters={"tag": tag},
    ).result_rows
    expected = {**before, **after}
    assert {r[0]: (r[1], r[2]) for r in impressions} == {r: (6, 6) for r in expected}
    stored = client.query(
        "SELECT feedback_id, count() FROM feedback WHERE startsWith(request_id, {tag:String}) "
        "GROUP BY feedback_id",
        parameters={"tag": tag},
    ).result_rows
    assert sorted(r[0] for r in stored) == sorted(feedback_ids)
    assert all(r[1] == 1 for r in stored)

    end = datetime.now(UTC) + timedelta(seconds=1)
    counts = feedback_counts(client, start, end)
    assert counts.events == len(feedback_ids) == 30 + 2 + 1
    assert counts.unmatched == 1  # the never-served request's click: kept, counted, unjoined
    assert (counts.clicks, counts.orders, counts.order_value) == (32, 1, 25.0)

    labelled = read_labelled_window(client, start, end)
    ours = labelled[labelled["session_id"] == "s-1"]
    assert len(ours) >= 40 * 6
    clicked = ours[ours["clicked"] == 1]
    assert sorted(clicked["item_id"].tolist()) == sorted(
        [items[0] for items in before.values()] + [items[1]]
    )
    assert set(ours["position"]) == set(range(1, 7))  # the served rank, not the request's field


@pytest.fixture(scope="module")
def worker(published_version: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = tmp_path_factory.mktemp("feedback-worker")
    env = worker_env(published_version, home, RELAY_SERVING_MAX_BODY_BYTES="4096")
    with start_worker(env, home / "worker.log") as process:
        process.wait_ready()
        yield process


@pytest.mark.parametrize(
    ("body", "status", "code", "names"),
    [
        ({"events": [{"item_id": 1, "event": "click"}]}, 400, "missing_field", "request_id"),
        (
            {"request_id": "r", "events": [{"item_id": 1, "event": "like"}]},
            400,
            "unknown_event",
            "events[0].event",
        ),
        (
            {"request_id": "r", "events": [{"item_id": 1, "event": "order", "order_value": -3}]},
            400,
            "out_of_range",
            "events[0].order_value",
        ),
        (
            {"request_id": "r", "events": [{"item_id": "x", "event": "click"}]},
            400,
            "wrong_type",
            "item_id",
        ),
        ({"request_id": "r", "events": []}, 400, "missing_field", "events"),
        (
            {"request_id": "r", "events": [{"item_id": 1, "event": "click"}] * 101},
            400,
            "too_many_events",
            "at most 100",
        ),
        ({"request_id": "r" * 5000, "events": []}, 413, "body_too_large", "limit"),
    ],
)
def test_bad_feedback_gets_a_4xx_naming_the_problem_and_the_worker_keeps_serving(
    worker: WorkerProcess, body: dict[str, Any], status: int, code: str, names: str
) -> None:
    with httpx.Client(base_url=worker.http_url, timeout=10) as http:
        response = http.post("/v1/feedback", json=body)
        assert response.status_code == status, response.text
        assert response.json()["error"] == code and names in response.json()["detail"]
        assert http.post("/v1/predict", json=make_doc(n=3)).status_code == 200
        assert http.post("/v1/feedback", content=b"{not json").json()["error"] == "bad_json"
        assert "relay_feedback_events_total" in http.get("/metrics").text

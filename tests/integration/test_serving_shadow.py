"""The shadow on a real worker: mirrored requests leave one shadow_pairs row each and nothing
served (no inference_logs row, no impressions) across a SIGKILL; a full mirror queue drops and
counts without delaying users; bad shadow calls get a 4xx naming the problem."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from logstore.reading import connect_for_reading
from relay_testing.waiting import wait_until
from serving.process import start_worker
from tests.integration.test_feedback_log import served
from tests.integration.test_serving_logging import logging_worker_env
from tests.unit.test_serving_schema import make_doc

TOKEN = "shadow-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


def shadow_env(published_version: Any, settings: Any, home: Path) -> dict[str, str]:
    env = logging_worker_env(published_version, settings, home, flush_ms="60000")
    env |= {
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_FAULT_INJECTION": "true",
        "RELAY_SERVING_SHADOW_MAX_SHARE": "1.0",
    }
    return env


def admin(http: httpx.Client, name: str, body: dict[str, Any]) -> httpx.Response:
    return http.post(f"/admin/{name}", json=body, headers=ADMIN)


def shadow_state(http: httpx.Client) -> dict[str, Any]:
    return dict(http.get("/admin/state", headers=ADMIN).json()["shadow"])


@pytest.mark.slow
def test_mirrored_requests_leave_pairs_and_nothing_served_across_a_killed_worker(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    env = shadow_env(published_version, settings, tmp_path)
    version = published_version.manifest.version
    tag = f"sh-{time.time_ns()}"
    first = start_worker(env, tmp_path / "first.log")
    first.wait_ready()
    with httpx.Client(base_url=first.http_url, timeout=10) as http:
        refused = admin(http, "shadow", {"share": 0.5, "lease_s": 30})
        assert refused.status_code == 409 and refused.json()["error"] == "no_canary"
        assert admin(http, "load", {"slot": "canary", "version": version}).status_code == 200
        assert admin(http, "latency", {"slot": "canary", "ms": 40}).status_code == 200
        on = admin(http, "shadow", {"share": 1.0, "max_queue": 64, "lease_s": 60})
        assert on.status_code == 200 and on.json()["shadow"]["on"], on.text
        items = served(http, tag, 20)
        state = wait_until(
            lambda: (s := shadow_state(http))["mirrored"] == 20 and s["in_flight"] == 0 and s,
            20,
            "every answered request mirrored and its pair written",
        )
        assert state["dropped"] == 0 and state["errors"] == 0
    first.process.kill()  # only the write-ahead files hold the rows
    first.process.wait()
    second = start_worker(env, tmp_path / "second.log")  # recovers the dead worker's files
    second.wait_ready()
    assert second.stop() == 0

    client = connect_for_reading(settings.resolved_clickhouse_dsn, tmp_path / "spool")
    where = "WHERE startsWith(request_id, {tag:String})"
    logged = client.query(
        f"SELECT slot, count() FROM inference_logs {where} GROUP BY slot",
        parameters={"tag": tag},
    ).result_rows
    assert logged == [("stable", 20)]  # the mirrored answers were never served
    shown = client.query(
        f"SELECT slot, uniqExact(request_id), count() FROM impressions {where} GROUP BY slot",
        parameters={"tag": tag},
    ).result_rows
    assert shown == [("stable", 20, 20 * 6)]
    pairs = client.query(
        "SELECT request_id, stable_version, candidate_version, stable_latency_ms, "
        f"shadow_latency_ms, shadow_error, stable_top_k, shadow_top_k FROM shadow_pairs {where}",
        parameters={"tag": tag},
    ).result_rows
    assert sorted(p[0] for p in pairs) == sorted(items)  # once each, keyed by request id
    assert sorted(p[3] for p in pairs)[10] < 40  # stable's median: never held
    for _, stable_v, candidate_v, _, shadow_ms, error, stable_top, shadow_top in pairs:
        assert (stable_v, candidate_v, error) == (version, version, "")
        assert shadow_ms >= 40  # the canary's injected 40 ms is the shadow's alone
        assert len(stable_top) == 6 and stable_top == shadow_top  # same model: same ranking


@pytest.mark.slow
def test_a_full_mirror_queue_drops_and_counts_without_delaying_users(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    env = shadow_env(published_version, settings, tmp_path)
    version = published_version.manifest.version
    with start_worker(env, tmp_path / "worker.log") as worker:
        worker.wait_ready()
        with httpx.Client(base_url=worker.http_url, timeout=10) as http:
            assert admin(http, "load", {"slot": "canary", "version": version}).status_code == 200
            assert admin(http, "latency", {"slot": "canary", "ms": 2000}).status_code == 200
            bad = admin(http, "shadow", {"share": 1.0, "max_queue": 0, "lease_s": 30})
            assert bad.status_code == 400 and "max_queue" in bad.json()["detail"]
            unleased = admin(http, "shadow", {"share": 1.0})
            assert unleased.status_code == 400 and "lease_s" in unleased.json()["detail"]
            on = admin(http, "shadow", {"share": 1.0, "max_queue": 2, "lease_s": 30})
            assert on.status_code == 200, on.text

            def answer(i: int) -> tuple[int, float]:
                t0 = time.perf_counter()
                r = http.post("/v1/predict", json=make_doc(n=6, seed=i))
                return r.status_code, time.perf_counter() - t0

            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(answer, range(12)))
            assert all(status == 200 for status, _ in answers)
            # Users never wait on the 2 s the shadow's candidate takes.
            assert max(seconds for _, seconds in answers) < 1.0
            state = shadow_state(http)
            assert state["mirrored"] == 2 and state["dropped"] == 10
            metrics = http.get("/metrics").text
            assert "relay_shadow_dropped_total 10.0" in metrics
            off = admin(http, "shadow", {"share": 0})
            assert off.status_code == 200 and not off.json()["shadow"]["on"]

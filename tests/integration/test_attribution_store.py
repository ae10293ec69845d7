"""A rejected canary's verdict is explained from the real log store (chdb): rows sampled in
ClickHouse, the attribution carried by the verdict and recorded as a release event; a verdict
that was not about latency is left as it is."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import pytest

import logstore
from logstore.release_events import EventKind, events_of_release
from logstore.spool import rows_to_table
from relay.types import GateResult, Release, Verdict
from relay_testing.waiting import wait_until
from tasks.attribution import AttributionConfig, explain_canary_rejection
from tasks.canary import record

QUICK = AttributionConfig(budget_s=2.0)


def rows(slot: str, version: str, n: int, compute_extra_ms: float, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    now = time.time()
    out = []
    for i in range(n):
        candidates = int(rng.integers(10, 60))
        queue, pre = rng.gamma(2, 0.5), 0.2 + 0.01 * candidates + rng.exponential(0.1)
        compute = 0.5 + 0.02 * candidates + rng.exponential(0.2) + compute_extra_ms
        post = rng.exponential(0.05)
        out.append(
            (
                now + i * 1e-4,  # after the deploy event: inside the canary period
                f"{slot}-{seed}-{i}",
                i,
                "s",
                slot,
                version,
                "lineage",
                queue + pre + compute + post,
                queue,
                pre,
                compute,
                post,
                int(rng.integers(1, 16)),
                candidates * 52,
                200,
                "",
                candidates,
                uuid.uuid4().hex,
            )
        )
    return out


def test_a_slow_canarys_verdict_names_compute_and_is_recorded(settings: Any) -> None:
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    tag = uuid.uuid4().hex[:8]
    release = Release(f"rel-{tag}", f"canary-{tag}", "lineage")
    record(settings, release, EventKind.deploy, Verdict.passed, "canary deployed")
    client.insert_arrow(
        "inference_logs",
        rows_to_table(
            rows("baseline", f"base-{tag}", 1_500, 0.0, 1)
            + rows("canary", release.version, 1_500, 20.0, 2)
        ),
    )
    # the period ends at "now": after the last row
    wait_until(
        lambda: client.query(
            "SELECT max(ts) < now64(3) FROM inference_logs WHERE model_version = {v:String}",
            parameters={"v": release.version},
        ).result_rows[0][0],
        10,
        "the canary's last row in the past",
    )
    gate = GateResult(
        gate="canary",
        verdict=Verdict.failed,
        reason="absolute SLO: canary P95 321.0 ms > 300 ms",
        measurements={"canary_p95_ms": 321.0},
        thresholds={"max_p95_ms": 300.0},
    )
    explained = explain_canary_rejection.fn(settings, release, f"base-{tag}", gate, QUICK)
    assert explained.verdict is Verdict.failed
    assert explained.attribution is not None
    assert explained.attribution["top_cause"] == "compute_ms", explained.reason
    assert explained.reason.startswith(gate.reason + "; why: mean latency +")
    assert explained.measurements["attribution_compute_ms_share"] > 0.8
    (event,) = [e for e in events_of_release(client, release.release_id) if e.kind == "attribution"]
    assert (
        event.verdict == "attributed" and event.details["contributions"][0]["cause"] == "compute_ms"
    )


def test_a_verdict_not_about_latency_is_left_as_it_is(settings: Any) -> None:
    release = Release("rel-errors", "v-errors", "lineage")
    gate = GateResult(
        gate="canary",
        verdict=Verdict.failed,
        reason="relative to baseline: canary errors 3.00% vs baseline 0.10%",
        measurements={"latency_ratio": 1.0, "latency_ratio_low": 0.98},
        thresholds={"max_p95_ms": 300.0},
    )
    assert explain_canary_rejection.fn(settings, release, "v-base", gate, QUICK) == gate


def test_sampled_rows_carry_the_work_ahead_and_the_offered_load(settings: Any) -> None:
    from datetime import UTC, datetime

    from logstore.stage_samples import sample_stage_rows

    client = logstore.connect(settings.resolved_clickhouse_dsn)
    version = f"ahead-{uuid.uuid4().hex[:8]}"
    t0 = time.time() - 60
    table = []
    for i in range(4):  # one arrival every 10 ms, compute 1, 2, 3, 4 ms
        (row,) = rows("stable", version, 1, 0.0, 40 + i)
        table.append((t0 + i * 0.010, *row[1:10], float(i + 1), *row[11:]))
    client.insert_arrow("inference_logs", rows_to_table(table))
    start, end = datetime.fromtimestamp(t0 - 1, UTC), datetime.fromtimestamp(t0 + 1, UTC)
    sample = sample_stage_rows(client, start, end, "stable", 10, version)
    assert sample.population == 4
    frame = sample.frame.sort_values("compute_ms")
    # the mean compute of the requests that arrived before: none (its own), 1, 1.5, 2 ms
    assert list(frame["ahead_compute_ms"]) == pytest.approx([1.0, 1.0, 1.5, 2.0])
    # arrivals per second over the recent ones: 100/s once there are two
    assert list(frame["load_rps"])[1:] == pytest.approx([100.0, 100.0, 100.0], rel=0.01)

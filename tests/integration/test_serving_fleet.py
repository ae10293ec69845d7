"""Two real workers driven by the fleet client: two-phase canary deploys, sticky assignment that
agrees across workers, switches under live traffic that never mix models, injected latency, and
a load that fails on one worker moving no traffic anywhere."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from relay.types import EngineRecord, VersionManifest
from relay_testing.waiting import poll_until, wait_until
from serving.client import BinaryClient, BinaryRequest, BinaryResult, items_matrix
from serving.fleet import FleetClient
from serving.process import WorkerProcess, start_worker
from serving.schema import decode_json, model_input
from tasks.compilation import run_engine
from tests.unit.test_serving_schema import make_doc

TOKEN = "fleet-token-91c2"


@dataclass
class Versions:
    base: VersionManifest
    variant: VersionManifest  # same network, final bias moved: other scores, other lineage
    only_on_a: VersionManifest  # published after worker B's store was copied
    engines: dict[str, Path]  # version -> its fp32 engine file


def publish_variant(published_version: Any, name: str, shift: float, path: Path) -> VersionManifest:
    """A new version of the same model whose final bias is shifted (a real, different engine)."""
    model = onnx.load(published_version.workdir / "ort-fp32.onnx")
    bias = next(i for i in model.graph.initializer if i.name == "mlp.4.bias")
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + shift, bias.name))
    onnx.save(model, path)
    store = published_version.store
    blob = store.put_blob(path)
    base = published_version.manifest
    lineage = base.lineage.model_copy(update={"build": blob.sha256})
    return store.publish(
        base.model_copy(
            update={
                "version": f"{base.version}-{name}",
                "lineage": lineage,
                "lineage_id": str(lineage),
                "engines": [EngineRecord(name="ort-fp32", blob=blob)],
            }
        )
    )


@pytest.fixture(scope="module")
def setup(
    published_version: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Versions, list[WorkerProcess], FleetClient]]:
    root = tmp_path_factory.mktemp("fleet")
    variant = publish_variant(published_version, "b", 1.0, root / "variant-b.onnx")
    store_b = root / "store-b"
    shutil.copytree(published_version.store.backend.root, store_b)
    only_on_a = publish_variant(published_version, "c", -1.0, root / "variant-c.onnx")
    base = published_version.manifest
    versions = Versions(
        base,
        variant,
        only_on_a,
        {
            base.version: published_version.workdir / "ort-fp32.onnx",
            variant.version: root / "variant-b.onnx",
        },
    )
    workers = []
    try:
        for name, store_url in (
            ("a", published_version.store.backend.describe()),
            ("b", f"file://{store_b}"),
        ):
            env = {
                "RELAY_HOME": str(root / name),
                "RELAY_MODEL_STORE_URL": store_url,
                "RELAY_SERVING_PORT": "0",
                "RELAY_SERVING_BINARY_PORT": "0",
                "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
                "RELAY_SERVING_FAULT_INJECTION": "true",  # this run injects latency or rankings
                "RELAY_SERVING_STABLE_REF": base.version,
                "RELAY_CLICKHOUSE_DSN": f"chdb://{root / 'never-opened'}",
            }
            workers.append(start_worker(env, root / f"{name}.log"))
        for w in workers:
            w.wait_ready()
        with FleetClient([w.http_url for w in workers], TOKEN) as fleet:
            yield versions, workers, fleet
    finally:
        for w in workers:
            w.stop()


def expected(versions: Versions, version: str, doc: dict[str, Any]) -> np.ndarray:
    x = model_input(decode_json(json.dumps(doc).encode(), 1000).raw)
    return run_engine(versions.engines[version], x)


def docs(n: int, seed: int = 0) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        doc = make_doc(n=20, seed=seed + i)
        doc["user"]["user_id"] = seed * 100_000 + i
        for c in doc["candidates"]:
            c["item_id"] %= 2**24
        out.append(doc)
    return out


def reset(fleet: FleetClient, versions: Versions) -> None:
    assert fleet.rollback().ok
    assert fleet.load("stable", versions.base.version).ok
    assert fleet.set_injected_latency("canary", 0).ok


def test_deploy_canary_loads_verifies_and_switches_on_both_workers(setup: Any) -> None:
    versions, workers, fleet = setup
    reset(fleet, versions)
    result = fleet.deploy_canary(versions.variant.version, weight=30)
    assert result.ok, result.reason
    states = fleet.state()
    for w in states.workers:
        assert w.canary_version == versions.variant.version
        assert w.stable_version == versions.base.version
        assert w.state["canary_weight"] == 30 and w.state["ready"]
        assert w.state["slots"]["canary"]["lineage_id"] == versions.variant.lineage_id


def test_assignment_is_sticky_and_identical_on_both_workers(setup: Any) -> None:
    versions, workers, fleet = setup
    reset(fleet, versions)
    assert fleet.deploy_canary(versions.variant.version, weight=30).ok
    population = docs(120, seed=7)
    seen: dict[int, set[str]] = {}
    with httpx.Client(timeout=10) as http:
        for _ in range(2):
            for w in workers:
                for doc in population:
                    body = http.post(f"{w.http_url}/v1/predict", json=doc).json()
                    seen.setdefault(doc["user"]["user_id"], set()).add(body["slot"])
        assert all(len(slots) == 1 for slots in seen.values())  # one model per user, everywhere
        share = sum(s == {"canary"} for s in seen.values()) / len(seen)
        assert 0.15 < share < 0.45
        canary_doc = next(d for d in population if seen[d["user"]["user_id"]] == {"canary"})
        body = http.post(f"{workers[0].http_url}/v1/predict", json=canary_doc).json()
    assert body["model_version"] == versions.variant.version
    np.testing.assert_allclose(
        body["scores"], expected(versions, versions.variant.version, canary_doc), rtol=1e-5
    )


def test_switches_under_live_traffic_never_show_a_mixed_or_half_loaded_model(setup: Any) -> None:
    versions, workers, fleet = setup
    reset(fleet, versions)
    population = docs(40, seed=3)
    want = {
        v: [expected(versions, v, d) for d in population]
        for v in (versions.base.version, versions.variant.version)
    }
    lineage = {versions.base.version: versions.base.lineage_id}
    lineage[versions.variant.version] = versions.variant.lineage_id
    answers: list[tuple[int, Any]] = []
    stop = threading.Event()

    def traffic(w: WorkerProcess) -> None:
        with BinaryClient(w.binary_host, w.binary_port) as client:
            requests = [
                BinaryRequest(d["user"], d["session"], d["context"], items_matrix(d["candidates"]))
                for d in population
            ]
            while not stop.is_set():
                for i, answer in enumerate(client.predict_many(requests, window=16)):
                    answers.append((i, answer))

    threads = [threading.Thread(target=traffic, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    try:
        steps = [
            lambda: fleet.deploy_canary(versions.variant.version, weight=20),
            lambda: fleet.set_weight(70),
            fleet.promote,
            lambda: fleet.deploy_canary(versions.base.version, weight=50),
            fleet.rollback,
        ]

        def more_answers(n: int = 60) -> None:  # every step happens under traffic
            before = len(answers)
            wait_until(lambda: len(answers) >= before + n, 30, f"{n} more answers")

        for step in steps:
            more_answers()
            result = step()
            assert result.ok, result.reason
        more_answers()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(answers) > 200
    versions_seen = set()
    for i, answer in answers:
        assert isinstance(answer, BinaryResult), answer
        assert answer.lineage_id == lineage[answer.model_version]
        np.testing.assert_allclose(answer.scores, want[answer.model_version][i], rtol=1e-5)
        versions_seen.add((answer.slot, answer.model_version))
    assert ("stable", versions.variant.version) in versions_seen  # the promotion took effect
    assert ("canary", versions.variant.version) in versions_seen


def test_injected_latency_slows_only_the_chosen_slot(setup: Any) -> None:
    versions, workers, fleet = setup
    reset(fleet, versions)
    assert fleet.deploy_canary(versions.variant.version, weight=100).ok
    assert fleet.set_injected_latency("canary", 400).ok
    doc = docs(1, seed=9)[0]
    with httpx.Client(timeout=10) as http:
        started = time.perf_counter()
        slow = http.post(f"{workers[1].http_url}/v1/predict", json=doc).json()
        slow_s = time.perf_counter() - started
        assert slow["slot"] == "canary" and slow_s >= 0.4
        assert fleet.set_weight(0).ok
        started = time.perf_counter()
        fast = http.post(f"{workers[1].http_url}/v1/predict", json=doc).json()
        assert fast["slot"] == "stable" and time.perf_counter() - started < 0.4
    state = fleet.state().workers[0].state
    assert state["inject_latency_ms"] == {"stable": 0.0, "canary": 400.0, "baseline": 0.0}
    assert fleet.set_injected_latency("canary", 0).ok


def test_a_load_failing_on_one_worker_moves_no_traffic_anywhere(setup: Any) -> None:
    versions, workers, fleet = setup
    reset(fleet, versions)
    result = fleet.deploy_canary(versions.only_on_a.version, weight=40)
    assert not result.ok and result.phase == "load"
    assert result.workers[0].ok and not result.workers[1].ok
    assert result.workers[1].error == "unknown_version" and result.workers[1].status == 404
    for w in fleet.state().workers:
        assert w.canary_version is None and w.state["canary_weight"] == 0
        assert w.stable_version == versions.base.version


def test_promote_then_rollback_leaves_the_new_stable_serving(setup: Any) -> None:
    versions, workers, fleet = setup
    reset(fleet, versions)
    assert fleet.deploy_canary(versions.variant.version, weight=10).ok
    assert fleet.promote().ok
    assert fleet.rollback().ok  # nothing to roll back: a no-op everywhere
    for w in fleet.state().workers:
        assert w.stable_version == versions.variant.version and w.canary_version is None
    refused = fleet.promote()
    assert not refused.ok and refused.phase == "verify"


def test_an_unrenewed_canary_leaves_both_workers_within_its_lease_while_stable_serves_on(
    setup: Any,
) -> None:
    versions, workers, fleet = setup
    reset(fleet, versions)
    base, variant = versions.base.version, versions.variant.version
    assert fleet.deploy_canary(variant, weight=0, baseline=base).ok
    population = docs(60, seed=21)
    answers: list[tuple[float, int, str]] = []  # when, HTTP status, slot
    stop = threading.Event()

    def traffic(w: WorkerProcess) -> None:
        with httpx.Client(base_url=w.http_url, timeout=10) as http:
            while not stop.is_set():
                for doc in population:
                    response = http.post("/v1/predict", json=doc)
                    answers.append(
                        (time.monotonic(), response.status_code, response.json().get("slot", ""))
                    )

    threads = [threading.Thread(target=traffic, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    dropped: dict[str, float] = {}
    try:
        assert fleet.set_weight(40, lease_s=2).ok
        with fleet.renewing(lease_s=2, every_s=0.5) as renewals:
            time.sleep(3.0)  # longer than one lease: the renewals hold the weight
            assert {w.state["canary_weight"] for w in fleet.state().workers} == {40}
        last_renewal = time.monotonic()  # the release "dies" here: nothing renews any more
        assert len(renewals) >= 5 and all(r.ok for r in renewals)

        def all_dropped() -> bool:
            for w in fleet.state().workers:
                if w.state["canary_weight"] == 0:
                    dropped.setdefault(w.url, time.monotonic())
            return len(dropped) == len(workers)

        poll_until(all_dropped, 10, interval_s=0.02)
        if len(dropped) == len(workers):  # stable alone, under the same traffic
            settled = max(dropped.values()) + 0.2
            wait_until(lambda: sum(at > settled for at, _, _ in answers) >= 60, 30, "answers after")
    finally:
        stop.set()
        for t in threads:
            t.join()

    assert len(dropped) == 2
    for url, at in dropped.items():
        assert 1.5 < at - last_renewal <= 2.0 + 1.0, (url, at - last_renewal)
    assert answers and all(status == 200 for _, status, _ in answers)  # no failed request
    before = {slot for at, _, slot in answers if at < last_renewal}
    after = {slot for at, _, slot in answers if at > max(dropped.values()) + 0.2}
    assert before == {"stable", "canary", "baseline"} and after == {"stable"}
    for w in fleet.state().workers:  # weight 0, nothing unloaded: the release can still decide
        assert (w.stable_version, w.canary_version, w.baseline_version) == (base, variant, base)
        lease = w.state["canary_lease"]
        assert lease["lapsed"] and lease["expirations"] >= 1 and lease["seconds_left"] == 0
    late = fleet.renew(2)
    assert not late.ok and {r.error for r in late.workers} == {"lease_expired"}
    assert {w.state["canary_weight"] for w in fleet.state().workers} == {0}
    for w in workers:
        assert "lease ran out without a renewal" in w.log_text()
        assert "relay_canary_lease_expirations_total" in httpx.get(f"{w.http_url}/metrics").text

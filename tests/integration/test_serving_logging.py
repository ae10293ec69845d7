"""Request logs survive what production throws at them: a worker restart mid-traffic, a worker
SIGKILLed under load, an unreachable ClickHouse server, and a spool nobody ingests (loud, never
lossy)."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import logstore
from logstore.reading import LOG_TABLES
from logstore.spool import ingest_spool
from relay.errors import ServingError
from relay_testing.waiting import wait_until
from serving.client import BinaryClient, BinaryRequest, BinaryResult, items_matrix
from serving.process import WorkerProcess, start_worker
from tests.integration.test_serving_worker import logged
from tests.unit.test_serving_schema import make_doc


def worker_env(published_version: Any, home: Path, **extra: str) -> dict[str, str]:
    return {
        "RELAY_HOME": str(home),
        "RELAY_MODEL_STORE_URL": published_version.store.backend.describe(),
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_STABLE_REF": published_version.manifest.version,
        **extra,
    }


def logging_worker_env(
    published_version: Any, settings: Any, home: Path, flush_ms: str
) -> dict[str, str]:
    """A worker that logs into this session's ClickHouse, flushing its rows every `flush_ms`."""
    return worker_env(
        published_version,
        home,
        RELAY_CLICKHOUSE_DSN=settings.resolved_clickhouse_dsn,
        RELAY_SERVING_LOG_FLUSH_MS=flush_ms,
    )


def requests(n: int, tag: str) -> list[BinaryRequest]:
    out = []
    for i in range(n):
        doc = make_doc(n=5, seed=i)
        for c in doc["candidates"]:
            c["item_id"] %= 2**24
        out.append(
            BinaryRequest(
                doc["user"],
                doc["session"],
                doc["context"],
                items_matrix(doc["candidates"]),
                f"{tag}-{i}",
            )
        )
    return out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_restart_during_traffic_loses_no_log_row(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    # A long flush interval: at the SIGTERM the rows exist only in the worker's memory.
    env = logging_worker_env(published_version, settings, tmp_path, flush_ms="60000")
    tag = f"restart-{time.time_ns()}"
    answered: list[str] = []
    first = start_worker(env, tmp_path / "first.log")
    first.wait_ready()
    with BinaryClient(first.binary_host, first.binary_port) as client:
        for answer in client.predict_many(requests(300, tag), window=64):
            assert isinstance(answer, BinaryResult)
            answered.append(answer.request_id)

    # more traffic in flight while the worker is told to stop
    def keep_sending() -> None:
        doc = make_doc(n=5, seed=1)
        with httpx.Client(base_url=first.http_url, timeout=10) as http:
            for i in range(10_000):
                doc["request_id"] = f"{tag}-late-{i}"
                try:
                    response = http.post("/v1/predict", json=doc)
                except httpx.HTTPError:
                    return  # the worker has stopped listening
                answered.append(response.json()["request_id"])

    sender = threading.Thread(target=keep_sending)
    sender.start()
    # stop while the sender's requests are in flight: once some of them have been answered
    wait_until(lambda: sum("-late-" in rid for rid in answered) >= 20, 30, "late requests answered")
    assert first.stop() == 0
    sender.join()

    second = start_worker(env, tmp_path / "second.log")
    second.wait_ready()
    with BinaryClient(second.binary_host, second.binary_port) as client:
        for answer in client.predict_many(requests(100, tag + "-after"), window=64):
            assert isinstance(answer, BinaryResult)
            answered.append(answer.request_id)
    assert second.stop() == 0

    rows = logged(settings, tmp_path / "spool", answered, timeout_s=5)
    assert len(answered) > 400
    missing = [rid for rid in answered if rid not in rows]
    assert not missing, f"{len(missing)} answered requests have no log row: {missing[:5]}"
    assert all(len(r) == 1 for r in rows.values())
    assert "request log flushed" in first.log_text()


def load(worker: WorkerProcess, tag: str, answered: list[str], stop: threading.Event) -> None:
    """Requests until the worker dies or `stop`; the ids of those answered with a 200 in `answered`."""

    def over_http(n: int) -> None:
        doc = make_doc(n=5, seed=n)
        with httpx.Client(base_url=worker.http_url, timeout=10) as http:
            for i in range(1_000_000):
                if stop.is_set():
                    return
                doc["request_id"] = f"{tag}-h{n}-{i}"
                try:
                    response = http.post("/v1/predict", json=doc)
                except httpx.HTTPError:
                    return  # killed
                if response.status_code == 200:
                    answered.append(doc["request_id"])

    def over_binary() -> None:
        try:
            with BinaryClient(worker.binary_host, worker.binary_port) as client:
                for chunk in range(1_000_000):
                    if stop.is_set():
                        return
                    for answer in client.predict_many(requests(8, f"{tag}-b{chunk}"), window=8):
                        if isinstance(answer, BinaryResult):
                            answered.append(answer.request_id)
        except (OSError, ServingError):
            return  # killed: a chunk cut short is not counted as answered

    threads = [threading.Thread(target=over_http, args=(n,)) for n in range(3)]
    threads.append(threading.Thread(target=over_binary))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.slow
def test_a_worker_killed_under_load_has_a_row_for_every_answered_request(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    env = worker_env(
        published_version, tmp_path, RELAY_CLICKHOUSE_DSN=settings.resolved_clickhouse_dsn
    )
    answered: list[str] = []
    rng = random.Random(7)
    logs = []
    for kill in range(3):  # each restart recovers the file of the worker killed before it
        worker = start_worker(env, tmp_path / f"worker{kill}.log")
        worker.wait_ready()
        stop = threading.Event()
        sender = threading.Thread(
            target=load, args=(worker, f"killed-{kill}-{time.time_ns()}", answered, stop)
        )
        before = len(answered)
        sender.start()
        wait_until(
            lambda before=before: len(answered) >= before + 120, 30, "answers before the kill"
        )
        # not a wait: a random phase of the 500 ms flush interval, so the kills land anywhere in it
        time.sleep(rng.uniform(0.0, 0.5))
        os.kill(worker.process.pid, signal.SIGKILL)
        sender.join(timeout=30)
        stop.set()
        worker.stop()
        logs.append(worker.log_text())
    # The last one's file is recovered by the reader, which ingests (as the release does).
    rows = logged(settings, tmp_path / "spool", answered, timeout_s=10)
    assert len(answered) > 300
    missing = [rid for rid in answered if rid not in rows]
    assert not missing, (
        f"{len(missing)} of {len(answered)} answered requests have no row: {missing[:5]}"
    )
    twice = [rid for rid, r in rows.items() if len(r) != 1]
    assert not twice, f"{len(twice)} rows logged twice: {twice[:5]}"
    # Each restart recovers rows that lived only in the killed worker's write-ahead files. Counted
    # over both tables: right after the request log rotates and its INSERT finishes, and before
    # the next answer, its fresh file is empty while the impressions' file still holds rows. Seen
    # in 2 of 35 runs under CPU hogs (0 request rows with 1,405 and 2,140 impression rows
    # recovered, and no row lost); per table, that legitimate moment failed this test.
    lines = re.compile(r"write-ahead file\(s\) of stopped workers in ([^:]+): (\d+) rows")
    restarts = [found for log in logs if (found := lines.findall(log))]
    recovered = [sum(int(n) for _, n in found) for found in restarts]
    request_log = [
        [where for where, _ in found].count(str(tmp_path / "spool")) for found in restarts
    ]
    assert request_log == [1, 1] and all(n > 0 for n in recovered), (
        f"recovered rows per restart {recovered}; the workers' recovery lines: "
        f"{[line for log in logs for line in log.splitlines() if 'write-ahead' in line]}"
    )
    left = sorted(p.name for p in (tmp_path / "spool").glob("*.wal*"))
    assert not left, f"write-ahead files left after the reader's recovery: {left}"
    # nor a killed writer's half-written file (an empty one, opened just before a kill and never
    # locked, cannot be told from a live writer's and is left: docs/serving.md)
    debris = sorted(p.name for p in (tmp_path / "spool").rglob(".tmp-*") if p.stat().st_size > 0)
    assert not debris, f"temporary files left after the reader's recovery: {debris}"


def test_a_spool_folder_that_cannot_be_written_takes_the_worker_out_and_keeps_its_rows(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    env = logging_worker_env(published_version, settings, tmp_path, flush_ms="100")
    worker = start_worker(env, tmp_path / "worker.log")
    spool, aside = tmp_path / "spool", tmp_path / "spool-aside"
    tag = f"unwritable-{time.time_ns()}"
    sent = []
    try:
        worker.wait_ready()
        with httpx.Client(base_url=worker.http_url, timeout=10) as http:
            spool.rename(aside)
            spool.write_text("not a folder")  # nothing can be created in it now
            deadline = time.monotonic() + 10
            for i in range(10_000):
                doc = make_doc(n=2, seed=i)
                doc["request_id"] = f"{tag}-{i}"
                assert http.post("/v1/predict", json=doc).status_code == 200  # still answering
                sent.append(doc["request_id"])
                if http.get("/readyz").status_code == 503 or time.monotonic() > deadline:
                    break
            not_ready = http.get("/readyz")
            assert not_ready.status_code == 503 and "write-ahead" in not_ready.json()["reason"]
            assert "relay_log_wal_ok 0.0" in http.get("/metrics").text
            for i in range(20):  # a load balancer takes a moment: these rows wait in memory
                doc = make_doc(n=2, seed=i)
                doc["request_id"] = f"{tag}-late-{i}"
                assert http.post("/v1/predict", json=doc).status_code == 200
                sent.append(doc["request_id"])
            spool.unlink()
            aside.rename(spool)
            # writable again: back in rotation
            wait_until(lambda: http.get("/readyz").status_code == 200, 10, "worker ready again")
    finally:
        worker.stop()
    rows = logged(settings, spool, sent, timeout_s=10)
    assert len(sent) > 20 and sorted(rows) == sorted(sent)
    assert all(len(r) == 1 for r in rows.values())
    assert "cannot write the request-log write-ahead file" in worker.log_text()


@pytest.fixture
def stranded(published_version: Any, tmp_path: Path) -> Any:
    """A worker whose ClickHouse server is down and whose spool cap is tiny."""
    env = worker_env(
        published_version,
        tmp_path,
        RELAY_CLICKHOUSE_DSN=f"http://default:s3cret@127.0.0.1:{closed_port()}/relay",
        RELAY_SERVING_LOG_FLUSH_MS="100",
        RELAY_SERVING_SPOOL_MAX_BYTES="2000",
    )
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


def test_clickhouse_down_spools_every_row_and_a_full_spool_is_loud_but_lossless(
    stranded: WorkerProcess, settings: Any, tmp_path: Path
) -> None:
    tag = f"down-{time.time_ns()}"
    with BinaryClient(stranded.binary_host, stranded.binary_port) as client:
        answers = client.predict_many(requests(200, tag), window=32)
    assert all(isinstance(a, BinaryResult) for a in answers)
    with httpx.Client(base_url=stranded.http_url, timeout=10) as http:
        not_ready = wait_until(
            lambda: (r := http.get("/readyz")).status_code != 200 and r, 10, "worker not ready"
        )
        assert not_ready.status_code == 503 and "spool" in not_ready.json()["reason"]

        # Readiness falls with the first spool over its cap. Each table's writer crosses on its
        # own rotation, in either order (a fresh clone once read the metrics between the two):
        # wait for both crossings, the request log's (relay_spool_over_cap) and the impressions'.
        def over_cap_metrics() -> str:
            text = http.get("/metrics").text
            crossed = "relay_spool_over_cap 1.0" in text and (
                'relay_spool_table_over_cap{table="impressions"} 1.0' in text
            )
            return text if crossed else ""

        metrics = wait_until(over_cap_metrics, 10, "both tables' spools over their cap")
        assert 'relay_log_rows_total{sink="spool"}' in metrics
        # every spool that is over says so by table: an operator sees why it is not ready
        assert 'relay_spool_table_over_cap{table="inference_logs"} 1.0' in metrics
        assert 'relay_spool_table_over_cap{table="impressions"} 1.0' in metrics
        # still answering: the cap takes the worker out of rotation, it never drops rows
        assert http.post("/v1/predict", json=make_doc(n=2)).status_code == 200

        rows = logged(settings, tmp_path / "spool", [f"{tag}-{i}" for i in range(200)])
        assert len(rows) == 200 and all(len(r) == 1 for r in rows.values())
        # Whoever owns the log store keeps ingesting; the worker sees the spool shrink.
        clickhouse = logstore.connect(settings.resolved_clickhouse_dsn)

        def ingested_and_ready() -> bool:
            for table in LOG_TABLES:  # request rows, and the impressions their answers wrote
                ingest_spool(clickhouse, table.spool_dir(tmp_path / "spool"), table)
            return http.get("/readyz").status_code == 200

        wait_until(ingested_and_ready, 10, "worker back under the spool cap", interval_s=0.2)
    log = stranded.log_text()
    assert "ClickHouse unreachable, spooling request logs" in log
    assert "over its cap" in log
    assert "s3cret" not in log

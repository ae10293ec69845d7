"""The worker's log path in process: a scored batch's impressions are written ahead before any of
its answers is delivered, with the ranks the shopper saw; a writer that falls behind turns new
requests away, counted, and takes them again once it has caught up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from logstore.log_tables import FEEDBACK, IMPRESSIONS
from logstore.spool import (
    INFERENCE_LOGS,
    RequestLogWriter,
    SpoolWriter,
    decode_table,
    read_segment,
)
from relay.settings import Settings
from serving.batching import Batcher
from serving.feedback import FeedbackLog
from serving.metrics import ServingMetrics
from serving.routing import STABLE, RoutingTable
from serving.schema import decode_json
from serving.worker import Exchange, Served, Worker
from tests.unit.test_serving_batching import RecordingEngine, loaded
from tests.unit.test_serving_schema import make_doc


def writer(root: Path, table: Any) -> RequestLogWriter:
    spool = SpoolWriter(table.spool_dir(root), 1 << 30, "w", table)
    return RequestLogWriter(spool, connect_server=None, flush_s=3600, batch_rows=10_000)


def worker_on(root: Path, **settings: Any) -> Worker:
    feedback = FeedbackLog(writer(root, IMPRESSIONS), writer(root, FEEDBACK), 1.0, "w")
    return Worker(
        Settings(otel_tracing=False, **settings),
        cast(Any, None),
        ServingMetrics(),
        writer(root, INFERENCE_LOGS),
        feedback_log=feedback,
    )


def serve_from(worker: Worker) -> None:
    """A stable slot whose engine scores each row with its sum, batched as the worker does."""
    batcher = Batcher(
        loaded(RecordingEngine()), max_rows=1024, max_delay_s=0.005, finish=worker._finish_batch
    )
    worker.table = RoutingTable(stable=Served(batcher.model, batcher))


def impressions_on_disk(root: Path) -> pa.Table:
    """What a recoverer would read from the impressions write-ahead files right now."""
    parts = [
        decode_table(p.read_bytes(), IMPRESSIONS)[0]
        for p in sorted(IMPRESSIONS.spool_dir(root).glob("*.wal"))
    ]
    return pa.concat_tables(parts) if parts else IMPRESSIONS.schema.empty_table()


async def predict(worker: Worker, docs: list[dict[str, Any]], on_answer: Any = None) -> list[Any]:
    loop = asyncio.get_running_loop()
    answers: list[asyncio.Future[Exchange]] = []
    for doc in docs:
        answered: asyncio.Future[Exchange] = loop.create_future()

        def done(ex: Exchange, answered: asyncio.Future[Exchange] = answered) -> None:
            if on_answer is not None:
                on_answer(ex)
            answered.set_result(ex)

        worker.submit(worker.exchange("http"), decode_json(orjson.dumps(doc), 100), done)
        answers.append(answered)
    return list(await asyncio.gather(*answers))


def test_a_batchs_impressions_are_on_disk_before_its_answers_with_the_ranks_served(
    tmp_path: Path,
) -> None:
    docs = [make_doc(n=n, seed=n) for n in (4, 3, 5)]
    seen_at_answer: list[int] = []

    async def scenario() -> list[Exchange]:
        worker = worker_on(tmp_path)
        serve_from(worker)
        worker._swap(worker.table.with_ranking(STABLE, "reversed"))
        answered = await predict(
            worker, docs, lambda ex: seen_at_answer.append(impressions_on_disk(tmp_path).num_rows)
        )
        await worker.close()
        return answered

    answered = asyncio.run(scenario())
    assert all(ex.status == 200 for ex in answered)
    assert seen_at_answer == [12, 12, 12]  # one batch: all its rows before the first answer
    (segment,) = IMPRESSIONS.spool_dir(tmp_path).glob("*.arrow")
    logged = read_segment(segment, IMPRESSIONS)
    for ex in answered:
        mine = logged.filter(pc.equal(logged.column("request_id"), ex.request_id))
        served = np.asarray(ex.scores)
        # reversed: the best-scored candidate is shown last, and the log says where it was shown
        expected = np.empty(len(served), dtype=np.int64)
        expected[np.argsort(-served, kind="stable")] = np.arange(1, len(served) + 1)
        assert mine.column("rank").to_pylist() == expected.tolist()
        assert mine.column("score").to_pylist() == served.astype(np.float32).tolist()


def test_a_writer_behind_its_limit_turns_requests_away_counted_until_it_catches_up(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        worker = worker_on(tmp_path, serving_log_max_pending_rows=10)
        serve_from(worker)
        first = await predict(worker, [make_doc(n=6, seed=1), make_doc(n=6, seed=2)])
        assert [ex.status for ex in first] == [200, 200]
        for ex in first:
            worker.record(ex)
        assert worker.feedback_log is not None
        assert worker.feedback_log.impressions.pending == 12  # not yet written out: over 10
        (refused,) = await predict(worker, [make_doc(n=3, seed=3)])
        assert (refused.status, refused.error_code) == (503, "log_backpressure")
        assert "impressions log has 12 rows not yet written out" in refused.detail
        worker.record(refused)  # its request row is still logged
        text = worker.metrics.render().decode()
        assert "relay_log_backpressure_rejections_total 1.0" in text
        assert 'relay_log_pending_rows{table="impressions"} 12.0' in text
        worker.feedback_log.impressions.flush()  # the writer catches up
        (again,) = await predict(worker, [make_doc(n=3, seed=4)])
        assert again.status == 200
        worker.record(again)
        await worker.close()

    asyncio.run(scenario())
    segments = sorted(INFERENCE_LOGS.spool_dir(tmp_path).glob("*.arrow"))
    logged = pa.concat_tables([read_segment(p) for p in segments])
    assert sorted(logged.column("status").to_pylist()) == [200, 200, 200, 503]

"""Dynamic batching: coalescing, size and delay limits, slicing, failure and draining."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from relay.types import BlobRef, EngineRecord
from serving.batching import Batcher, BatchTiming
from serving.engine import LoadedModel, synthetic_rows
from serving.schema import RequestRejected, model_input


class RecordingEngine:
    """Scores each row with its sum; remembers every batch; can be slowed or made to fail."""

    name = "recording"

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.delay_s = delay_s
        self.fail = fail
        self.closed = False
        self.threads: set[str] = set()

    def run(self, x: np.ndarray) -> np.ndarray:
        self.threads.add(threading.current_thread().name)
        self.batches.append(len(x))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("device lost")
        return x.sum(axis=1)

    def close(self) -> None:
        self.closed = True


def loaded(engine: RecordingEngine) -> LoadedModel:
    record = EngineRecord(name="recording", blob=BlobRef(sha256="0" * 64, size=0))
    return LoadedModel("v1", "lineage", engine, record, "v1", 0.0)


async def submit_all(
    batcher: Batcher, blocks: list[np.ndarray]
) -> list[tuple[np.ndarray | None, BatchTiming | None, RequestRejected | None]]:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in blocks]
    for block, fut in zip(blocks, futures, strict=True):
        batcher.submit(block, lambda s, t, e, fut=fut: fut.set_result((s, t, e)))
    return list(await asyncio.gather(*futures))


def blocks_of(sizes: list[int]) -> list[np.ndarray]:
    return [synthetic_rows(n, seed=i) for i, n in enumerate(sizes)]


def test_concurrent_requests_share_one_engine_call_and_get_their_own_rows() -> None:
    engine = RecordingEngine()

    async def scenario() -> list:
        batcher = Batcher(loaded(engine), max_rows=1000, max_delay_s=0.05)
        return await submit_all(batcher, blocks_of([20, 5, 20, 1]))

    results = asyncio.run(scenario())
    assert engine.batches == [46]
    for (scores, timing, error), block in zip(results, blocks_of([20, 5, 20, 1]), strict=True):
        assert error is None and timing is not None
        assert timing.requests == 4 and timing.rows == 46 and timing.compute_s >= 0
        np.testing.assert_allclose(scores, model_input(block).sum(axis=1), rtol=1e-6)


def test_a_batch_never_exceeds_max_rows_unless_one_request_does() -> None:
    engine = RecordingEngine(delay_s=0.01)

    async def scenario() -> None:
        batcher = Batcher(loaded(engine), max_rows=50, max_delay_s=0.01)
        await submit_all(batcher, blocks_of([20, 20, 20, 20, 80, 5]))

    asyncio.run(scenario())
    assert sum(engine.batches) == 165
    assert all(b <= 50 for b in engine.batches if b != 80) and 80 in engine.batches


def test_a_lone_request_waits_about_the_batching_delay() -> None:
    engine = RecordingEngine()

    async def scenario() -> float:
        batcher = Batcher(loaded(engine), max_rows=1000, max_delay_s=0.05)
        started = time.perf_counter()
        await submit_all(batcher, blocks_of([3]))
        return time.perf_counter() - started

    waited = asyncio.run(scenario())
    assert 0.045 <= waited < 1.0
    assert engine.batches == [3]


def test_zero_delay_dispatches_at_once_and_requests_arriving_during_a_run_form_the_next_batch() -> (
    None
):
    engine = RecordingEngine(delay_s=0.05)

    async def scenario() -> None:
        batcher = Batcher(loaded(engine), max_rows=1000, max_delay_s=0.0)
        first = asyncio.ensure_future(submit_all(batcher, blocks_of([1])))
        deadline = time.monotonic() + 10
        while not engine.batches and time.monotonic() < deadline:  # the first batch is running now
            await asyncio.sleep(0.001)
        assert engine.batches == [1]
        rest = asyncio.ensure_future(submit_all(batcher, blocks_of([2, 3, 4])))
        await asyncio.gather(first, rest)

    asyncio.run(scenario())
    assert engine.batches == [1, 9]


def test_engine_failure_reaches_every_request_of_the_batch_as_engine_error() -> None:
    engine = RecordingEngine(fail=True)

    async def scenario() -> list:
        batcher = Batcher(loaded(engine), max_rows=1000, max_delay_s=0.01)
        return await submit_all(batcher, blocks_of([2, 2]))

    for scores, _, error in asyncio.run(scenario()):
        assert scores is None and error is not None
        assert (
            error.code == "engine_error" and error.status == 500 and "device lost" in error.detail
        )


def test_close_finishes_queued_requests_then_frees_the_engine() -> None:
    engine = RecordingEngine(delay_s=0.02)

    async def scenario() -> list:
        batcher = Batcher(loaded(engine), max_rows=10, max_delay_s=0.001)
        pending = asyncio.ensure_future(submit_all(batcher, blocks_of([10, 10, 10])))
        await asyncio.sleep(0)
        await batcher.close()
        assert engine.closed
        late = await submit_all(batcher, blocks_of([1]))
        return [*(await pending), *late]

    results = asyncio.run(scenario())
    assert [e is None for _, _, e in results] == [True, True, True, False]
    assert results[-1][2] is not None and results[-1][2].code == "not_ready"
    assert engine.threads and all(t.startswith("engine-") for t in engine.threads)


@pytest.mark.parametrize("max_rows", [1, 7])
def test_every_row_is_scored_exactly_once_under_many_small_requests(max_rows: int) -> None:
    engine = RecordingEngine()
    sizes = [1, 2, 3, 1, 5, 1, 1, 2] * 5

    async def scenario() -> list:
        batcher = Batcher(loaded(engine), max_rows=max_rows, max_delay_s=0.001)
        return await submit_all(batcher, blocks_of(sizes))

    results = asyncio.run(scenario())
    assert sum(engine.batches) == sum(sizes)
    assert [len(s) for s, _, _ in results] == sizes

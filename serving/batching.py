"""Dynamic batching: requests from every client share one engine call.

When the engine is idle, a batch closes once it holds `max_rows` candidate rows or its oldest
request has waited `max_delay_s`. One batch runs at a time on the model's own thread (ONNX
Runtime releases the GIL, so the event loop keeps parsing meanwhile); whatever arrives during a
run forms the next batch, dispatched as soon as the run ends. So batches grow with load, and no
request waits for company longer than the delay.

A batcher's `finish` hook sees each scored batch whole on the engine thread, before any of its
answers is delivered: the worker logs the batch's impressions there, as one columnar record,
so the event loop only ever hands references over and an answer implies its rows are written.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.engine import LoadedModel
from serving.schema import RequestRejected, model_input


@dataclass(slots=True)
class BatchTiming:
    """One engine call, shared by every request in it."""

    requests: int
    rows: int
    started: float  # perf_counter when the batch was handed to the engine thread
    preprocess_s: float = 0.0  # feature pipeline over the whole batch
    compute_s: float = 0.0  # the engine call


@dataclass(frozen=True, slots=True)
class EngineFault:
    """Extra time spent inside a batch's stage on the engine thread, as a real cause would take it.

    A slower model (`compute`) or feature pipeline (`preprocess`) makes the engine thread busy
    for longer, so the stage's own timer measures it and every request queued behind the batch
    waits longer too: unlike a hold after scoring, the cost is not booked anywhere by hand.
    `factor` 3 makes the stage take three times as long (it grows with the batch's rows, as a
    heavier model's does); `ms` adds a fixed cost per batch.
    """

    stage: str  # "preprocess" or "compute"
    ms: float = 0.0
    factor: float = 1.0

    def spend(self, stage: str, elapsed_s: float) -> None:
        """Hold the engine thread for this stage's extra time (the thread, like ORT, not the GIL)."""
        if stage == self.stage:
            extra = self.ms / 1000 + (self.factor - 1.0) * elapsed_s
            if extra > 0:
                time.sleep(extra)


# (this request's scores, its batch) on success, or (None, None, the reason) on failure.
Delivery = Callable[[np.ndarray | None, BatchTiming | None, RequestRejected | None], None]
# On the engine thread: (each request's tag, its rows, the batch's raw rows, their scores) ->
# the scores to deliver. It may change them (a slot's ranking) and must not keep `raw` mutable.
Finish = Callable[[list[Any], list[int], np.ndarray, np.ndarray], np.ndarray]
_Item = tuple[np.ndarray, Delivery, Any]


class Batcher:
    """Queues requests for one loaded model and runs them in batches on its own thread."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        max_rows: int,
        max_delay_s: float,
        on_batch: Callable[[BatchTiming], None] | None = None,
        finish: Finish | None = None,
    ) -> None:
        self.model = model
        self.max_rows = max_rows
        self.max_delay_s = max_delay_s
        self._on_batch = on_batch
        self._finish = finish
        self.fault: EngineFault | None = None  # set by the worker from its routing table
        self._loop = asyncio.get_running_loop()
        self._queue: deque[_Item] = deque()
        self._queued_rows = 0
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"engine-{model.version[:12]}"
        )

    @property
    def depth(self) -> int:
        """Requests waiting for an engine call."""
        return len(self._queue)

    def submit(self, raw: np.ndarray, deliver: Delivery, tag: Any = None) -> None:
        """Queue one request's raw rows; `deliver` is called on the event loop with its scores.

        `tag` is handed to the `finish` hook with the request's rows.
        """
        if self._closing:
            deliver(None, None, RequestRejected("not_ready", "model is unloading", 503))
            return
        self._queue.append((raw, deliver, tag))
        self._queued_rows += raw.shape[0]
        self._idle.clear()
        if self._busy:
            return  # the running batch's completion dispatches what gathers meanwhile
        if self._queued_rows >= self.max_rows or self.max_delay_s <= 0:
            self._dispatch()
        elif self._timer is None:
            self._timer = self._loop.call_later(self.max_delay_s, self._on_timer)

    async def close(self) -> None:
        """Finish every queued and running request, then free the engine."""
        self._closing = True
        await self._idle.wait()
        if self._timer is not None:
            self._timer.cancel()
        self._executor.shutdown(wait=True)
        self.model.engine.close()

    def _on_timer(self) -> None:
        self._timer = None
        if not self._busy and self._queue:
            self._dispatch()

    def _dispatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        taken: list[_Item] = []
        rows = 0
        while self._queue and (not taken or rows + self._queue[0][0].shape[0] <= self.max_rows):
            item = self._queue.popleft()
            taken.append(item)
            rows += item[0].shape[0]
        self._queued_rows -= rows
        self._busy = True
        timing = BatchTiming(requests=len(taken), rows=rows, started=time.perf_counter())
        future = self._loop.run_in_executor(self._executor, self._compute, taken, timing)
        future.add_done_callback(lambda f: self._complete(f, taken, timing))

    def _compute(self, taken: list[_Item], timing: BatchTiming) -> np.ndarray:
        # Runs on the engine thread.
        fault = self.fault  # one read: a batch sees one setting
        t0 = time.perf_counter()
        raw = taken[0][0] if len(taken) == 1 else np.concatenate([t[0] for t in taken])
        x = model_input(raw)
        if fault is not None:
            fault.spend("preprocess", time.perf_counter() - t0)
        t1 = time.perf_counter()
        scores = self.model.engine.run(x)
        if fault is not None:
            fault.spend("compute", time.perf_counter() - t1)
        timing.preprocess_s = t1 - t0
        timing.compute_s = time.perf_counter() - t1
        if self._finish is not None:
            scores = self._finish(
                [t[2] for t in taken], [t[0].shape[0] for t in taken], raw, scores
            )
        return scores

    def _complete(
        self,
        future: asyncio.Future[np.ndarray],
        taken: list[_Item],
        timing: BatchTiming,
    ) -> None:
        self._busy = False
        error = future.exception()
        if error is not None:
            failure = RequestRejected(
                "engine_error", f"{self.model.engine.name} failed: {error}", 500
            )
            for _, deliver, _ in taken:
                deliver(None, None, failure)
        else:
            scores = future.result()
            if self._on_batch is not None:
                self._on_batch(timing)
            offset = 0
            for raw, deliver, _ in taken:
                n = raw.shape[0]
                deliver(scores[offset : offset + n], timing, None)
                offset += n
        self._schedule_next()

    def _schedule_next(self) -> None:
        # What arrived during the run has already waited for the engine: run it now rather than
        # idle the engine for the rest of a batching delay.
        if self._queue:
            self._dispatch()
        else:
            self._idle.set()

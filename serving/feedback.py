"""What users did with what was served: impressions written per answer, feedback accepted per POST.

Every scored predict request becomes one `impressions` row per candidate (sampled by request
at RELAY_SERVING_IMPRESSION_SAMPLE_RATE, so a request's candidates are logged all or none):
the 27 features as the model saw them, its score and the rank that score gave the item, which
is where the shopper sees it. An engine batch's impressions are written as one columnar record
(`impression_batch`), on the engine's thread, before the batch's answers go out; the writer
turns records into segments off that path. `POST /v1/feedback` takes a shopper's clicks and orders on one
request's items:

    {"request_id": "...", "events": [{"item_id": 5000123, "event": "click"},
                                     {"item_id": 5000123, "event": "order", "order_value": 42.5}]}

Both go through the request log's durable path (logstore.spool: a write-ahead file before the
answer, then segments), so an answered request's impressions and an accepted feedback event
survive a worker restart and reach ClickHouse once. A worker cannot know whether another worker
served a request id, so feedback for an id no impression has is kept, and counted as unmatched
by the join (logstore.feedback).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from logstore.log_tables import FEEDBACK_EVENTS, impression_record, record_requests
from logstore.spool import RequestLogWriter
from serving.routing import LOAD_TEST
from serving.schema import MAX_ID_CHARS, RAW_ORDER, RequestRejected, json_object

_ITEM_ID_LIMIT = 2**64


@dataclass(frozen=True)
class FeedbackEvent:
    """One click or order on one item of a served request."""

    item_id: int
    event: str
    order_value: float


@dataclass(frozen=True)
class FeedbackBatch:
    """A decoded, checked feedback body: one request's events."""

    request_id: str
    events: tuple[FeedbackEvent, ...]


def decode_feedback(body: bytes, max_events: int) -> FeedbackBatch:
    """Parse and check a feedback body. Raises RequestRejected naming the field at fault."""
    doc = json_object(body)
    unknown = sorted(set(doc) - {"request_id", "events"})
    if unknown:
        raise RequestRejected("unknown_field", f"unexpected fields: {', '.join(unknown)}")
    request_id = doc.get("request_id")
    if request_id is None:
        raise RequestRejected("missing_field", "'request_id' is missing: feedback is keyed by it")
    if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_ID_CHARS:
        raise RequestRejected(
            "wrong_type", f"'request_id' must be a non-empty string of at most {MAX_ID_CHARS} chars"
        )
    events = doc.get("events")
    if not isinstance(events, list) or not events:
        raise RequestRejected("missing_field", "'events' must be a non-empty list")
    if len(events) > max_events:
        raise RequestRejected(
            "too_many_events", f"{len(events)} events; at most {max_events} per body"
        )
    return FeedbackBatch(request_id, tuple(_event(i, e) for i, e in enumerate(events)))


def _event(i: int, e: Any) -> FeedbackEvent:
    where = f"events[{i}]"
    if not isinstance(e, dict):
        raise RequestRejected("wrong_type", f"{where} must be an object")
    unknown = sorted(set(e) - {"item_id", "event", "order_value"})
    if unknown:
        raise RequestRejected("unknown_field", f"{where}: unexpected fields {', '.join(unknown)}")
    item_id = e.get("item_id")
    if type(item_id) is not int or not 0 <= item_id < _ITEM_ID_LIMIT:
        raise RequestRejected("wrong_type", f"{where}.item_id must be a whole number in [0, 2**64)")
    kind = e.get("event")
    if kind not in FEEDBACK_EVENTS:
        raise RequestRejected(
            "unknown_event",
            f"{where}.event is {kind!r}; known events: {', '.join(FEEDBACK_EVENTS)}",
        )
    value = e.get("order_value", 0.0)
    if type(value) not in (int, float) or not math.isfinite(value):
        raise RequestRejected("wrong_type", f"{where}.order_value must be a finite number")
    if value < 0:
        raise RequestRejected(
            "out_of_range", f"{where}.order_value is {value}: it cannot be negative"
        )
    if kind == "click" and value != 0:
        raise RequestRejected("out_of_range", f"{where}: a click carries no order_value")
    return FeedbackEvent(item_id, kind, float(value))


def sampled(request_id: str, rate: float) -> bool:
    """Whether a request's impressions are logged: a hash of its id, so the choice is stable."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < rate * 2**64


class Impressed(Protocol):
    """What a scored request's impressions need from it (serving.worker.Exchange has it)."""

    ts: float
    request_id: str
    slot: str
    version: str
    lineage_id: str
    session_id: str


IMPRESSION_RECORD = impression_record(RAW_ORDER)


def impression_batch(
    requests: Sequence[Impressed], sizes: Sequence[int], raw: np.ndarray, scores: np.ndarray
) -> pa.RecordBatch:
    """One engine batch's impressions as one write-ahead record (IMPRESSION_RECORD).

    `raw` holds the requests' rows one request after the other (`sizes` rows each, whole
    numbers) and `scores` their served scores. Only what must survive the answer is built
    here, on the engine thread: the two arrays wrapped as they are and the per-request values
    as JSON; ranks and dictionaries are the writer's (`logstore.log_tables.journal_from_records`).
    """
    counts = [int(n) for n in sizes]
    if len(counts) != len(requests) or sum(counts) != len(scores) or len(scores) != len(raw):
        # Here, where one batch fails, never in the writer, where it would hold up every batch.
        raise ValueError(
            f"{len(requests)} requests of {sum(counts)} candidates in all, against "
            f"{len(scores)} scores and {len(raw)} feature rows"
        )
    values = [(r.ts, r.request_id, r.slot, r.version, r.lineage_id, r.session_id) for r in requests]
    features = np.ascontiguousarray(raw, dtype=np.float64).reshape(-1)
    arrays = [
        pa.array(np.asarray(scores, dtype=np.float32)),
        pa.FixedSizeListArray.from_arrays(pa.array(features), len(RAW_ORDER)),
    ]
    schema = IMPRESSION_RECORD.with_metadata(record_requests(counts, values))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class FeedbackLog:
    """A worker's two extra durable logs: impressions (per answer) and feedback (per POST)."""

    def __init__(
        self,
        impressions: RequestLogWriter,
        feedback: RequestLogWriter,
        sample_rate: float,
        id_prefix: str,
    ) -> None:
        self.impressions = impressions
        self.feedback = feedback
        self.sample_rate = sample_rate
        self._prefix = id_prefix
        self._ids = itertools.count(1)
        self.feedback_events = 0

    @property
    def writers(self) -> tuple[RequestLogWriter, RequestLogWriter]:
        return (self.impressions, self.feedback)

    def write_impressions(
        self,
        requests: Sequence[Impressed],
        sizes: Sequence[int],
        raw: np.ndarray,
        scores: np.ndarray,
    ) -> int:
        """Write a scored batch's impressions ahead as one record; the rows written.

        Of requests that are sampled, not a load test's, and whose scores are all finite (the others are answered
        with an error, so nothing was shown). Called on the engine thread, before any of the
        batch's answers is delivered.
        """
        counts = np.asarray(sizes, dtype=np.int64)
        finite = np.isfinite(scores)
        whole = np.logical_and.reduceat(finite, np.cumsum(counts) - counts)  # no empty request
        keep = [  # a load test's answers are shown to nobody
            bool(ok) and r.slot != LOAD_TEST and sampled(r.request_id, self.sample_rate)
            for r, ok in zip(requests, whole, strict=True)
        ]
        if not any(keep):
            return 0
        if not all(keep):
            rows = np.repeat(keep, counts)
            requests = [r for r, k in zip(requests, keep, strict=True) if k]
            counts, raw, scores = counts[keep], raw[rows], scores[rows]
        batch = impression_batch(requests, counts.tolist(), raw, scores)
        self.impressions.append_columns(batch)
        return batch.num_rows

    def write_feedback(self, batch: FeedbackBatch) -> list[str]:
        """Write a feedback batch ahead, before it is acknowledged; the ids given to its rows."""
        now = time.time()
        ids = []
        for e in batch.events:
            feedback_id = f"{self._prefix}-f{next(self._ids):x}"
            self.feedback.append(
                (now, feedback_id, batch.request_id, e.item_id, e.event, e.order_value)
            )
            ids.append(feedback_id)
        self.feedback_events += len(ids)
        return ids

    def problem(self) -> str | None:
        """Why these logs cannot keep rows durably right now, or None."""
        for writer in self.writers:
            name = writer.spool.table.name
            if writer.spool.over_cap:
                return f"{name} spool is over its cap: ingest it"
            if writer.wal_error is not None:
                return f"cannot write {name} rows ahead, keeping them in memory: {writer.wal_error}"
        return None

    def start(self) -> None:
        for writer in self.writers:
            writer.start()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()

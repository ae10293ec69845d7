"""Feedback bodies are checked field by field; impressions carry the model's view and its rank."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from logstore.log_tables import IMPRESSION_COLUMNS, IMPRESSIONS
from logstore.spool import rows_to_table
from relay.features import FEATURE_NAMES
from serving.feedback import Answered, decode_feedback, impression_rows, sampled
from serving.schema import RequestRejected, decode_json
from tests.unit.test_serving_schema import make_doc


def body(**doc: object) -> bytes:
    return orjson.dumps(doc)


def test_a_click_and_an_order_decode_with_their_values() -> None:
    batch = decode_feedback(
        body(
            request_id="r1",
            events=[
                {"item_id": 7, "event": "click"},
                {"item_id": 7, "event": "order", "order_value": 12},
            ],
        ),
        max_events=10,
    )
    assert batch.request_id == "r1"
    assert [(e.item_id, e.event, e.order_value) for e in batch.events] == [
        (7, "click", 0.0),
        (7, "order", 12.0),
    ]


@pytest.mark.parametrize(
    ("raw", "code", "names"),
    [
        (b"[1]", "not_an_object", "object"),
        (body(request_id="", events=[]), "wrong_type", "request_id"),
        (body(request_id="r", events=[{"item_id": 1}]), "unknown_event", "events[0].event"),
        (body(request_id="r", events=[{"item_id": -1, "event": "click"}]), "wrong_type", "item_id"),
        (
            body(request_id="r", events=[{"item_id": 1.5, "event": "click"}]),
            "wrong_type",
            "item_id",
        ),
        (
            body(request_id="r", events=[{"item_id": 1, "event": "click", "order_value": 3}]),
            "out_of_range",
            "click carries no order_value",
        ),
        (
            body(request_id="r", events=[{"item_id": 1, "event": "order", "order_value": "9"}]),
            "wrong_type",
            "events[0].order_value",
        ),
        (
            b'{"request_id": "r", "events": [{"item_id": 1, "event": "order", "order_value": NaN}]}',
            "bad_json",
            "JSON",
        ),
        (body(request_id="r", events=[], extra=1), "unknown_field", "extra"),
        (
            body(request_id="r", events=[{"item_id": 1, "event": "click", "x": 1}]),
            "unknown_field",
            "x",
        ),
    ],
)
def test_malformed_feedback_is_refused_naming_the_field(raw: bytes, code: str, names: str) -> None:
    with pytest.raises(RequestRejected) as refused:
        decode_feedback(raw, max_events=10)
    assert refused.value.code == code and names in refused.value.detail
    assert refused.value.status == 400


def test_impression_rows_hold_the_models_features_and_the_rank_its_scores_gave() -> None:
    doc = make_doc(n=4, seed=3)
    request = decode_json(orjson.dumps(doc), 100)
    scores = np.array([0.1, 0.9, 0.5, 0.9], dtype=np.float32)
    rows = impression_rows(Answered(1.7e9, "r", "stable", "v1", "l1", "s-1", request.raw, scores))
    table = rows_to_table(rows, IMPRESSIONS)
    assert table.column_names == list(IMPRESSION_COLUMNS)
    assert table.column("rank").to_pylist() == [4, 1, 3, 2]  # ties keep the request's order
    assert table.column("item_id").to_pylist() == [c["item_id"] for c in doc["candidates"]]
    assert table.column("position").to_pylist() == [1, 2, 3, 4]  # as sent: what the model saw
    assert table.column("user_id").to_pylist() == [doc["user"]["user_id"]] * 4
    assert set(FEATURE_NAMES) <= set(table.column_names)


def test_sampling_keeps_a_stable_share_of_requests() -> None:
    ids = [f"w-{i:x}" for i in range(20_000)]
    kept = [i for i in ids if sampled(i, 0.1)]
    assert 0.09 < len(kept) / len(ids) < 0.11
    assert kept == [i for i in ids if sampled(i, 0.1)]  # the same requests every time
    assert all(sampled(i, 1.0) for i in ids[:100]) and not any(sampled(i, 0.0) for i in ids[:100])


def test_a_requests_impressions_are_one_record_that_recovery_expands(tmp_path) -> None:
    from logstore import wal
    from logstore.spool import RequestLogWriter, SpoolWriter, decode_rows

    doc = make_doc(n=5, seed=4)
    request = decode_json(orjson.dumps(doc), 100)
    scores = np.linspace(0.1, 0.5, 5, dtype=np.float32)
    rows = impression_rows(Answered(1.7e9, "r9", "canary", "v", "l", "s", request.raw, scores))
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w", IMPRESSIONS),
        connect_server=None,
        flush_s=3600,
        batch_rows=100,
    )
    writer.append_group(rows)
    (wal_file,) = tmp_path.glob("*.wal")
    data = wal_file.read_bytes()
    decoded, torn = decode_rows(data)
    assert torn == 0 and [list(r) for r in decoded] == [list(r) for r in rows]
    assert len(wal.parse(data)[0]) == 1  # five rows, one record: they survive all or none
    writer.close()

"""Feedback bodies are checked field by field; impressions carry the model's view and its rank."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from logstore.log_tables import IMPRESSION_COLUMNS, IMPRESSIONS
from relay.features import FEATURE_NAMES
from serving.feedback import FeedbackLog, decode_feedback, impression_batch, sampled
from serving.schema import RAW_INDEX, RequestRejected, decode_json
from tests.unit.test_serving_schema import make_doc


@dataclass
class Scored:
    """A scored request as the worker's exchange holds it."""

    request_id: str
    ts: float = 1.7e9
    slot: str = "stable"
    version: str = "v1"
    lineage_id: str = "l1"
    session_id: str = "s-1"


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


def test_impressions_hold_the_models_features_and_the_rank_its_scores_gave() -> None:
    doc = make_doc(n=4, seed=3)
    request = decode_json(orjson.dumps(doc), 100)
    scores = np.array([0.1, 0.9, 0.5, 0.9], dtype=np.float32)
    batch = impression_batch([Scored("r")], [4], request.raw, scores)
    table = IMPRESSIONS.expand(pa.Table.from_batches([batch]))
    assert table.schema == IMPRESSIONS.schema and table.column_names == list(IMPRESSION_COLUMNS)
    assert table.column("rank").to_pylist() == [4, 1, 3, 2]  # ties keep the request's order
    assert table.column("item_id").to_pylist() == [c["item_id"] for c in doc["candidates"]]
    assert table.column("position").to_pylist() == [1, 2, 3, 4]  # as sent: what the model saw
    assert table.column("user_id").to_pylist() == [doc["user"]["user_id"]] * 4
    assert table.column("score").to_pylist() == scores.tolist()
    assert set(FEATURE_NAMES) <= set(table.column_names)


def test_a_batch_of_requests_ranks_each_requests_candidates_on_their_own() -> None:
    first, second = (decode_json(orjson.dumps(make_doc(n=n, seed=n)), 100) for n in (2, 3))
    raw = np.concatenate([first.raw, second.raw])
    scores = np.array([0.2, 0.7, 0.9, 0.1, 0.5], dtype=np.float32)
    requests = [Scored("a", ts=1.7e9 + 0.0125), Scored("b", slot="canary", session_id="s-2")]
    table = IMPRESSIONS.expand(
        pa.Table.from_batches([impression_batch(requests, [2, 3], raw, scores)])
    )
    assert table.column("request_id").to_pylist() == ["a", "a", "b", "b", "b"]
    assert table.column("rank").to_pylist() == [2, 1, 1, 3, 2]
    assert table.column("slot").to_pylist() == ["stable"] * 2 + ["canary"] * 3
    assert table.column("session_id").to_pylist() == ["s-1"] * 2 + ["s-2"] * 3
    ms = table.column("ts").cast(pa.int64()).to_pylist()
    assert ms == [1_700_000_000_012] * 2 + [1_700_000_000_000] * 3  # rounded to milliseconds
    price = raw[:, RAW_INDEX["price"]].astype(np.float32)  # float32, as the model saw it
    assert table.column("price").to_pylist() == price.tolist()


def test_sampling_keeps_a_stable_share_of_requests() -> None:
    ids = [f"w-{i:x}" for i in range(20_000)]
    kept = [i for i in ids if sampled(i, 0.1)]
    assert 0.09 < len(kept) / len(ids) < 0.11
    assert kept == [i for i in ids if sampled(i, 0.1)]  # the same requests every time
    assert all(sampled(i, 1.0) for i in ids[:100]) and not any(sampled(i, 0.0) for i in ids[:100])


def test_a_batchs_impressions_are_one_record_that_recovery_expands(tmp_path: Path) -> None:
    from logstore import wal
    from logstore.spool import RequestLogWriter, SpoolWriter, decode_table, read_segment

    requests = [decode_json(orjson.dumps(make_doc(n=n, seed=n)), 100) for n in (5, 2, 3)]
    raw = np.concatenate([r.raw for r in requests])
    scores = np.linspace(0.1, 0.5, 10, dtype=np.float32)
    scores[6] = np.nan  # the second request is answered with an error: nothing was shown
    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w", IMPRESSIONS),
        connect_server=None,
        flush_s=3600,
        batch_rows=100,
    )
    log = FeedbackLog(writer, writer, 1.0, "w")
    scored = [Scored("r1"), Scored("r2"), Scored("r3")]
    assert log.write_impressions(scored, [5, 2, 3], raw, scores) == 8
    (wal_file,) = tmp_path.glob("*.wal")
    data = wal_file.read_bytes()
    assert len(wal.parse(data)[0]) == 1  # eight rows, one record: they survive all or none
    recovered, rows, torn = decode_table(data, IMPRESSIONS)
    assert (rows, torn) == (8, 0) and recovered.schema == IMPRESSIONS.schema
    assert recovered.column("request_id").to_pylist() == ["r1"] * 5 + ["r3"] * 3
    writer.close()
    (segment,) = tmp_path.glob("*.arrow")
    assert read_segment(segment, IMPRESSIONS).equals(recovered)  # memory and file agree


def test_many_batches_impressions_share_one_segment_exactly(tmp_path: Path) -> None:
    from logstore.spool import RequestLogWriter, SpoolWriter, read_segment

    writer = RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w", IMPRESSIONS),
        connect_server=None,
        flush_s=3600,
        batch_rows=10_000,
    )
    log = FeedbackLog(writer, writer, 1.0, "w")
    expected = []
    for k in range(4):  # each batch its own requests, so its own dictionaries
        request = decode_json(orjson.dumps(make_doc(n=3, seed=k)), 100)
        scores = np.array([0.2, 0.9, 0.5], dtype=np.float32)
        log.write_impressions([Scored(f"r{k}", slot=f"slot-{k}")], [3], request.raw, scores)
        expected += [(f"r{k}", f"slot-{k}", rank) for rank in (3, 1, 2)]
    writer.close()
    (segment,) = tmp_path.glob("*.arrow")
    found = read_segment(segment, IMPRESSIONS)
    assert found.schema == IMPRESSIONS.schema and not list(tmp_path.glob("*.wal"))
    got = zip(*(found.column(c).to_pylist() for c in ("request_id", "slot", "rank")), strict=True)
    assert list(got) == expected


def test_many_records_make_one_journal_with_each_requests_ranks_and_values() -> None:
    from logstore.log_tables import journal_from_records

    docs = [decode_json(orjson.dumps(make_doc(n=n, seed=n)), 100) for n in (3, 2, 4)]
    records = [
        impression_batch([Scored("a")], [3], docs[0].raw, np.array([0.1, 0.9, 0.5], np.float32)),
        impression_batch(
            [Scored("b", slot="canary", session_id="s-2"), Scored("c", ts=1.7e9 + 1)],
            [2, 4],
            np.concatenate([docs[1].raw, docs[2].raw]),
            np.array([0.3, 0.3, 0.2, 0.8, 0.4, 0.6], np.float32),
        ),
    ]
    journal = journal_from_records(records)
    assert journal.num_rows == 9 and journal.column("request_id").num_chunks == 1
    one_by_one = pa.concat_tables([IMPRESSIONS.expand(pa.Table.from_batches([r])) for r in records])
    together = IMPRESSIONS.expand(journal)
    assert together.equals(one_by_one)
    assert together.column("rank").to_pylist() == [3, 1, 2, 1, 2, 4, 1, 3, 2]
    assert together.column("slot").to_pylist() == ["stable"] * 3 + ["canary"] * 2 + ["stable"] * 4
    ms = together.column("ts").cast(pa.int64()).to_pylist()
    assert ms == [1_700_000_000_000] * 5 + [1_700_000_001_000] * 4
    raw = np.concatenate([d.raw for d in docs])
    price = raw[:, RAW_INDEX["price"]].astype(np.float32)
    assert together.column("price").to_pylist() == price.tolist()  # the rows, exactly


def test_a_record_whose_requests_do_not_account_for_its_rows_is_refused() -> None:
    from logstore.log_tables import journal_from_records, record_requests

    doc = decode_json(orjson.dumps(make_doc(n=3, seed=1)), 100)
    record = impression_batch([Scored("a")], [3], doc.raw, np.zeros(3, np.float32))
    wrong = record.replace_schema_metadata(record_requests([2], [(1.7e9, "a", "s", "v", "l", "x")]))
    with pytest.raises(ValueError, match="do not add up to its 3 rows"):
        journal_from_records([wrong])


def test_a_write_ahead_file_with_journal_records_from_an_older_worker_is_recovered_whole(
    tmp_path: Path,
) -> None:
    """Older workers wrote each engine batch's impressions ahead in the journal form."""
    from logstore import wal
    from logstore.log_tables import journal_from_records
    from logstore.spool import decode_table, encode_columns

    first, second = (decode_json(orjson.dumps(make_doc(n=n, seed=n)), 100) for n in (2, 3))
    old = journal_from_records(
        [impression_batch([Scored("old")], [2], first.raw, np.array([0.2, 0.1], np.float32))]
    )
    new = impression_batch([Scored("new")], [3], second.raw, np.array([0.1, 0.3, 0.2], np.float32))
    data = b"".join(
        wal.HEADER.pack(len(p), zlib.crc32(p)) + p
        for p in (encode_columns(old.to_batches()[0]), encode_columns(new))
    )
    recovered, rows, torn = decode_table(data, IMPRESSIONS)
    assert (rows, torn) == (5, 0) and recovered.schema == IMPRESSIONS.schema
    assert recovered.column("request_id").to_pylist() == ["old"] * 2 + ["new"] * 3  # in order


def test_a_record_that_does_not_add_up_is_refused_where_it_is_built_and_where_it_is_read() -> None:
    """On the engine thread one batch fails; in recovery it is an undecodable record."""
    from logstore import wal
    from logstore.log_tables import record_requests
    from logstore.spool import decode_table, encode_columns

    doc = decode_json(orjson.dumps(make_doc(n=3, seed=1)), 100)
    with pytest.raises(ValueError, match="1 requests of 2 candidates in all, against 3 scores"):
        impression_batch([Scored("a")], [2], doc.raw, np.zeros(3, np.float32))
    good = impression_batch([Scored("a")], [3], doc.raw, np.zeros(3, np.float32))
    bad = good.replace_schema_metadata(record_requests([2], [(1.7e9, "b", "s", "v", "l", "x")]))
    payloads = [encode_columns(good), encode_columns(bad)]
    data = b"".join(wal.HEADER.pack(len(p), zlib.crc32(p)) + p for p in payloads)
    recovered, rows, torn = decode_table(data, IMPRESSIONS)
    assert rows == 3 and recovered.column("request_id").to_pylist() == ["a"] * 3
    assert torn == len(payloads[1]) + wal.HEADER.size  # the bad record, dropped and counted


def test_bench_log_records_baseline_writes_the_same_rows_as_the_record() -> None:
    """bench.log_record compares the record with the former path: both must mean the same rows."""
    from bench.log_record import journal_batch

    first, second = (decode_json(orjson.dumps(make_doc(n=n, seed=n)), 100) for n in (3, 4))
    raw = np.concatenate([first.raw, second.raw])
    scores = np.array([0.3, 0.1, 0.3, 0.9, 0.2, 0.5, 0.2], np.float32)
    requests = [Scored("a"), Scored("b", slot="canary", ts=1.7e9 + 2.5)]
    record = impression_batch(requests, [3, 4], raw, scores)
    former = journal_batch(requests, [3, 4], raw, scores)
    assert IMPRESSIONS.expand(pa.Table.from_batches([former])).equals(
        IMPRESSIONS.expand(pa.Table.from_batches([record]))
    )

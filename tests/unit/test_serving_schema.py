"""The predict request: decoding, the bad inputs each with its code, and parity with training."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from relay.features import CATEGORICAL, DENSE, FEATURE_NAMES, to_model_input
from serving.client import BinaryRequest, encode_predict, items_matrix
from serving.protocol import PREFIX
from serving.schema import (
    CONTEXT_FIELDS,
    ITEM_FIELDS,
    RAW_ORDER,
    SESSION_FIELDS,
    USER_FIELDS,
    RequestRejected,
    decode_binary,
    decode_json,
    model_input,
)

MAX = 100


def make_doc(n: int = 5, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "request_id": f"r-{seed}",
        "user": {
            "user_id": int(rng.integers(0, 10**9)),
            "user_age": 31,
            "user_tenure_days": 400,
            "user_clicks_30d": 12,
            "user_orders_30d": 2,
            "user_ctr_30d": 0.123456789,
            "user_avg_price": 37.3,
        },
        "session": {
            "session_id": "s-1",
            "session_depth": 3,
            "session_duration_s": 95.5,
            "seconds_since_last_click": 7,
        },
        "context": {"device_type": 2, "hour": 21, "weekday": 6, "region_id": 11},
        "candidates": [
            {
                "item_id": int(rng.integers(0, 10**7)),
                "category_id": int(rng.integers(0, 64)),
                "brand_id": int(rng.integers(0, 2000)),
                "position": i + 1,
                "price": float(rng.lognormal(3, 1)),
                "discount_pct": float(rng.uniform(0, 1)),
                "item_rating": float(rng.uniform(0, 5)),
                "item_review_count": int(rng.integers(0, 10**5)),
                "item_age_days": float(rng.uniform(0, 900)),
                "item_ctr_7d": float(rng.uniform(0, 1)),
                "item_impressions_7d": int(rng.integers(0, 10**7)),
                "user_category_affinity": float(rng.uniform(0, 1)),
                "price_to_user_avg": float(rng.lognormal(0, 1)),
            }
            for i in range(n)
        ],
    }


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def rejected(fn: Any, *args: Any) -> RequestRejected:
    with pytest.raises(RequestRejected) as info:
        fn(*args)
    return info.value


def binary_parts(doc: dict[str, Any], items: np.ndarray | None = None) -> tuple[Any, memoryview]:
    """Header and payload of the binary frame for a JSON doc, as the worker sees them."""
    request = BinaryRequest(
        doc["user"],
        doc["session"],
        doc["context"],
        items if items is not None else items_matrix(doc["candidates"]),
    )
    frame = encode_predict(1, request)
    _, _, _, header_len, _ = PREFIX.unpack_from(frame)
    header = orjson.loads(frame[PREFIX.size : PREFIX.size + header_len])
    return header, memoryview(frame)[PREFIX.size + header_len :]


def test_field_groups_are_exactly_the_model_columns() -> None:
    groups = USER_FIELDS + SESSION_FIELDS + CONTEXT_FIELDS + ITEM_FIELDS
    assert len(groups) == len(set(groups)) == len(FEATURE_NAMES)
    assert set(groups) == set(FEATURE_NAMES)
    assert set(RAW_ORDER) == set(FEATURE_NAMES)
    categorical = {c.name for c in CATEGORICAL}
    flags = [name in categorical for name in ITEM_FIELDS]
    assert flags == sorted(flags, reverse=True)  # item categoricals first: checked as one slice


def test_valid_json_decodes_one_row_per_candidate_with_shared_values_broadcast() -> None:
    doc = make_doc(n=7)
    req = decode_json(body(doc), MAX)
    assert req.rows == 7 and req.raw.shape == (7, 27) and req.raw.dtype == np.float64
    assert req.user_id == doc["user"]["user_id"]
    assert req.session_id == "s-1" and req.request_id == "r-0"
    col = {name: j for j, name in enumerate(RAW_ORDER)}
    assert (req.raw[:, col["hour"]] == 21).all()
    assert req.raw[3, col["item_id"]] == doc["candidates"][3]["item_id"]
    # dense values are rounded through float32, as training reads them from Float32 columns
    assert req.raw[0, col["user_ctr_30d"]] == float(np.float32(0.123456789))


def test_model_input_matches_training_pipeline_on_a_dataframe() -> None:
    doc = make_doc(n=40, seed=3)
    req = decode_json(body(doc), MAX)
    frame = pd.DataFrame(req.raw, columns=list(RAW_ORDER))[list(FEATURE_NAMES)]
    expected = to_model_input(frame)
    got = model_input(req.raw)
    assert got.dtype == np.float32 and got.shape == (40, 27)
    np.testing.assert_array_equal(got, expected)


def test_training_frame_with_integer_ids_gives_the_same_model_input() -> None:
    # training reads ids as UInt64 and dense values as Float32 from ClickHouse
    doc = make_doc(n=10, seed=4)
    rows = [{**doc["user"], **doc["context"], **doc["session"], **c} for c in doc["candidates"]]
    frame = pd.DataFrame(rows)
    for spec in CATEGORICAL:
        frame[spec.name] = frame[spec.name].astype(np.uint64)
    for dense in DENSE:
        frame[dense.name] = frame[dense.name].astype(np.float32)
    np.testing.assert_array_equal(
        model_input(decode_json(body(doc), MAX).raw), to_model_input(frame)
    )


def test_binary_and_json_forms_decode_to_identical_raw_rows() -> None:
    doc = make_doc(n=6, seed=5)
    for c in doc["candidates"]:  # ids within float32's exact range, as the binary form needs
        c["item_id"] %= 2**24
    header, payload = binary_parts(doc)
    from_binary = decode_binary(header, payload, MAX)
    from_json = decode_json(body(doc), MAX)
    np.testing.assert_array_equal(from_binary.raw, from_json.raw)
    assert from_binary.user_id == from_json.user_id
    assert from_binary.input_bytes == 6 * 13 * 4


@pytest.mark.parametrize(
    ("raw_body", "code"),
    [
        (b'{"user": ', "bad_json"),
        (b"\xff\xfe", "bad_json"),
        (b"[1, 2]", "not_an_object"),
        (b'{"user": {}}', "missing_field"),
        (b'{"candidates": {"a": 1}}', "wrong_type"),
        (b'{"candidates": []}', "empty_candidates"),
    ],
)
def test_malformed_bodies_get_their_codes(raw_body: bytes, code: str) -> None:
    assert rejected(decode_json, raw_body, MAX).code == code


def test_missing_candidate_feature_is_wrong_feature_count_naming_it() -> None:
    doc = make_doc()
    del doc["candidates"][2]["item_rating"]
    err = rejected(decode_json, body(doc), MAX)
    assert err.code == "wrong_feature_count" and err.status == 400
    assert "candidate 2" in err.detail and "item_rating" in err.detail


def test_extra_candidate_feature_is_wrong_feature_count_naming_it() -> None:
    doc = make_doc()
    doc["candidates"][0]["colour"] = 3
    err = rejected(decode_json, body(doc), MAX)
    assert err.code == "wrong_feature_count" and "colour" in err.detail


def test_missing_user_feature_is_wrong_feature_count() -> None:
    doc = make_doc()
    del doc["user"]["user_age"]
    err = rejected(decode_json, body(doc), MAX)
    assert err.code == "wrong_feature_count" and "user_age" in err.detail


@pytest.mark.parametrize("bad", ["12.5", None, [1], {"v": 1}])
def test_non_numeric_candidate_value_is_wrong_type(bad: Any) -> None:
    doc = make_doc()
    doc["candidates"][1]["price"] = bad
    err = rejected(decode_json, body(doc), MAX)
    assert err.code == "wrong_type" and "price" in err.detail


@pytest.mark.parametrize("bad", ["30", None, True])
def test_non_numeric_user_value_is_wrong_type(bad: Any) -> None:
    doc = make_doc()
    doc["user"]["user_age"] = bad
    err = rejected(decode_json, body(doc), MAX)
    assert err.code == "wrong_type" and "user_age" in err.detail


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "1e999"])
def test_non_finite_json_numbers_are_non_finite_naming_the_column(value: Any) -> None:
    doc = make_doc()
    doc["candidates"][0]["item_rating"] = 12345.678 if value == "1e999" else value
    raw_body = body(doc)  # Python's json writes NaN and Infinity literals
    if value == "1e999":
        raw_body = raw_body.replace(b"12345.678", b"1e999")
    err = rejected(decode_json, raw_body, MAX)
    assert err.code == "non_finite" and "item_rating" in err.detail


def test_too_many_candidates_is_refused_with_the_limit() -> None:
    err = rejected(decode_json, body(make_doc(n=11)), 10)
    assert err.code == "too_many_candidates" and "10" in err.detail


@pytest.mark.parametrize(
    ("field", "value"), [("category_id", -1), ("brand_id", 2.5), ("item_id", 2**53)]
)
def test_ids_must_be_whole_non_negative_and_exact(field: str, value: float) -> None:
    doc = make_doc()
    doc["candidates"][0][field] = value
    err = rejected(decode_json, body(doc), MAX)
    assert err.code == "bad_categorical" and field in err.detail


def test_dense_value_outside_its_possible_range_is_out_of_range() -> None:
    doc = make_doc()
    doc["user"]["user_age"] = 400
    err = rejected(decode_json, body(doc), MAX)
    assert err.code == "out_of_range" and "user_age in [13, 120]" in err.detail


def test_binary_payload_length_disagreeing_with_header_is_refused() -> None:
    header, payload = binary_parts(make_doc(n=4))
    err = rejected(decode_binary, header, payload[:-4], MAX)
    assert err.code == "payload_length_mismatch" and "208 bytes" in err.detail
    header["rows"] = 5
    assert rejected(decode_binary, header, payload, MAX).code == "payload_length_mismatch"


def test_binary_wrong_column_count_is_wrong_feature_count() -> None:
    doc = make_doc(n=3)
    header, payload = binary_parts(doc, np.ones((3, 12), dtype=np.float32))
    assert rejected(decode_binary, header, payload, MAX).code == "wrong_feature_count"


def test_binary_nan_in_payload_is_non_finite() -> None:
    doc = make_doc(n=3)
    items = items_matrix(doc["candidates"])
    items[1, ITEM_FIELDS.index("discount_pct")] = np.nan
    header, payload = binary_parts(doc, items)
    err = rejected(decode_binary, header, payload, MAX)
    assert err.code == "non_finite" and "discount_pct" in err.detail


def test_binary_ids_beyond_float32_exactness_are_refused() -> None:
    doc = make_doc(n=2)
    doc["candidates"][0]["item_id"] = 2**24 + 2  # representable, but not every id here is
    header, payload = binary_parts(doc)
    assert rejected(decode_binary, header, payload, MAX).code == "bad_categorical"


def test_binary_header_must_be_an_object_with_integer_shape() -> None:
    _, payload = binary_parts(make_doc(n=2))
    assert rejected(decode_binary, [1], payload, MAX).code == "not_an_object"
    header, payload = binary_parts(make_doc(n=2))
    header["rows"] = "2"
    assert rejected(decode_binary, header, payload, MAX).code == "wrong_type"


def test_request_id_and_session_id_are_checked() -> None:
    doc = copy.deepcopy(make_doc())
    doc["request_id"] = 7
    assert rejected(decode_json, body(doc), MAX).code == "wrong_type"
    doc = make_doc()
    doc["session"]["session_id"] = "x" * 500
    assert rejected(decode_json, body(doc), MAX).code == "wrong_type"

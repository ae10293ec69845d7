"""The predict request in its two wire forms, decoded and checked into one raw feature block.

A request names a user, a session, the request context and a list of candidate items. Its
features are split by where they come from; together the four groups are exactly the model's
27 raw columns (`relay.features.FEATURE_NAMES`), so serving feeds the training pipeline the
same columns training read.

JSON (`POST /v1/predict`):
    {"request_id": "optional", "user": {USER_FIELDS}, "session": {"session_id": "...",
     SESSION_FIELDS}, "context": {CONTEXT_FIELDS}, "candidates": [{ITEM_FIELDS}, ...]}
Binary (serving.protocol): the same header minus `candidates`, plus `rows` and `cols`; the
payload is `rows x cols` little-endian float32 item features in ITEM_FIELDS order.

Every rejection is a `RequestRejected` with a stable error code (logged to inference_logs) and
a detail naming the field, candidate or column at fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from relay.errors import ServingError
from relay.features import (
    CATEGORICAL,
    CODED,
    DENSE,
    FEATURE_NAMES,
    HASHED,
    encode,
    non_finite,
    non_finite_error,
)

USER_FIELDS: tuple[str, ...] = (
    "user_id",
    "user_age",
    "user_tenure_days",
    "user_clicks_30d",
    "user_orders_30d",
    "user_ctr_30d",
    "user_avg_price",
)
SESSION_FIELDS: tuple[str, ...] = (
    "session_depth",
    "session_duration_s",
    "seconds_since_last_click",
)
CONTEXT_FIELDS: tuple[str, ...] = ("device_type", "hour", "weekday", "region_id")
ITEM_FIELDS: tuple[str, ...] = (
    "item_id",
    "category_id",
    "brand_id",
    "position",
    "price",
    "discount_pct",
    "item_rating",
    "item_review_count",
    "item_age_days",
    "item_ctr_7d",
    "item_impressions_7d",
    "user_category_affinity",
    "price_to_user_avg",
)
SECTIONS: dict[str, tuple[str, ...]] = {
    "user": USER_FIELDS,
    "session": SESSION_FIELDS,
    "context": CONTEXT_FIELDS,
}
SHARED_FIELDS: tuple[str, ...] = USER_FIELDS + SESSION_FIELDS + CONTEXT_FIELDS
# A request's raw block keeps items then shared values, so assembling it is two slice copies;
# model_input hands the pipeline its columns by position, one block per encoding.
RAW_ORDER: tuple[str, ...] = ITEM_FIELDS + SHARED_FIELDS
RAW_INDEX: dict[str, int] = {name: j for j, name in enumerate(RAW_ORDER)}
_HASHED_RAW = np.array([RAW_INDEX[CATEGORICAL[j].name] for j in HASHED], dtype=np.intp)
_CODED_RAW = np.array([RAW_INDEX[CATEGORICAL[j].name] for j in CODED], dtype=np.intp)
_DENSE_RAW = np.array([RAW_INDEX[d.name] for d in DENSE], dtype=np.intp)

# Categorical ids must survive the trip to float exactly, or they land in another bucket.
JSON_ID_LIMIT = 2**53
FLOAT32_ID_LIMIT = 2**24
MAX_ID_CHARS = 128

_N_ITEM = len(ITEM_FIELDS)
_CATEGORICAL = frozenset(c.name for c in CATEGORICAL)
_DENSE_SPEC = {d.name: d for d in DENSE}
_IS_CAT = np.array([name in _CATEGORICAL for name in RAW_ORDER])
_LOW = np.array([_DENSE_SPEC[n].low if n in _DENSE_SPEC else 0.0 for n in RAW_ORDER])


def _high(item_id_limit: int) -> np.ndarray:
    """Per-column upper bounds: dense ranges, and ids as large as their encoding keeps exact."""
    return np.array(
        [
            _DENSE_SPEC[n].high
            if n in _DENSE_SPEC
            else (item_id_limit if n in ITEM_FIELDS else JSON_ID_LIMIT) - 1
            for n in RAW_ORDER
        ]
    )


# JSON carries every id exactly below 2**53; the binary form's float32 payload carries item ids
# exactly only below 2**24 (its header, being JSON, carries the rest exactly).
_HIGH_JSON = _high(JSON_ID_LIMIT)
_HIGH_BINARY = _high(FLOAT32_ID_LIMIT)


def _runs(mask: np.ndarray) -> list[slice]:
    """Contiguous runs of True in a mask, as slices."""
    runs, start = [], None
    for j, flag in enumerate([*mask.tolist(), False]):
        if flag and start is None:
            start = j
        elif not flag and start is not None:
            runs.append(slice(start, j))
            start = None
    return runs


_DENSE_RUNS = _runs(~_IS_CAT)  # rounded through float32 as one slice each
# Item categoricals lead ITEM_FIELDS (a unit test holds this), so they are one slice.
_N_ITEM_CATEGORICAL = sum(name in _CATEGORICAL for name in ITEM_FIELDS)
_SHARED_CATEGORICAL = np.flatnonzero(_IS_CAT[_N_ITEM:]) + _N_ITEM
_ITEM_GET = itemgetter(*ITEM_FIELDS)
_SECTION_GET = {section: itemgetter(*fields) for section, fields in SECTIONS.items()}
_SECTION_KEYS = {
    section: frozenset(fields) | ({"session_id"} if section == "session" else set())
    for section, fields in SECTIONS.items()
}
_NUMBER = (int, float)


class RequestRejected(ServingError):
    """A request the worker refuses, with the code logged for it and the HTTP status it gets."""

    def __init__(self, code: str, detail: str, status: int = 400) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.status = status


@dataclass(slots=True)
class PredictRequest:
    """One decoded, checked request: raw features in RAW_ORDER, one row per candidate."""

    request_id: str | None
    user_id: int
    session_id: str
    raw: np.ndarray  # float64 (n, 27), columns in RAW_ORDER
    input_bytes: int

    @property
    def rows(self) -> int:
        return int(self.raw.shape[0])


def json_object(raw: bytes) -> dict[str, Any]:
    """A body that must be one JSON object (admin calls, feedback); RequestRejected otherwise."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestRejected("bad_json", f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestRejected("not_an_object", "body must be a JSON object")
    return body


def decode_json(body: bytes, max_candidates: int) -> PredictRequest:
    """Parse and check a JSON predict body. Raises RequestRejected naming what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        doc = _parse_non_finite(body, exc)
    if type(doc) is not dict:
        raise RequestRejected("not_an_object", f"body must be a JSON object, got {_kind(doc)}")
    candidates = doc.get("candidates")
    if candidates is None:
        raise RequestRejected("missing_field", "body has no 'candidates' list")
    if type(candidates) is not list:
        raise RequestRejected("wrong_type", f"'candidates' must be a list, got {_kind(candidates)}")
    _check_count(len(candidates), max_candidates)
    try:
        rows = [_ITEM_GET(c) for c in candidates]
        if sum(map(len, candidates)) != _N_ITEM * len(candidates):
            raise KeyError  # some candidate has features beyond the model's
    except (KeyError, TypeError):
        raise _diagnose_candidates(candidates) from None
    try:
        items = np.array(rows)
    except ValueError:  # a list where a number belongs
        raise _diagnose_values(rows) from None
    if items.dtype.kind not in "iuf" or items.ndim != 2:  # strings, nulls, objects, huge ints
        raise _diagnose_values(rows)
    session_id, shared = _decode_sections(doc)
    raw = _assemble(items, shared)
    _check_values(raw, _HIGH_JSON)
    return PredictRequest(_request_id(doc), int(raw[0, _N_ITEM]), session_id, raw, len(body))


def decode_binary(header: Any, payload: memoryview, max_candidates: int) -> PredictRequest:
    """Check a binary frame's header and view its float32 payload. Raises RequestRejected."""
    if type(header) is not dict:
        raise RequestRejected("not_an_object", f"header must be a JSON object, got {_kind(header)}")
    rows, cols = header.get("rows"), header.get("cols")
    if type(rows) is not int or type(cols) is not int or rows < 0 or cols < 0:
        raise RequestRejected("wrong_type", "header needs non-negative integer 'rows' and 'cols'")
    if cols != _N_ITEM:
        raise RequestRejected(
            "wrong_feature_count",
            f"payload has {cols} item features per row, the model takes {_N_ITEM} "
            f"({', '.join(ITEM_FIELDS)})",
        )
    _check_count(rows, max_candidates)
    if payload.nbytes != rows * cols * 4:
        raise RequestRejected(
            "payload_length_mismatch",
            f"header says {rows} x {cols} float32 = {rows * cols * 4} bytes, "
            f"payload has {payload.nbytes}",
        )
    items = np.frombuffer(payload, dtype="<f4").reshape(rows, cols)  # a view: no copy
    session_id, shared = _decode_sections(header)
    raw = _assemble(items, shared)
    _check_values(raw, _HIGH_BINARY)
    return PredictRequest(
        _request_id(header), int(raw[0, _N_ITEM]), session_id, raw, payload.nbytes
    )


def model_input(raw: np.ndarray) -> np.ndarray:
    """float32 (n, 27) model input from raw rows, through training's own `relay.features.encode`.

    A raw block's columns are taken three blocks at a time (a DataFrame per batch cost ~3 ms
    here, column-by-column access ~0.2 ms, more than the model); a unit test holds this equal
    to `to_model_input` on the same rows as a DataFrame.
    """
    if not np.isfinite(raw).all():
        bad = non_finite(RAW_ORDER, raw)
        raise non_finite_error([name for name in FEATURE_NAMES if name in bad])
    return encode(raw[:, _HASHED_RAW], raw[:, _CODED_RAW], raw[:, _DENSE_RAW])


def _parse_non_finite(body: bytes, exc: orjson.JSONDecodeError) -> Any:
    """Python's parser reads NaN/Infinity/1e999, so those bodies get the precise error later."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestRejected("bad_json", f"body is not valid JSON: {exc}") from None


def _check_count(n: int, max_candidates: int) -> None:
    if n == 0:
        raise RequestRejected("empty_candidates", "the candidate list is empty: nothing to score")
    if n > max_candidates:
        raise RequestRejected(
            "too_many_candidates", f"{n} candidates; at most {max_candidates} per request"
        )


def _decode_sections(doc: dict[str, Any]) -> tuple[str, list[Any]]:
    """session_id and the 14 per-request feature values, in SHARED_FIELDS order."""
    values: list[Any] = []
    for section, keys in _SECTION_KEYS.items():
        part = doc.get(section)
        if type(part) is not dict or part.keys() != keys:
            raise _diagnose_section(section, part)
        values += _SECTION_GET[section](part)
    for name, v in zip(SHARED_FIELDS, values, strict=True):
        if type(v) not in _NUMBER:
            raise RequestRejected("wrong_type", f"'{name}' must be a number, got {_kind(v)}")
    session_id = doc["session"]["session_id"]
    if type(session_id) is not str or len(session_id) > MAX_ID_CHARS:
        raise RequestRejected(
            "wrong_type", f"'session.session_id' must be a string of at most {MAX_ID_CHARS} chars"
        )
    return session_id, values


def _assemble(items: np.ndarray, shared: list[Any]) -> np.ndarray:
    raw = np.empty((items.shape[0], len(RAW_ORDER)), dtype=np.float64)
    raw[:, :_N_ITEM] = items
    try:
        raw[:, _N_ITEM:] = shared
    except OverflowError:  # an integer beyond float64: beyond every id limit
        raise RequestRejected(
            "bad_categorical", "an id in user/session/context is too large"
        ) from None
    for run in _DENSE_RUNS:
        # Training reads dense columns from Float32 ClickHouse columns; rounding the same way
        # keeps JSON, binary and training inputs bit-identical.
        raw[:, run] = raw[:, run].astype(np.float32)
    return raw


def _check_values(raw: np.ndarray, high: np.ndarray) -> None:
    """Everything finite, within its possible range, categoricals whole numbers; else say which."""
    item_cat = raw[:, :_N_ITEM_CATEGORICAL]
    shared_cat = raw[0, _SHARED_CATEGORICAL]  # one row says it: shared values repeat
    # NaN and inf fail the range comparison, so the fast path needs no separate finite check.
    if (
        ((raw >= _LOW) & (raw <= high)).all()
        and (np.floor(item_cat) == item_cat).all()
        and (np.floor(shared_cat) == shared_cat).all()
    ):
        return
    finite = np.isfinite(raw)
    if not finite.all():
        raise RequestRejected(
            "non_finite", f"NaN or inf in feature columns: {_columns(~finite.all(axis=0))}"
        )
    outside = ((raw < _LOW) | (raw > high)).any(axis=0)
    bad_cat = np.flatnonzero(_IS_CAT & (outside | (np.floor(raw) != raw).any(axis=0)))
    if bad_cat.size:
        limits = ", ".join(f"{RAW_ORDER[j]} in [0, {high[j] + 1:.0f})" for j in bad_cat)
        raise RequestRejected("bad_categorical", f"ids and codes must be whole numbers: {limits}")
    ranges = ", ".join(
        f"{RAW_ORDER[j]} in [{_LOW[j]:g}, {high[j]:g}]" for j in np.flatnonzero(outside)
    )
    raise RequestRejected("out_of_range", f"values outside the possible range: {ranges}")


def _columns(mask: np.ndarray) -> str:
    """Names of the raw-block columns a mask flags."""
    return ", ".join(RAW_ORDER[j] for j in np.flatnonzero(mask))


def _request_id(doc: dict[str, Any]) -> str | None:
    rid = doc.get("request_id")
    if rid is None:
        return None
    if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_CHARS:
        raise RequestRejected(
            "wrong_type", f"'request_id' must be a non-empty string of at most {MAX_ID_CHARS} chars"
        )
    return rid


def _diagnose_section(section: str, part: Any) -> RequestRejected:
    """The precise complaint about a malformed user/session/context object (the slow path)."""
    fields = SECTIONS[section]
    if type(part) is not dict:
        return RequestRejected(
            "missing_field" if part is None else "wrong_type",
            f"'{section}' must be an object with {', '.join(fields)}",
        )
    missing = sorted(_SECTION_KEYS[section] - set(part))
    unknown = sorted(set(part) - _SECTION_KEYS[section])
    return RequestRejected(
        "wrong_feature_count", f"'{section}': " + _missing_unknown(missing, unknown)
    )


def _diagnose_candidates(candidates: list[Any]) -> RequestRejected:
    """The precise complaint about the first malformed candidate (the slow path)."""
    for i, c in enumerate(candidates):
        if not isinstance(c, dict):
            return RequestRejected("wrong_type", f"candidate {i} must be an object, got {_kind(c)}")
        missing = [f for f in ITEM_FIELDS if f not in c]
        unknown = sorted(set(c) - set(ITEM_FIELDS))
        if missing or unknown:
            return RequestRejected(
                "wrong_feature_count", f"candidate {i}: " + _missing_unknown(missing, unknown)
            )
    return RequestRejected("wrong_type", "candidates are malformed")


def _diagnose_values(rows: list[list[Any]]) -> RequestRejected:
    for i, row in enumerate(rows):
        for name, v in zip(ITEM_FIELDS, row, strict=True):
            if type(v) is int and not -(2**63) <= v < 2**64:
                return RequestRejected("bad_categorical", f"candidate {i}: '{name}' is too large")
            if type(v) not in (int, float):
                return RequestRejected(
                    "wrong_type", f"candidate {i}: '{name}' must be a number, got {_kind(v)}"
                )
    return RequestRejected("wrong_type", "candidate features must all be numbers")


def _missing_unknown(missing: list[str], unknown: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing)}")
    if unknown:
        parts.append(f"unexpected {', '.join(unknown)}")
    return "; ".join(parts)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__

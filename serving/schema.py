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
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import orjson

from relay.errors import ServingError
from relay.features import DENSE, FEATURE_NAMES, N_CATEGORICAL, N_FEATURES, to_model_input

if TYPE_CHECKING:
    import pandas as pd

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

# Categorical ids must survive the trip to float exactly, or they land in another bucket.
JSON_ID_LIMIT = 2**53
FLOAT32_ID_LIMIT = 2**24
MAX_ID_CHARS = 128

_COLUMN = {name: j for j, name in enumerate(FEATURE_NAMES)}
_ITEM_COLS = np.array([_COLUMN[n] for n in ITEM_FIELDS])
_SHARED_COLS = np.array([_COLUMN[n] for n in SHARED_FIELDS])
_USER_ID_COL = _COLUMN["user_id"]
_DENSE_LOW = np.array([d.low for d in DENSE])
_DENSE_HIGH = np.array([d.high for d in DENSE])


class RequestRejected(ServingError):
    """A request the worker refuses, with the code logged for it and the HTTP status it gets."""

    def __init__(self, code: str, detail: str, status: int = 400) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.status = status


@dataclass(slots=True)
class PredictRequest:
    """One decoded, checked request: raw features in FEATURE_NAMES order, one row per candidate."""

    request_id: str | None
    user_id: int
    session_id: str
    raw: np.ndarray  # float64 (n, 27)
    input_bytes: int

    @property
    def rows(self) -> int:
        return int(self.raw.shape[0])


def decode_json(body: bytes, max_candidates: int) -> PredictRequest:
    """Parse and check a JSON predict body. Raises RequestRejected naming what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        doc = _parse_non_finite(body, exc)
    if not isinstance(doc, dict):
        raise RequestRejected("not_an_object", f"body must be a JSON object, got {_kind(doc)}")
    candidates = doc.get("candidates")
    if candidates is None:
        raise RequestRejected("missing_field", "body has no 'candidates' list")
    if not isinstance(candidates, list):
        raise RequestRejected("wrong_type", f"'candidates' must be a list, got {_kind(candidates)}")
    _check_count(len(candidates), max_candidates)
    try:
        rows = [[c[k] for k in ITEM_FIELDS] for c in candidates]
        if any(len(c) != len(ITEM_FIELDS) for c in candidates):
            raise KeyError
    except (KeyError, TypeError, IndexError):
        raise _diagnose_candidates(candidates) from None
    items = np.array(rows)
    if items.dtype.kind not in "iuf" or items.ndim != 2:
        raise _diagnose_values(rows)
    session_id, shared = _decode_sections(doc)
    raw = _assemble(items.astype(np.float64, copy=False), shared, round_dense=True)
    _check_values(raw, JSON_ID_LIMIT)
    return PredictRequest(_request_id(doc), int(raw[0, _USER_ID_COL]), session_id, raw, len(body))


def decode_binary(header: Any, payload: memoryview, max_candidates: int) -> PredictRequest:
    """Check a binary frame's header and view its float32 payload. Raises RequestRejected."""
    if not isinstance(header, dict):
        raise RequestRejected("not_an_object", f"header must be a JSON object, got {_kind(header)}")
    rows, cols = header.get("rows"), header.get("cols")
    if type(rows) is not int or type(cols) is not int or rows < 0 or cols < 0:
        raise RequestRejected("wrong_type", "header needs non-negative integer 'rows' and 'cols'")
    if cols != len(ITEM_FIELDS):
        raise RequestRejected(
            "wrong_feature_count",
            f"payload has {cols} item features per row, the model takes {len(ITEM_FIELDS)} "
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
    raw = _assemble(items, shared, round_dense=False)
    _check_values(raw, FLOAT32_ID_LIMIT)
    return PredictRequest(
        _request_id(header), int(raw[0, _USER_ID_COL]), session_id, raw, payload.nbytes
    )


def model_input(raw: np.ndarray) -> np.ndarray:
    """float32 (n, 27) model input from raw rows, through training's own `to_model_input`."""
    # A pandas DataFrame per batch costs ~3 ms here, more than the model; this view offers the
    # part of the DataFrame interface to_model_input reads. A unit test holds the two equal.
    return to_model_input(cast("pd.DataFrame", _RawColumns(raw)))


class _RawColumns:
    """Column access over a float64 (n, 27) matrix, shaped like the DataFrame to_model_input takes."""

    __slots__ = ("_raw",)
    columns = FEATURE_NAMES

    def __init__(self, raw: np.ndarray) -> None:
        self._raw = raw

    def __len__(self) -> int:
        return int(self._raw.shape[0])

    def __getitem__(self, name: str) -> _Column:
        return _Column(self._raw[:, _COLUMN[name]])


class _Column:
    __slots__ = ("_values",)

    def __init__(self, values: np.ndarray) -> None:
        self._values = values

    def to_numpy(self, dtype: Any = None, copy: bool = False) -> np.ndarray:
        if dtype is None:
            return self._values.copy() if copy else self._values
        return self._values.astype(dtype, copy=copy)


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


def _decode_sections(doc: dict[str, Any]) -> tuple[str, np.ndarray]:
    """session_id and the 14 per-request feature values, in SHARED_FIELDS order."""
    values: list[float] = []
    for section, fields in SECTIONS.items():
        part = doc.get(section)
        if not isinstance(part, dict):
            raise RequestRejected(
                "missing_field" if part is None else "wrong_type",
                f"'{section}' must be an object with {', '.join(fields)}",
            )
        expected = set(fields) | ({"session_id"} if section == "session" else set())
        missing = [f for f in fields if f not in part]
        unknown = sorted(set(part) - expected)
        if missing or unknown:
            raise RequestRejected(
                "wrong_feature_count",
                f"'{section}': " + _missing_unknown(missing, unknown),
            )
        for f in fields:
            v = part[f]
            if type(v) not in (int, float):
                raise RequestRejected(
                    "wrong_type", f"'{section}.{f}' must be a number, got {_kind(v)}"
                )
            values.append(v)
    session_id = doc["session"].get("session_id")
    if not isinstance(session_id, str) or len(session_id) > MAX_ID_CHARS:
        raise RequestRejected(
            "wrong_type", f"'session.session_id' must be a string of at most {MAX_ID_CHARS} chars"
        )
    try:
        shared = np.array(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64: certainly beyond every id limit
        raise RequestRejected(
            "bad_categorical", "an id in user/session/context is too large"
        ) from None
    return session_id, shared


def _assemble(items: np.ndarray, shared: np.ndarray, *, round_dense: bool) -> np.ndarray:
    raw = np.empty((items.shape[0], N_FEATURES), dtype=np.float64)
    raw[:, _ITEM_COLS] = items
    raw[:, _SHARED_COLS] = shared
    if round_dense:
        # Training reads dense columns from Float32 ClickHouse columns; rounding the same way
        # keeps JSON, binary and training inputs bit-identical.
        raw[:, N_CATEGORICAL:] = raw[:, N_CATEGORICAL:].astype(np.float32)
    return raw


def _check_values(raw: np.ndarray, id_limit: int) -> None:
    finite = np.isfinite(raw)
    if not finite.all():
        raise RequestRejected(
            "non_finite", f"NaN or inf in feature columns: {_columns(~finite.all(axis=0))}"
        )
    cat = raw[:, :N_CATEGORICAL]
    bad_cat = ((cat < 0) | (cat >= id_limit) | (cat != np.floor(cat))).any(axis=0)
    if bad_cat.any():
        raise RequestRejected(
            "bad_categorical",
            f"ids and codes must be whole numbers in [0, {id_limit}): {_columns(bad_cat)}",
        )
    dense = raw[:, N_CATEGORICAL:]
    bad_dense = np.flatnonzero(((dense < _DENSE_LOW) | (dense > _DENSE_HIGH)).any(axis=0))
    if bad_dense.size:
        ranges = ", ".join(
            f"{DENSE[i].name} in [{DENSE[i].low:g}, {DENSE[i].high:g}]" for i in bad_dense
        )
        raise RequestRejected("out_of_range", f"values outside the possible range: {ranges}")


def _columns(mask: np.ndarray) -> str:
    """Names of the columns a mask flags (masks start at column 0: all 27, or the categoricals)."""
    return ", ".join(FEATURE_NAMES[i] for i in np.flatnonzero(mask))


def _request_id(doc: dict[str, Any]) -> str | None:
    rid = doc.get("request_id")
    if rid is None:
        return None
    if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_CHARS:
        raise RequestRejected(
            "wrong_type", f"'request_id' must be a non-empty string of at most {MAX_ID_CHARS} chars"
        )
    return rid


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

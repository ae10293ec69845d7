"""Raw event columns -> model input. Training and serving both call this module, so they cannot skew.

The model takes one float32 matrix of shape (n, 27): the first 9 columns are categorical indices
(exact in float32, all < 2**24), the last 18 are transformed dense features. Scaling by training
statistics happens inside the model, so the ONNX graph carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Categorical:
    name: str
    buckets: int
    hashed: bool  # ids are hashed into buckets; small codes are clipped into range


@dataclass(frozen=True)
class Dense:
    name: str
    transform: str  # "log1p" for counts, prices and durations; "clip01" for rates; "raw"
    low: float  # the physically possible range, enforced by data validation
    high: float


CATEGORICAL: tuple[Categorical, ...] = (
    Categorical("user_id", 50_000, hashed=True),
    Categorical("item_id", 20_000, hashed=True),
    Categorical("category_id", 64, hashed=False),
    Categorical("brand_id", 512, hashed=True),
    Categorical("device_type", 3, hashed=False),  # 0 web, 1 ios, 2 android
    Categorical("hour", 24, hashed=False),
    Categorical("weekday", 7, hashed=False),
    Categorical("position", 50, hashed=False),  # 1-based slot on the home page
    Categorical("region_id", 32, hashed=False),
)

DENSE: tuple[Dense, ...] = (
    Dense("price", "log1p", 0.0, 1e6),
    Dense("discount_pct", "clip01", 0.0, 1.0),
    Dense("item_rating", "raw", 0.0, 5.0),
    Dense("item_review_count", "log1p", 0.0, 1e8),
    Dense("item_age_days", "log1p", 0.0, 1e5),
    Dense("item_ctr_7d", "clip01", 0.0, 1.0),
    Dense("item_impressions_7d", "log1p", 0.0, 1e10),
    Dense("user_age", "raw", 13.0, 120.0),
    Dense("user_tenure_days", "log1p", 0.0, 1e5),
    Dense("user_clicks_30d", "log1p", 0.0, 1e7),
    Dense("user_orders_30d", "log1p", 0.0, 1e6),
    Dense("user_ctr_30d", "clip01", 0.0, 1.0),
    Dense("user_avg_price", "log1p", 0.0, 1e6),
    Dense("user_category_affinity", "clip01", 0.0, 1.0),
    Dense("session_depth", "log1p", 0.0, 1e5),
    Dense("session_duration_s", "log1p", 0.0, 1e6),
    Dense("seconds_since_last_click", "log1p", 0.0, 1e8),
    Dense("price_to_user_avg", "log1p", 0.0, 1e4),
)

FEATURE_NAMES: tuple[str, ...] = tuple(c.name for c in CATEGORICAL) + tuple(d.name for d in DENSE)
N_CATEGORICAL = len(CATEGORICAL)
N_FEATURES = len(FEATURE_NAMES)
LABEL = "clicked"

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)

# Column positions in the model input, by kind of encoding: each kind is encoded as one block,
# so a batch costs a few array operations whatever its size (column by column, a 20-row
# request's 27 columns cost ~4x more than the model itself).
HASHED = tuple(j for j, c in enumerate(CATEGORICAL) if c.hashed)
CODED = tuple(j for j, c in enumerate(CATEGORICAL) if not c.hashed)
_HASH_BUCKETS = np.array([CATEGORICAL[j].buckets for j in HASHED], dtype=np.uint64)
_CODE_HIGH = np.array([CATEGORICAL[j].buckets - 1 for j in CODED], dtype=np.int64)
_LOG1P = np.array([j for j, d in enumerate(DENSE) if d.transform == "log1p"], dtype=np.intp)
_CLIP01 = np.array([j for j, d in enumerate(DENSE) if d.transform == "clip01"], dtype=np.intp)
_RAW = np.array([j for j, d in enumerate(DENSE) if d.transform == "raw"], dtype=np.intp)


def bucket_ids(ids: np.ndarray, buckets: int | np.ndarray) -> np.ndarray:
    """Stable bucket per id (splitmix64 finaliser), the same in every process and platform.

    `buckets` is one count, or one per column of a 2-D `ids`.
    """
    x = ids.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _MIX1
        x ^= x >> np.uint64(27)
        x *= _MIX2
        x ^= x >> np.uint64(31)
    return (x % np.asarray(buckets, dtype=np.uint64)).astype(np.int64)


def encode(hashed: np.ndarray, coded: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """The model input from its three finite blocks, columns in HASHED, CODED and DENSE order.

    `hashed`: ids (n, 3), any numeric dtype (cast to uint64 as they are); `coded`: small codes
    (n, 6), cast to int64 and clipped into range; `dense`: (n, 18) float64 values.
    """
    out = np.empty((dense.shape[0], N_FEATURES), dtype=np.float32)
    out[:, HASHED] = bucket_ids(hashed, _HASH_BUCKETS)
    out[:, CODED] = np.clip(coded.astype(np.int64), 0, _CODE_HIGH)
    at = N_CATEGORICAL
    out[:, at + _LOG1P] = np.log1p(np.clip(dense[:, _LOG1P], 0.0, None))
    out[:, at + _CLIP01] = np.clip(dense[:, _CLIP01], 0.0, 1.0)
    out[:, at + _RAW] = dense[:, _RAW]
    return out


def non_finite(names: tuple[str, ...], block: np.ndarray) -> list[str]:
    """The names of `block`'s columns holding NaN or inf (none for an integer block)."""
    if block.dtype.kind != "f":
        return []
    finite = np.isfinite(block).all(axis=0)
    return [name for name, ok in zip(names, finite, strict=True) if not ok]


def non_finite_error(bad: list[str]) -> ValueError:
    return ValueError(f"non-finite values (NaN or inf) in feature columns: {', '.join(bad)}")


def to_model_input(frame: pd.DataFrame) -> np.ndarray:
    """Raw feature columns (any order, extra columns ignored) -> float32 matrix (n, 27).

    Raises ValueError naming the missing columns or the columns holding NaN/inf. Each column
    keeps its own dtype until it is cast for its encoding, so ids hash exactly at any size.
    """
    missing = [name for name in FEATURE_NAMES if name not in frame.columns]
    if missing:
        raise ValueError(f"missing feature columns: {', '.join(missing)}")
    n = len(frame)
    cat = [frame[spec.name].to_numpy() for spec in CATEGORICAL]
    bad = [
        spec.name
        for spec, v in zip(CATEGORICAL, cat, strict=True)
        if v.dtype.kind == "f" and not np.isfinite(v).all()
    ]
    dense = np.empty((n, len(DENSE)), dtype=np.float64)
    for j, dspec in enumerate(DENSE):
        dense[:, j] = frame[dspec.name].to_numpy(dtype=np.float64)
    # checked before transforms: clipping would hide an inf
    bad += non_finite(tuple(d.name for d in DENSE), dense)
    if bad:
        raise non_finite_error(bad)
    hashed = np.empty((n, len(HASHED)), dtype=np.uint64)
    for k, j in enumerate(HASHED):
        hashed[:, k] = cat[j].astype(np.uint64)
    coded = np.empty((n, len(CODED)), dtype=np.int64)
    for k, j in enumerate(CODED):
        coded[:, k] = cat[j].astype(np.int64)
    return encode(hashed, coded, dense)


def pipeline_source() -> Path:
    """This module's file: its bytes are part of every data hash."""
    return Path(__file__)

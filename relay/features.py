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


def bucket_ids(ids: np.ndarray, buckets: int) -> np.ndarray:
    """Stable bucket per id (splitmix64 finaliser), the same in every process and platform."""
    x = ids.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _MIX1
        x ^= x >> np.uint64(27)
        x *= _MIX2
        x ^= x >> np.uint64(31)
    return (x % np.uint64(buckets)).astype(np.int64)


def _categorical_column(values: np.ndarray, spec: Categorical) -> np.ndarray:
    if spec.hashed:
        return bucket_ids(values, spec.buckets)
    return np.clip(values.astype(np.int64), 0, spec.buckets - 1)


def _dense_column(values: np.ndarray, spec: Dense) -> np.ndarray:
    v = values.astype(np.float64)
    if spec.transform == "log1p":
        return np.log1p(np.clip(v, 0.0, None))
    if spec.transform == "clip01":
        return np.clip(v, 0.0, 1.0)
    return v


def to_model_input(frame: pd.DataFrame) -> np.ndarray:
    """Raw feature columns (any order, extra columns ignored) -> float32 matrix (n, 27).

    Raises ValueError naming the missing columns or the columns holding NaN/inf.
    """
    missing = [name for name in FEATURE_NAMES if name not in frame.columns]
    if missing:
        raise ValueError(f"missing feature columns: {', '.join(missing)}")
    out = np.empty((len(frame), N_FEATURES), dtype=np.float32)
    bad: list[str] = []
    for j, spec in enumerate(CATEGORICAL):
        raw = frame[spec.name].to_numpy()
        if raw.dtype.kind == "f" and not np.isfinite(raw).all():
            bad.append(spec.name)
            continue
        out[:, j] = _categorical_column(raw, spec)
    for j, dspec in enumerate(DENSE, start=N_CATEGORICAL):
        raw = frame[dspec.name].to_numpy(dtype=np.float64)
        if not np.isfinite(raw).all():  # checked before transforms: clipping would hide an inf
            bad.append(dspec.name)
            continue
        out[:, j] = _dense_column(raw, dspec)
    if bad:
        raise ValueError(f"non-finite values (NaN or inf) in feature columns: {', '.join(bad)}")
    return out


def pipeline_source() -> Path:
    """This module's file: its bytes are part of every data hash."""
    return Path(__file__)

"""Planted drift: shifts of chosen feature distributions from a given time on.

Three kinds a shop sees, each with a magnitude:

- `price_inflation`: every price (and so the price-to-user-average ratio) rises by `magnitude`
  (0.3 = +30 %);
- `device_mix`: a share `magnitude` of impressions moves to Android (a new app release, a
  campaign on Android);
- `category_promotion`: a share `magnitude` of impressions shows the promoted category at a
  40 % discount.

`apply_drift` changes only rows at or after `start`, so a window that straddles the start drifts
in part, as live traffic does. The drift benchmark and the live shoppers use this one function.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np
import pandas as pd

DriftKind = Literal["price_inflation", "device_mix", "category_promotion"]
DRIFT_KINDS: tuple[DriftKind, ...] = ("price_inflation", "device_mix", "category_promotion")
ANDROID = 2
PROMOTED_CATEGORY = 5
PROMOTION_DISCOUNT = 0.4


@dataclass(frozen=True)
class Drift:
    """One planted shift: which kind, how strong, from when (None: from the start)."""

    kind: DriftKind
    magnitude: float
    start: datetime | None = None

    def __post_init__(self) -> None:
        if self.kind not in DRIFT_KINDS:
            raise ValueError(f"drift kind {self.kind!r} is not one of {', '.join(DRIFT_KINDS)}")
        if not 0 < self.magnitude <= (10.0 if self.kind == "price_inflation" else 1.0):
            raise ValueError(f"drift magnitude {self.magnitude} is out of range for {self.kind}")


def apply_drift(frame: pd.DataFrame, drift: Drift, rng: np.random.Generator) -> pd.DataFrame:
    """A copy of an events frame with the drift planted in rows at or after its start."""
    out = frame.copy()
    hit = np.ones(len(out), dtype=bool)
    if drift.start is not None:
        hit = (out["ts"] >= pd.Timestamp(drift.start)).to_numpy()
    if drift.kind == "price_inflation":
        for column in ("price", "price_to_user_avg"):
            values = out[column].to_numpy(dtype=np.float64)
            out[column] = np.where(hit, values * (1 + drift.magnitude), values).astype(np.float32)
        return out
    moved = hit & (rng.random(len(out)) < drift.magnitude)
    if drift.kind == "device_mix":
        out.loc[moved, "device_type"] = ANDROID
        return out
    # category_promotion: the promoted category, at the promotion's discount off list price
    list_price = out["price"].to_numpy(dtype=np.float64) / (
        1 - out["discount_pct"].to_numpy(dtype=np.float64)
    )
    new_price = list_price * (1 - PROMOTION_DISCOUNT)
    ratio = out["price_to_user_avg"].to_numpy(dtype=np.float64) / out["price"].to_numpy(
        dtype=np.float64
    )
    out.loc[moved, "category_id"] = PROMOTED_CATEGORY
    out["discount_pct"] = np.where(moved, PROMOTION_DISCOUNT, out["discount_pct"]).astype(
        np.float32
    )
    out["price_to_user_avg"] = np.where(moved, new_price * ratio, out["price_to_user_avg"]).astype(
        np.float32
    )
    out["price"] = np.where(moved, new_price, out["price"]).astype(np.float32)
    return out

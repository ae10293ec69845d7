"""From a causal estimate to money: GMV per day per ms, and canary minus stable in GMV.

Pure: frames and estimates in, report types out. Intervals are 95 %: Welch's t for the slot
differences, Goodman's variance for the product of the latency difference and the causal effect.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from core.impact.estimation import Z95
from core.impact.types import (
    CANARY,
    OUTCOME,
    STABLE,
    TREATMENT,
    BusinessTranslation,
    EffectEstimate,
    SlotComparison,
)


def _product_interval(a: float, se_a: float, b: float, se_b: float) -> tuple[float, float, float]:
    """a·b with a 95 % interval (Goodman's variance of a product of independent estimates)."""
    se = float(np.sqrt(a**2 * se_b**2 + b**2 * se_a**2 + se_a**2 * se_b**2))
    return a * b, a * b - Z95 * se, a * b + Z95 * se


def translate_to_business(
    causal: EffectEstimate, sessions_per_day: float, gmv_per_day: float
) -> BusinessTranslation:
    """GMV per day per ms of mean latency at the observed traffic, with its interval."""
    return BusinessTranslation(
        sessions_per_day=sessions_per_day,
        gmv_per_day=gmv_per_day,
        gmv_per_day_per_ms=causal.value * sessions_per_day,
        ci_low=causal.ci_low * sessions_per_day,
        ci_high=causal.ci_high * sessions_per_day,
    )


def compare_slots(
    frame: pd.DataFrame, causal: EffectEstimate | None, sessions_per_day: float, min_per_slot: int
) -> SlotComparison:
    """Canary minus stable: latency difference (Welch), its implied GMV effect, measured GMV."""
    slots = frame["slot"].astype("object")
    stable, canary = frame.loc[slots == STABLE], frame.loc[slots == CANARY]
    counts: dict[str, Any] = {"stable_sessions": len(stable), "canary_sessions": len(canary)}
    if len(canary) == 0 or len(stable) == 0:
        missing = CANARY if len(canary) == 0 else STABLE
        return SlotComparison(
            available=False, reason=f"no {missing} sessions in the window", **counts
        )
    if min(len(stable), len(canary)) < min_per_slot:
        return SlotComparison(
            available=False,
            reason=f"too few sessions to compare slots (stable {len(stable)}, canary "
            f"{len(canary)}; need {min_per_slot} each)",
            **counts,
        )
    latency = stats.ttest_ind(canary[TREATMENT], stable[TREATMENT], equal_var=False)
    lat_ci = latency.confidence_interval(0.95)
    diff = float(canary[TREATMENT].mean() - stable[TREATMENT].mean())
    diff_se = (float(lat_ci.high) - float(lat_ci.low)) / (2 * Z95)
    gmv = stats.ttest_ind(canary[OUTCOME], stable[OUTCOME], equal_var=False)
    gmv_ci = gmv.confidence_interval(0.95)
    result = SlotComparison(
        available=True,
        reason="",
        stable_version=str(stable["model_version"].mode().iloc[0]),
        canary_version=str(canary["model_version"].mode().iloc[0]),
        stable_latency_ms=float(stable[TREATMENT].mean()),
        canary_latency_ms=float(canary[TREATMENT].mean()),
        latency_diff_ms=diff,
        latency_diff_ci=(float(lat_ci.low), float(lat_ci.high)),
        measured_gmv_diff=float(canary[OUTCOME].mean() - stable[OUTCOME].mean()),
        measured_gmv_diff_ci=(float(gmv_ci.low), float(gmv_ci.high)),
        **counts,
    )
    if causal is None:
        return result.model_copy(
            update={"reason": "no causal estimate to translate the difference"}
        )
    value, low, high = _product_interval(diff, diff_se, causal.value, causal.std_error)
    return result.model_copy(
        update={
            "implied_gmv_per_session": value,
            "implied_gmv_per_session_ci": (low, high),
            "implied_gmv_per_day": value * sessions_per_day,
            "implied_gmv_per_day_ci": (low * sessions_per_day, high * sessions_per_day),
        }
    )

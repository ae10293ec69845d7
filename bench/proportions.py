"""The interval a benchmark states for a share it counted (k of n runs)."""

from __future__ import annotations

import math


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """The Wilson score 95 % interval of a proportion k/n (Wilson 1927): what n runs can tell."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 5), round(min(1.0, centre + half), 5)]

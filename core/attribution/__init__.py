"""Root-cause attribution of a latency change: a causal graph of the request, exact Shapley
contributions of each mechanism's change, bootstrap intervals, and a calibration of them."""

from core.attribution.attribute import attribute_latency, failed_attribution
from core.attribution.graph import CAUSES, NODES, TARGET
from core.attribution.types import (
    AttributionConfig,
    AttributionStatus,
    Contribution,
    LatencyAttribution,
)

__all__ = [
    "CAUSES",
    "NODES",
    "TARGET",
    "AttributionConfig",
    "AttributionStatus",
    "Contribution",
    "LatencyAttribution",
    "attribute_latency",
    "failed_attribution",
]

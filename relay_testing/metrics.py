"""A serving worker's Prometheus figures, read over its /metrics endpoint: what tests wait on."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def worker_metric(http_url: str, name: str, **labels: str) -> float:
    """The sum of the worker's samples `name` whose labels include `labels` (0 if none)."""
    text = httpx.get(f"{http_url}/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def requests_answered(http_url: str, **labels: str) -> float:
    """Requests the worker has answered (by transport, slot, version, status as given)."""
    return worker_metric(http_url, "relay_requests_total", **labels)


def buffered_log_rows(http_url: str) -> float:
    """Log rows the worker holds in memory, not yet in a spool segment or ClickHouse."""
    return worker_metric(http_url, "relay_log_buffered_rows")

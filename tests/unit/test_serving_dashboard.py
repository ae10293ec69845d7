"""The shipped Grafana dashboard reads only series a worker exports, and /metrics has the stage
histograms and per-slot queue depth operators scale on."""

from __future__ import annotations

import json
import re
from pathlib import Path

from serving.batching import BatchTiming
from serving.metrics import ServingMetrics, WorkerSnapshot

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deployments" / "production" / "grafana" / "relay-serving.json"


def rendered() -> str:
    metrics = ServingMetrics()
    metrics.watch(
        lambda: WorkerSnapshot(
            ready=True,
            queue_depth=3,
            queue_depth_by_slot={"stable": 2, "canary": 1},
            canary_weight=5,
            canary_lease_seconds_left=80.0,
            canary_lease_expirations=0,
            injected_latency_ms={},
            injected_slowdown={},
            models=[],
            binary_connections=0,
            log_buffered_rows=0,
            log_rows={"spool": 1},
            spool_segments=0,
            spool_bytes=0,
            spool_cap_bytes=1,
            spool_over_cap=False,
            log_wal_ok=True,
            log_wal_failures=0,
            trace_spans={"recorded": 5, "exported": 3, "dropped": 2},
        )
    )
    metrics.observe_request("http", "canary", "v2", 200, "", 0.012)
    metrics.observe_stages("canary", 0.002, 0.001, 0.008, 0.001)
    metrics.observe_batch("v2", BatchTiming(requests=2, rows=40, started=0.0))
    return metrics.render().decode()


def test_metrics_have_stage_histograms_queue_depth_by_slot_and_dropped_spans() -> None:
    text = rendered()
    assert 'relay_stage_latency_seconds_bucket{le="0.01",slot="canary",stage="compute"} 1.0' in text
    assert 'relay_stage_latency_seconds_count{slot="canary",stage="queue"} 1.0' in text
    assert 'relay_batcher_queue_depth{slot="stable"} 2.0' in text
    assert "relay_trace_spans_dropped_total 2.0" in text
    assert 'relay_trace_spans_total{outcome="exported"} 3.0' in text


def test_every_series_the_dashboard_reads_is_exported() -> None:
    text = rendered()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    used = {
        name
        for panel in panels
        for target in panel["targets"]
        for name in re.findall(r"\brelay_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported
    assert any(
        "relay_stage_latency_seconds_bucket" in t["expr"] for p in panels for t in p["targets"]
    )

"""The canary's lease is renewed while its step runs, the reads that judge a window included.

A read of a busy embedded store can take longer than a lease. Renewed only during the windows,
the weight lapsed on a worker mid-step (bench.gate's live releases): that worker served the
canary's users from stable, and the split check flagged the step.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import tasks.canary_analysis as analysis
from core.gate.evidence import StepFigures
from core.gate.rules import CanaryRules
from core.gate.step import StepLength
from relay.settings import Settings
from relay.types import Release, Verdict
from serving.fleet import FleetClient, FleetResult

LEASE_S = 0.6
READ_S = 1.5  # each window's read: longer than two leases


class RecordingFleet(FleetClient):
    """A fleet client whose renewals are recorded, not sent (the real `renewing` loop runs)."""

    def __init__(self) -> None:  # no workers to call
        self.lease_s = LEASE_S
        self.renewals: list[float] = []

    def renew(self, lease_s: float | None = None) -> FleetResult:
        self.renewals.append(time.monotonic())
        return FleetResult("renew", True, "renew", "", [])

    def close(self) -> None:
        pass


def test_the_lease_is_renewed_through_slow_reads_not_only_while_windows_run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = RecordingFleet()
    reads: list[tuple[float, float]] = []

    def slow_read(*_: Any) -> StepFigures:
        started = time.monotonic()
        time.sleep(READ_S)
        reads.append((started, time.monotonic()))
        return StepFigures(None, None)  # no rows: inconclusive, the step looks again

    monkeypatch.setattr(FleetClient, "from_settings", classmethod(lambda cls, s: fleet))
    monkeypatch.setattr(analysis, "reader", lambda s: None)
    monkeypatch.setattr(analysis, "canary_started_at", lambda client, release: None)
    monkeypatch.setattr(analysis, "read_step_figures", slow_read)
    monkeypatch.setattr(analysis, "unreachable_workers", lambda s: [])
    monkeypatch.setattr(analysis, "record", lambda *a, **k: None)
    monkeypatch.setattr(analysis, "create_table_artifact", lambda **k: None)
    fast = settings.model_copy(
        update={"serving_canary_lease_s": LEASE_S, "serving_log_flush_ms": 10}
    )

    gate = analysis.analyse_canary_step.fn(
        fast, Release("r-lease", "v2", "test"), "v1", 5, CanaryRules(), 0.05, StepLength(2)
    )

    assert gate.verdict is Verdict.inconclusive and len(reads) == 2
    for started, ended in reads:  # renewed during every read, well within a lease of each other
        during = [t for t in fleet.renewals if started <= t <= ended]
        assert len(during) >= 2, (fleet.renewals, reads)
    gaps = [b - a for a, b in zip(fleet.renewals, fleet.renewals[1:], strict=False)]
    assert max(gaps) < LEASE_S, gaps

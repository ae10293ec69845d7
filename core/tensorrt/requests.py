"""Asking the gpu pool for TensorRT plans, decided: which queues to ask and what their runs and
records mean for the release. Pure; the Prefect shell that starts and waits for the plan builds
is `tasks.tensorrt.request_tensorrt_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from model_store.plans import PlanRecord


class PlanRequest(BaseModel):
    """What the release learnt from asking the gpu pool for plans: data, never an exception."""

    status: Literal["built", "rejected", "skipped", "pending", "error"]
    reason: str
    flow_run_ids: list[str] = []
    plans: list[str] = []  # GPU keys with an accepted plan


@dataclass(frozen=True)
class PlanRun:
    """Where one plan build (one work queue of the gpu pool, so one GPU model) stands."""

    flow_run_id: str
    state: str  # Prefect state type: COMPLETED, FAILED, RUNNING, SCHEDULED ...
    final: bool


@dataclass(frozen=True)
class GpuQueue:
    """One work queue of the gpu pool: prefect.yaml gives the pool one per GPU model."""

    name: str
    status: str  # Prefect's WorkQueueStatus: READY (a worker polled it lately), NOT_READY, PAUSED


def queues_to_ask(queues: list[GpuQueue]) -> list[str]:
    """The queues a plan build would be picked up from now: those a worker polls, not paused.

    A queue nobody polls (often `default`, once each GPU model has its own) would leave its run
    scheduled and the release waiting `tensorrt_wait_s` for a plan no host can build.
    """
    return sorted(q.name for q in queues if q.status == "READY")


def plan_request_outcome(runs: list[PlanRun], records: list[PlanRecord]) -> PlanRequest:
    """Read the gpu pool's answer: plans filed, all rejected, none (no CUDA there), or not yet."""
    ids = [r.flow_run_id for r in runs]
    accepted = sorted(r.gpu.key for r in records if r.accepted)
    waiting = [r for r in runs if not r.final]
    broken = [r for r in runs if r.final and r.state != "COMPLETED"]
    notes = (
        [f"{len(waiting)} build(s) still running: workers that load the version later use them"]
        if waiting
        else []
    )
    notes += [f"build {r.flow_run_id} ended {r.state}" for r in broken]
    if accepted:
        return PlanRequest(
            status="built",
            reason="; ".join([f"TensorRT plans for {', '.join(accepted)}", *notes]),
            flow_run_ids=ids,
            plans=accepted,
        )
    if records:
        rejected = [f"{r.gpu.key}: {r.reason}" for r in records]
        return PlanRequest(status="rejected", reason="; ".join(rejected + notes), flow_run_ids=ids)
    if waiting:
        return PlanRequest(status="pending", reason="; ".join(notes), flow_run_ids=ids)
    if broken:
        return PlanRequest(status="error", reason="; ".join(notes), flow_run_ids=ids)
    return PlanRequest(
        status="skipped",
        reason="skipped: the gpu pool filed no plan: its worker hosts have no CUDA device or "
        "tensorrt (each run's tensorrt-plan artifact says which)",
        flow_run_ids=ids,
    )

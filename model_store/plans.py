"""TensorRT plans kept beside a version: one record per GPU target, written once.

A version's manifest is written once, on the `cpu` pool, before any GPU host has seen the model;
a plan is built later on each GPU model that serves it. So plans cannot be in the manifest: each
is an attachment of the version (kind `tensorrt-plan`, named by the GPU key) whose record names
the plan blob (stored content-addressed like every engine, kept by gc because the attachment
references it), its build options, its build hash and its parity result. First writer wins, as
for calibration reports.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from model_store.attachments import AttachmentExists
from model_store.store import ModelStore
from relay.gpu import GpuTarget
from relay.types import EngineRecord, ParityResult


class PlanRecord(BaseModel):
    """A TensorRT plan of one version for one GPU target, and whether it may serve."""

    version: str
    gpu: GpuTarget
    accepted: bool  # built and within parity tolerance: a worker on this GPU may load it
    reason: str
    engine: EngineRecord | None  # None when the plan was rejected: no blob is kept for it
    parity: ParityResult | None
    build_hash: str  # core.lineage.hashing.build_hash over this plan's bytes and options
    built_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


PLAN_KIND = "tensorrt-plan"


def load_plan_record(store: ModelStore, version: str, gpu_key: str) -> PlanRecord | None:
    """The stored plan record of a version for one GPU target, if one was built."""
    raw = store.get_attachment(version, PLAN_KIND, gpu_key)
    return None if raw is None else PlanRecord.model_validate_json(raw)


def save_plan_record(store: ModelStore, record: PlanRecord) -> PlanRecord:
    """Store the record once; if another host of the same GPU target won the race, return theirs."""
    data = record.model_dump_json(indent=2).encode()
    blobs = {"plan": record.engine.blob} if record.engine is not None else {}
    try:
        store.put_attachment(record.version, PLAN_KIND, record.gpu.key, data, blobs=blobs)
    except AttachmentExists as exc:
        return PlanRecord.model_validate_json(store.read_attachment(exc.existing))
    return record


def list_plan_records(store: ModelStore, version: str) -> list[PlanRecord]:
    """Every plan record of a version, one per GPU target that built it."""
    return [
        PlanRecord.model_validate_json(store.read_attachment(attachment))
        for attachment in store.list_attachments(version, PLAN_KIND)
    ]

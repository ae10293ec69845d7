"""TensorRT plans kept beside a version: one record per GPU target, written once.

A version's manifest is written once, on the `cpu` pool, before any GPU host has seen the model;
a plan is built later on each GPU model that serves it. So plans cannot be in the manifest: each
lives as a record `versions/<version>/tensorrt/<gpu key>.json` that names the plan blob (stored
content-addressed like every engine, kept by gc because the record references it), its build
options, its build hash and its parity result. First writer wins, as for calibration reports.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

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
    build_hash: str  # tasks.lineage.build_hash over this plan's bytes and options
    built_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def plan_record_key(version: str, gpu_key: str) -> str:
    return f"versions/{version}/tensorrt/{gpu_key}.json"


def load_plan_record(store: ModelStore, version: str, gpu_key: str) -> PlanRecord | None:
    """The stored plan record of a version for one GPU target, if one was built."""
    try:
        raw = store.backend.get_bytes(plan_record_key(version, gpu_key))
    except KeyError:
        return None
    return PlanRecord.model_validate_json(raw)


def save_plan_record(store: ModelStore, record: PlanRecord) -> PlanRecord:
    """Store the record once; if another host of the same GPU target won the race, return theirs."""
    store.get_manifest(record.version)  # never filed under a version that is not there
    key = plan_record_key(record.version, record.gpu.key)
    data = record.model_dump_json(indent=2).encode()
    if not store.backend.put_bytes(key, data, exclusive=True):
        return load_plan_record(store, record.version, record.gpu.key) or record
    return record


def list_plan_records(store: ModelStore, version: str) -> list[PlanRecord]:
    """Every plan record of a version, one per GPU target that built it."""
    return [
        PlanRecord.model_validate_json(store.backend.get_bytes(key))
        for key in store.backend.list_keys(f"versions/{version}/tensorrt/")
        if key.endswith(".json")
    ]

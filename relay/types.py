"""Domain types shared by tasks, flows, the model store and the serving worker."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

LINEAGE_PARTS = ("model", "data", "env", "build")
LINEAGE_PREFIX = 12  # hex characters of each sha256 shown in the id


class Stored(BaseModel):
    """A model written as JSON and read back: NaN and ±inf survive the trip.

    JSON has no NaN; pydantic writes it as `null` by default, which no float field reads back,
    so the record of a numerically broken candidate (the very one worth reading) would be
    unreadable. Written as the strings "NaN", "Infinity", "-Infinity", it reads back as floats.
    """

    model_config = ConfigDict(ser_json_inf_nan="strings")


class Verdict(StrEnum):
    """What a gate decided. Only `passed` lets a release continue.

    `invalid`: the evidence itself is biased (the canary split does not match its weights), so
    it may decide nothing: the weights hold and a person is asked, never an automatic promotion
    or rollback.
    """

    passed = "passed"
    failed = "failed"
    inconclusive = "inconclusive"
    error = "error"
    invalid = "invalid"


class GateResult(Stored):
    """A gate's typed verdict with what it measured, the limits it applied, how, and why."""

    gate: str
    verdict: Verdict
    reason: str
    measurements: dict[str, float] = Field(default_factory=dict)
    thresholds: dict[str, float] = Field(default_factory=dict)
    method: str = ""  # the statistical method, where the verdict rests on one
    # Why latency changed, where a latency regression was found (tasks.attribution's as_dict)
    attribution: dict[str, Any] | None = None


class ReleaseOutcome(StrEnum):
    """How a release ended: the outcome artifact's title and the `outcome` release event."""

    registered = "registered"  # published; the release has not gone further (yet)
    not_deployed = "not_deployed"  # no blessing: never reached the fleet
    blessed = "blessed"  # blessed, deploy=false
    unchanged = "unchanged"  # the fleet already serves it
    promoted = "promoted"  # now stable everywhere and champion
    rolled_back = "rolled_back"  # the canary was taken out; champion unchanged
    refused = (
        "refused"  # loaded beside the fleet, refused before any user saw it (capacity, shadow)
    )


class CanaryRemoval(StrEnum):
    """Why a canary is taken out of traffic. Every path that takes one out names its reason:
    the release events, the worker's log and its state say which path acted."""

    verdict = "verdict"  # the release's gate failed or a person said no: the deploy's on_rollback
    release_ended = "release_ended"  # the release run crashed or was cancelled: the flow's hook
    orphaned = "orphaned"  # the guard found a canary with no live release behind it
    champion_rollback = "champion_rollback"  # a champion rollback clears any canary first
    operator = "operator"  # a person (or a bench) at the fleet's admin API
    lease_expired = "lease_expired"  # worker-side: no renewal within the lease (weight 0 only)


@dataclass(frozen=True)
class Release:
    """Which release this is: every event it writes carries these."""

    release_id: str
    version: str
    lineage_id: str


class LineageId(BaseModel, frozen=True):
    """The four-part id `{model}_{data}_{env}_{build}`: full sha256 hex digests of each part."""

    model: str
    data: str
    env: str
    build: str

    def __str__(self) -> str:
        return "_".join(getattr(self, part)[:LINEAGE_PREFIX] for part in LINEAGE_PARTS)

    @classmethod
    def parse(cls, text: str) -> LineageId:
        """Parse the printed form (prefixes). Raises ValueError naming what is wrong."""
        pieces = text.strip().split("_")
        if len(pieces) != 4 or not all(
            p and all(c in "0123456789abcdef" for c in p) for p in pieces
        ):
            raise ValueError(
                f"lineage id must be four hex parts joined by '_' (model_data_env_build), got {text!r}"
            )
        return cls(**dict(zip(LINEAGE_PARTS, pieces, strict=True)))

    def differing_parts(self, other: LineageId) -> list[str]:
        """Names of the parts whose hashes differ (compared on the shorter of the two)."""
        changed = []
        for part in LINEAGE_PARTS:
            a, b = getattr(self, part), getattr(other, part)
            n = min(len(a), len(b))
            if a[:n] != b[:n]:
                changed.append(part)
        return changed


class BlobRef(BaseModel):
    """A content-addressed blob: its sha256 and size in bytes."""

    sha256: str
    size: int


class EngineRecord(BaseModel):
    """A compiled engine in a version: which runtime, its file and how it was built."""

    name: str  # "ort-fp32", "ort-int8", "trt-fp16"
    blob: BlobRef
    options: dict[str, Any] = Field(default_factory=dict)


class ParityResult(BaseModel):
    """How closely one engine reproduces the PyTorch reference on the holdout."""

    engine: str
    accepted: bool
    reason: str
    max_abs_diff: float
    auc_delta: float
    topk_overlap: float
    tolerances: dict[str, float]


class VersionManifest(BaseModel):
    """Everything a version is: written last, after every blob it lists is stored."""

    version: str
    created_at: datetime
    lineage: LineageId
    lineage_id: str
    metrics: dict[str, float] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    blobs: dict[str, BlobRef] = Field(default_factory=dict)  # "model.onnx", "weights.pt" ...
    engines: list[EngineRecord] = Field(default_factory=list)
    parity: list[ParityResult] = Field(default_factory=list)
    lineage_sources: dict[str, Any] = Field(default_factory=dict)
    mlflow_run_id: str | None = None


class AliasEvent(BaseModel):
    """One move of an alias: append-only, so history answers 'who held champion when, and why'."""

    alias: str
    version: str | None  # None = alias cleared
    previous: str | None
    actor: str
    reason: str
    at: datetime

"""What a routing-table slot holds (`Served`) and one request from arrival to log row (`Exchange`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from opentelemetry.context import Context
from opentelemetry.trace import Span

from serving.batching import Batcher, BatchTiming
from serving.engine import LoadedModel
from serving.routing import Injection
from serving.schema import RequestRejected
from serving.tracing import parent_context


@dataclass(eq=False)
class Served:
    """A loaded model with its batcher: what a routing-table slot holds."""

    model: LoadedModel
    batcher: Batcher

    @property
    def version(self) -> str:
        return self.model.version


@dataclass(slots=True)
class Exchange:
    """One request from arrival to log row; the transports fill and read it."""

    transport: str
    ts: float  # wall clock at arrival, for the log row
    t0: float  # perf_counter at arrival
    request_id: str = ""
    user_id: int = 0
    session_id: str = ""
    input_bytes: int = 0
    rows: int = 0
    parent: Context | None = None  # the caller's trace, from its traceparent
    traceparent: str = ""  # this request's span, echoed in the answer once recorded
    span: Span | None = None  # set when recorded; an admin call's while it runs
    slot: str = ""
    version: str = ""
    lineage_id: str = ""
    t_enqueued: float = 0.0
    injection: Injection | None = None
    injected_s: float = 0.0  # what the injection actually added, booked to its stage
    ranking: str = "model"  # how the slot ranks its answer (routing.RANKINGS)
    scores: np.ndarray | None = None
    batch: BatchTiming | None = None
    status: int = 200
    error_code: str = ""
    detail: str = ""

    def reject(self, rejection: RequestRejected) -> None:
        self.status, self.error_code, self.detail = (
            rejection.status,
            rejection.code,
            rejection.detail,
        )

    def trace_from(self, traceparent: object) -> None:
        """Join the caller's trace; a missing or malformed traceparent starts a new one."""
        self.parent = parent_context(traceparent)

    def error_body(self) -> dict[str, Any]:
        return {"error": self.error_code, "detail": self.detail, "request_id": self.request_id}

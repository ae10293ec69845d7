"""The impact report's record kept in the store: where a report's files went, and what it found.

Here, beside the store, because the store's own users read and refile it (`relay store migrate`)
and may not reach up into the domain core. The analysis that produces a report and the code that
files it are `core.impact`; they name these types through `core.impact.types`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel

from relay.types import BlobRef, Stored

REPORT_KIND = "impact-report"  # attachments of a version, or of the store (model_store.attachments)


class ImpactFinding(StrEnum):
    """What the report concludes, strongest claim last."""

    no_data = "no_data"
    insufficient_data = "insufficient_data"
    refuted = "refuted"
    estimators_disagree = "estimators_disagree"
    no_detectable_effect = "no_detectable_effect"
    effect_detected = "effect_detected"


class ImpactWindow(BaseModel, frozen=True):
    """Sessions that start in [start, end), UTC."""

    start: datetime
    end: datetime

    @property
    def days(self) -> float:
        return (self.end - self.start).total_seconds() / 86_400

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


class StoredImpactReport(Stored):
    """Where a report's files went: blobs in the model store and the record that lists them."""

    report_id: str
    created_at: datetime
    attached_to: str | None
    record_key: str
    window: ImpactWindow
    versions: list[str]
    finding: ImpactFinding
    headline: str
    blobs: dict[str, BlobRef]
    html_url: str
    json_url: str

"""The blessing records kept beside versions: each version's calibration report, and the one
calibration set beside the store that every release is assessed on.

They live here, beside the store, because the store's own users read and write them (deploy and
rollback read a blessing, `relay store migrate` refiles old ones) and none of those may reach up
into `tasks/`. The assessment that writes a report is `core.calibration`; the Prefect shell is
`tasks.calibration`. First writer wins, as for every attachment.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from model_store.attachments import AttachmentExists
from model_store.store import ModelStore
from relay.types import BlobRef, GateResult, Stored

# Attachments (model_store.attachments): the report beside each version it assesses, and the
# one calibration set beside the store that every release is assessed on.
REPORT_KIND, REPORT_NAME = "calibration", "report"
CALIBRATION_SET_KIND, CALIBRATION_SET_NAME = "calibration-set", "current"


class ScoreMetrics(Stored):
    auc: float
    logloss: float
    ece: float
    mean_score: float
    score_std: float
    finite: bool


class CalibrationReport(Stored):
    """The blessing record stored next to a version; deploy consumes it."""

    version: str
    baseline_version: str | None
    calibration_set: BlobRef
    candidate: ScoreMetrics
    baseline: ScoreMetrics | None
    kl_divergence: float | None
    checks: list[GateResult]
    blessed: bool
    notes: list[str] = Field(default_factory=list)
    assessed_at: datetime


def load_report(store: ModelStore, version: str) -> CalibrationReport | None:
    """The stored blessing record of a version, if it was assessed."""
    raw = store.get_attachment(version, REPORT_KIND, REPORT_NAME)
    return None if raw is None else CalibrationReport.model_validate_json(raw)


def save_report(store: ModelStore, report: CalibrationReport) -> CalibrationReport:
    """Store the report next to the version, once: a version is assessed against one baseline.

    If another run stored one first, that one stands and is returned.
    """
    data = report.model_dump_json(indent=2).encode()
    blobs = {"calibration-set": report.calibration_set}
    try:
        store.put_attachment(report.version, REPORT_KIND, REPORT_NAME, data, blobs=blobs)
    except AttachmentExists as exc:
        return CalibrationReport.model_validate_json(store.read_attachment(exc.existing))
    return report


def current_calibration_set(store: ModelStore) -> BlobRef | None:
    """The calibration set every release is assessed on, if a release has fixed one."""
    raw = store.get_attachment(None, CALIBRATION_SET_KIND, CALIBRATION_SET_NAME)
    return None if raw is None else BlobRef.model_validate_json(raw)


def fix_calibration_set(store: ModelStore, ref: BlobRef) -> BlobRef:
    """Make `ref` the calibration set unless one is fixed already; the set that stands."""
    try:
        store.put_attachment(
            None,
            CALIBRATION_SET_KIND,
            CALIBRATION_SET_NAME,
            ref.model_dump_json().encode(),
            blobs={"calibration-set": ref},
        )
    except AttachmentExists as exc:  # a concurrent first release fixed it first
        return BlobRef.model_validate_json(store.read_attachment(exc.existing))
    return ref

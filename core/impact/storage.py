"""Filing impact reports in the model store: HTML and JSON blobs, then the attachment listing them."""

from __future__ import annotations

from pathlib import Path

from core.impact.experiment_types import ReleaseExperiment
from core.impact.kinds import EXPERIMENT_KIND, REPORT_KIND
from core.impact.pages import publish_page
from core.impact.types import ImpactReport, StoredImpactReport
from model_store import ModelStore
from model_store.attachments import Attachment, attachment_key

__all__ = ["EXPERIMENT_KIND", "REPORT_KIND"]  # named where they are filed too


def store_report_files(
    store: ModelStore,
    report: ImpactReport,
    html_path: Path,
    json_path: Path,
    attach_to: str | None,
) -> StoredImpactReport:
    """Store the HTML and JSON as blobs, then the record that lists them (written last, once).

    The record is an attachment of the version (of the store when `attach_to` is None) that
    references both blobs, so gc keeps them.
    """
    if attach_to:
        store.get_manifest(attach_to)  # raises VersionNotFound: never attach to a missing version
    blobs = {"report.html": store.put_blob(html_path), "report.json": store.put_blob(json_path)}
    report_id = (
        f"{report.generated_at.strftime('%Y%m%dT%H%M%S%fZ')}-{blobs['report.json'].sha256[:12]}"
    )
    version = attach_to or None
    record = StoredImpactReport(
        report_id=report_id,
        created_at=report.generated_at,
        attached_to=attach_to,
        record_key=attachment_key(version, REPORT_KIND, report_id),
        window=report.window,
        versions=report.versions,
        finding=report.finding,
        headline=report.headline,
        blobs=blobs,
        html_url=store.locate_blob(blobs["report.html"]),
        json_url=store.locate_blob(blobs["report.json"]),
        page_url=publish_page(store, REPORT_KIND, report_id, html_path.read_text(encoding="utf-8")),
        elasticity=report.causal.value if report.causal else None,
        elasticity_ci=(report.causal.ci_low, report.causal.ci_high) if report.causal else None,
    )
    data = record.model_dump_json(indent=2).encode()
    store.put_attachment(version, REPORT_KIND, report_id, data, blobs=blobs)
    return record


def list_impact_reports(store: ModelStore, version: str | None = None) -> list[StoredImpactReport]:
    """Stored impact reports of a version (or the unattached ones), oldest first."""
    return [
        StoredImpactReport.model_validate_json(store.read_attachment(attachment))
        for attachment in store.list_attachments(version, REPORT_KIND)
    ]


def store_experiment(store: ModelStore, experiment: ReleaseExperiment) -> Attachment:
    """File a release's experiment beside its version, once (named by the release id).

    Filing the same record again is a no-op; a different one for the same release raises
    AttachmentExists: an experiment is a measurement, never rewritten.
    """
    data = experiment.model_dump_json(indent=2).encode()
    return store.put_attachment(experiment.version, EXPERIMENT_KIND, experiment.release_id, data)


def list_experiments(store: ModelStore, version: str) -> list[ReleaseExperiment]:
    """The experiments filed beside a version (one per release of it), by release id."""
    return [
        ReleaseExperiment.model_validate_json(store.read_attachment(attachment))
        for attachment in store.list_attachments(version, EXPERIMENT_KIND)
    ]

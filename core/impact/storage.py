"""Filing impact reports in the model store: HTML and JSON blobs, then the attachment listing them."""

from __future__ import annotations

from pathlib import Path

from core.impact.types import ImpactReport, StoredImpactReport
from model_store import ModelStore
from model_store.attachments import attachment_key
from model_store.impact_records import REPORT_KIND


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

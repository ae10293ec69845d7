"""Filing impact reports in the model store: HTML and JSON blobs, then the record listing them."""

from __future__ import annotations

from pathlib import Path

from model_store import ModelStore
from model_store.store import blob_key
from relay.errors import StoreError
from tasks.impact_types import ImpactReport, StoredImpactReport

REPORT_KIND = "impact-report"


def record_key_for(attach_to: str | None, report_id: str) -> str:
    """Versions' reports live beside their manifest; others under reports/impact/."""
    if attach_to:
        return f"versions/{attach_to}/attachments/{REPORT_KIND}/{report_id}.json"
    return f"reports/impact/{report_id}.json"


def store_report_files(
    store: ModelStore,
    report: ImpactReport,
    html_path: Path,
    json_path: Path,
    attach_to: str | None,
) -> StoredImpactReport:
    """Store the HTML and JSON as blobs, then the record that lists them (written last, once).

    The record's `blobs` field names every blob it references, in the same shape as a
    manifest's, so store-wide tools (gc) can find the references.
    """
    if attach_to:
        store.get_manifest(attach_to)  # raises VersionNotFound: never attach to a missing version
    blobs = {"report.html": store.put_blob(html_path), "report.json": store.put_blob(json_path)}
    report_id = (
        f"{report.generated_at.strftime('%Y%m%dT%H%M%S%fZ')}-{blobs['report.json'].sha256[:12]}"
    )
    record = StoredImpactReport(
        report_id=report_id,
        created_at=report.generated_at,
        attached_to=attach_to,
        record_key=record_key_for(attach_to, report_id),
        window=report.window,
        versions=report.versions,
        finding=report.finding,
        headline=report.headline,
        blobs=blobs,
        html_url=store.backend.locate(blob_key(blobs["report.html"].sha256)),
        json_url=store.backend.locate(blob_key(blobs["report.json"].sha256)),
    )
    if not store.backend.put_bytes(
        record.record_key, record.model_dump_json(indent=2).encode(), exclusive=True
    ):
        raise StoreError(f"impact report record {record.record_key} already exists")
    return record


def list_impact_reports(store: ModelStore, version: str | None = None) -> list[StoredImpactReport]:
    """Stored impact reports of a version (or the unattached ones), oldest first."""
    prefix = record_key_for(version, "x").rsplit("/", 1)[0] + "/"
    return [
        StoredImpactReport.model_validate_json(store.backend.get_bytes(key))
        for key in store.backend.list_keys(prefix)
        if key.endswith(".json")
    ]

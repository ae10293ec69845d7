"""One-off migration of records filed before attachments existed onto the attachments API.

Stores written before `model_store.attachments` hold four kinds of records at their old keys:

    versions/<v>/calibration.json                        -> (v, "calibration", "report")
    calibration/current.json                             -> (None, "calibration-set", "current")
    versions/<v>/tensorrt/<gpu key>.json                 -> (v, "tensorrt-plan", <gpu key>)
    versions/<v>/attachments/impact-report/<id>.json     -> (v, "impact-report", <id>)  (same key)
    reports/impact/<id>.json                             -> (None, "impact-report", <id>)

Until they are migrated, deploy and rollback find no blessing. `migrate_records` reads each old
record through the backend, validates it with its model and files it with the writer the
pipeline itself uses (`save_report`, `fix_calibration_set`, `save_plan_record`; impact records
with the same serialisation as `store_report_files`), so the content bytes are exactly what a
new writer would have stored. It is idempotent: a record whose attachment is already filed
counts as "already done", and a second run changes nothing.

Old objects are never deleted: gc keeps honouring the blob references in them (see
`RECORD_PREFIXES` in model_store.store), and the new envelopes reference the same blobs, so
nothing is lost either way. Delete the old keys by hand once every reader is upgraded, if at all.

The one exception is a version's impact record, whose old key *is* the new envelope's key: it
is converted in place. That is safe because

- the content blob (the record re-serialised) is written, and every blob it references
  confirmed present, before the object is replaced, so at no moment does the key name content
  that is not stored;
- a backend write is atomic (model_store.backend: readers see all of an object or none), so a
  reader sees either the old record or the complete envelope;
- the object is re-read just before the replace and left alone if it is an envelope already;
  nothing else writes that key (new writers file create-if-absent and lose to the existing
  object), and two migrations racing write byte-identical envelopes (the content blob is
  content-addressed and the envelope's JSON is deterministic), so the last write is harmless;
- the envelope's content is the same record, validated, so no information is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from model_store.attachments import Attachment, attachment_key, attachments_prefix
from model_store.calibration import (
    CALIBRATION_SET_KIND,
    CALIBRATION_SET_NAME,
    REPORT_KIND,
    REPORT_NAME,
    CalibrationReport,
    fix_calibration_set,
    save_report,
)
from model_store.impact_records import REPORT_KIND as IMPACT_KIND
from model_store.impact_records import StoredImpactReport
from model_store.plans import PLAN_KIND, PlanRecord, save_plan_record
from model_store.store import ModelStore
from relay.errors import RelayError
from relay.types import BlobRef

OLD_CALIBRATION_POINTER = "calibration/current.json"
OLD_IMPACT_PREFIX = "reports/impact/"
KINDS = (REPORT_KIND, CALIBRATION_SET_KIND, PLAN_KIND, IMPACT_KIND)
# (store, old key, its bytes) -> "migrated", "in place" or "already done"
Migrator = Callable[[ModelStore, str, bytes], str]


@dataclass
class KindCounts:
    migrated: int = 0
    already_done: int = 0
    unreadable: list[str] = field(default_factory=list)  # "<old key>: <reason>"


@dataclass
class MigrationReport:
    """Per attachment kind: records migrated, found migrated already, and unreadable ones."""

    kinds: dict[str, KindCounts] = field(default_factory=lambda: {k: KindCounts() for k in KINDS})
    converted_in_place: list[str] = field(default_factory=list)  # keys replaced by an envelope

    @property
    def unreadable(self) -> list[str]:
        return [item for counts in self.kinds.values() for item in counts.unreadable]


def migrate_records(store: ModelStore) -> MigrationReport:
    """File every old-layout record as an attachment; never deletes an old object."""
    report = MigrationReport()
    backend = store.backend
    for version in store.list_versions():
        _migrate(report, REPORT_KIND, f"versions/{version}/calibration.json", store, _report)
        for key in backend.list_keys(f"versions/{version}/tensorrt/"):
            if key.endswith(".json"):
                _migrate(report, PLAN_KIND, key, store, _plan)
        for key in backend.list_keys(attachments_prefix(version, IMPACT_KIND)):
            if key.endswith(".json"):
                _migrate(report, IMPACT_KIND, key, store, _impact_in_place)
    _migrate(report, CALIBRATION_SET_KIND, OLD_CALIBRATION_POINTER, store, _calibration_set)
    for key in backend.list_keys(OLD_IMPACT_PREFIX):
        if key.endswith(".json"):
            _migrate(report, IMPACT_KIND, key, store, _impact_of_store)
    return report


def _migrate(
    report: MigrationReport, kind: str, key: str, store: ModelStore, how: Migrator
) -> None:
    counts = report.kinds[kind]
    try:
        raw = store.backend.get_bytes(key)
    except KeyError:
        return  # no such old record
    try:
        outcome = how(store, key, raw)
    except (RelayError, ValidationError, ValueError) as exc:
        counts.unreadable.append(f"{key}: {exc}")
        return
    if outcome == "migrated":
        counts.migrated += 1
    elif outcome == "in place":
        counts.migrated += 1
        report.converted_in_place.append(key)
    else:
        counts.already_done += 1


def _version_of(key: str) -> str:
    return key.split("/")[1]


def _report(store: ModelStore, key: str, raw: bytes) -> str:
    record = CalibrationReport.model_validate_json(raw)
    if record.version != _version_of(key):
        raise ValueError(f"the report is of version {record.version}, not {_version_of(key)}")
    if store.find_attachment(record.version, REPORT_KIND, REPORT_NAME) is not None:
        return "already done"
    save_report(store, record)
    return "migrated"


def _calibration_set(store: ModelStore, key: str, raw: bytes) -> str:
    ref = BlobRef.model_validate_json(raw)
    if store.find_attachment(None, CALIBRATION_SET_KIND, CALIBRATION_SET_NAME) is not None:
        return "already done"
    fix_calibration_set(store, ref)
    return "migrated"


def _plan(store: ModelStore, key: str, raw: bytes) -> str:
    record = PlanRecord.model_validate_json(raw)
    name = key.rsplit("/", 1)[1].removesuffix(".json")
    if record.version != _version_of(key) or record.gpu.key != name:
        raise ValueError(f"the record is of {record.version}/{record.gpu.key}, not its key's")
    if store.find_attachment(record.version, PLAN_KIND, name) is not None:
        return "already done"
    save_plan_record(store, record)
    return "migrated"


def _impact_content(
    store: ModelStore, raw: bytes, version: str | None, report_id: str
) -> tuple[bytes, dict[str, BlobRef]]:
    """The record as `store_report_files` serialises it, with the key and links it would write."""
    record = StoredImpactReport.model_validate_json(raw)
    if record.report_id != report_id or (record.attached_to or None) != version:
        raise ValueError(f"the record is of {record.attached_to}/{record.report_id}, not its key's")
    record = record.model_copy(
        update={
            "record_key": attachment_key(version, IMPACT_KIND, report_id),
            "html_url": store.locate_blob(record.blobs["report.html"]),
            "json_url": store.locate_blob(record.blobs["report.json"]),
        }
    )
    return record.model_dump_json(indent=2).encode(), record.blobs


def _impact_of_store(store: ModelStore, key: str, raw: bytes) -> str:
    report_id = key.removeprefix(OLD_IMPACT_PREFIX).removesuffix(".json")
    if store.find_attachment(None, IMPACT_KIND, report_id) is not None:
        return "already done"
    data, blobs = _impact_content(store, raw, None, report_id)
    store.put_attachment(None, IMPACT_KIND, report_id, data, blobs=blobs)
    return "migrated"


def _is_envelope(raw: bytes) -> bool:
    try:
        Attachment.model_validate_json(raw)
    except ValidationError:
        return False
    return True


def _impact_in_place(store: ModelStore, key: str, raw: bytes) -> str:
    """Replace an old impact record with the envelope of the same record (safe: see module doc)."""
    if _is_envelope(raw):
        return "already done"
    version, report_id = _version_of(key), key.rsplit("/", 1)[1].removesuffix(".json")
    data, blobs = _impact_content(store, raw, version, report_id)
    doing = f"migrating impact report {key}"
    refs = dict(sorted(blobs.items()))
    for ref in refs.values():
        store.confirm_blob(ref, doing)
    envelope = Attachment(
        version=version,
        kind=IMPACT_KIND,
        name=report_id,
        content=store.put_bytes_blob(data, doing),  # written before the object is replaced
        blobs=refs,
    )
    if _is_envelope(store.backend.get_bytes(key)):  # another migration got here first
        return "already done"
    store.backend.put_bytes(key, envelope.model_dump_json(indent=2).encode())
    return "in place"

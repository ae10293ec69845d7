"""The model store: content-addressed blobs, write-once manifests, aliases with history.

Layout (the same on every backend):
    blobs/sha256/<aa>/<digest>             write-once bytes, named by their sha256
    leases/sha256/<digest>                 "a writer is about to reference this blob" (for gc)
    versions/<version>/manifest.json       written last, create-if-absent
    versions/<version>/attachments/<kind>/<name>.json
                                           a record filed beside the version, create-if-absent
    attachments/<kind>/<name>.json         a record filed beside the store (model_store.attachments)
    aliases/<alias>/<seq:08d>.json         one immutable object per move: the history
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import ValidationError

from model_store.attachments import (
    Attachment,
    AttachmentExists,
    attachment_key,
    attachments_prefix,
    describe_attachment,
    is_attachment_key,
)
from model_store.backend import Backend
from model_store.gc import GcPlan, GcReport, _digest_of, plan_gc  # noqa: F401 - re-exported
from model_store.hashing import BackgroundDigest, sha256_file
from relay.errors import BlobMissing, IntegrityError, StoreError, VersionExists, VersionNotFound
from relay.types import AliasEvent, BlobRef, VersionManifest

CHUNK = 4 * 1024 * 1024
_ALIAS_RACE_RETRIES = 20


def blob_key(sha256: str) -> str:
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


def lease_key(sha256: str) -> str:
    return f"leases/sha256/{sha256}"


def manifest_key(version: str) -> str:
    return f"versions/{version}/manifest.json"


def _is_manifest_key(key: str) -> bool:
    parts = key.split("/")
    return len(parts) == 3 and parts[0] == "versions" and parts[2] == "manifest.json"


def version_at(history: Iterable[AliasEvent], when: datetime) -> str | None:
    """The version an alias pointed at, at a given time, from its history (oldest first)."""
    current = None
    for event in history:
        if event.at > when:
            break
        current = event.version
    return current


def _check_name(kind: str, name: str) -> None:
    if not name or "/" in name or name.startswith(".") or len(name) > 200:
        raise ValueError(f"invalid {kind} name {name!r}: non-empty, no '/', no leading '.'")


class ModelStore:
    """Versions of the model with their blobs and aliases, over any Backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    # -- blobs ---------------------------------------------------------------------------------
    def put_blob(self, path: Path) -> BlobRef:
        """Store a file under its sha256 (deduplicated) and return its reference.

        The upload is confirmed (present, right size) before returning, and a lease tells a
        concurrent gc that this blob is about to be referenced even when it was already stored.
        """
        digest, size = sha256_file(path)
        ref = BlobRef(sha256=digest, size=size)
        stored = self.backend.stat(blob_key(digest))
        if stored is None or stored.size != size:  # a short object here is damage, not a copy
            self.backend.put_file(blob_key(digest), path)
            self.confirm_blob(ref, f"uploading {path.name}")
        self._lease(ref)
        return ref

    def put_bytes_blob(self, data: bytes, doing: str) -> BlobRef:
        """put_blob for bytes already in memory (records, not engines)."""
        ref = BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        stored = self.backend.stat(blob_key(ref.sha256))
        if stored is None or stored.size != ref.size:
            self.backend.put_bytes(blob_key(ref.sha256), data)
            self.confirm_blob(ref, doing)
        self._lease(ref)
        return ref

    def _lease(self, ref: BlobRef) -> None:
        self.backend.put_bytes(lease_key(ref.sha256), datetime.now(UTC).isoformat().encode())

    def locate_blob(self, ref: BlobRef) -> str:
        """The full address of a blob, for messages and links (never credentials)."""
        return self.backend.locate(blob_key(ref.sha256))

    def describe(self) -> str:
        """Where the store lives, for messages (never credentials)."""
        return self.backend.describe()

    def confirm_blob(self, ref: BlobRef, doing: str) -> None:
        """Raise BlobMissing or IntegrityError (naming `doing`) unless the blob is stored whole."""
        key = blob_key(ref.sha256)
        stored = self.backend.stat(key)
        if stored is None:
            raise BlobMissing(
                f"{doing}: blob {self.backend.locate(key)} is not stored (expected sha256 {ref.sha256})"
            )
        if stored.size != ref.size:
            raise IntegrityError(
                f"{doing}: blob {self.backend.locate(key)} holds {stored.size} bytes, "
                f"expected {ref.size} (sha256 {ref.sha256})"
            )

    def fetch_blob(self, ref: BlobRef, dest: Path) -> Path:
        """Download a blob to dest, verifying its hash while streaming; dest appears only if valid."""
        key = blob_key(ref.sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
        digest = BackgroundDigest()
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    for chunk in self.backend.iter_chunks(key, CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                except KeyError as exc:
                    raise BlobMissing(
                        f"blob {self.backend.locate(key)} is missing (expected sha256 {ref.sha256})"
                    ) from exc
            actual = digest.hexdigest()
            if actual != ref.sha256:
                raise IntegrityError(
                    f"blob {self.backend.locate(key)} is corrupted: "
                    f"expected sha256 {ref.sha256}, got {actual}"
                )
            os.replace(tmp_name, dest)
            return dest
        finally:
            digest.close()
            Path(tmp_name).unlink(missing_ok=True)

    # -- versions ------------------------------------------------------------------------------
    def publish(self, manifest: VersionManifest) -> VersionManifest:
        """Write a version's manifest, last and once. Identical lineage re-publishes idempotently.

        Every listed blob is confirmed (present, right size) first. Raises BlobMissing or
        IntegrityError if one is not, and VersionExists if the version holds different content.
        """
        _check_name("version", manifest.version)
        refs = _blob_refs(manifest)
        for ref in refs:
            self.confirm_blob(ref, f"cannot publish {manifest.version}")
        data = manifest.model_dump_json(indent=2).encode()
        if not self.backend.put_bytes(manifest_key(manifest.version), data, exclusive=True):
            existing = self.get_manifest(manifest.version)
            if existing.lineage_id != manifest.lineage_id:
                raise VersionExists(
                    f"version {manifest.version} already exists with lineage "
                    f"{existing.lineage_id}, refusing to overwrite it with {manifest.lineage_id}"
                )
            return existing
        # gc spares recently leased blobs, so this only fails when a publish took longer than
        # gc's grace period; say so rather than leave a version that cannot be fetched unnoticed.
        for ref in refs:
            self.confirm_blob(
                ref,
                f"version {manifest.version} was published but a blob vanished meanwhile "
                "(a gc with too short a grace period?); re-running the registration re-uploads it",
            )
        return manifest

    def get_manifest(self, version: str) -> VersionManifest:
        """The manifest of a version. Raises VersionNotFound."""
        _check_name("version", version)
        try:
            raw = self.backend.get_bytes(manifest_key(version))
        except KeyError as exc:
            raise VersionNotFound(f"no version {version!r} in {self.backend.describe()}") from exc
        return VersionManifest.model_validate_json(raw)

    def list_versions(self) -> list[str]:
        """Every published version, oldest manifest key first."""
        return [
            key.split("/")[1]
            for key in self.backend.list_keys("versions/")
            if _is_manifest_key(key)
        ]

    def resolve(self, ref: str) -> VersionManifest:
        """A manifest by alias (if one by that name is set) or by version."""
        version = self.get_alias(ref) if self._alias_exists(ref) else ref
        if version is None:
            raise VersionNotFound(f"alias {ref!r} is cleared and points at no version")
        return self.get_manifest(version)

    # -- attachments -----------------------------------------------------------------------------
    def put_attachment(
        self,
        version: str | None,
        kind: str,
        name: str,
        content: bytes,
        *,
        blobs: Mapping[str, BlobRef] | None = None,
    ) -> Attachment:
        """File a named record beside a version (None: beside the store), once; its envelope.

        The content is stored as a blob; it and every blob in `blobs` (confirmed present first)
        are kept by gc while the attachment exists. The same content and blobs again is a no-op;
        anything else raises AttachmentExists naming both hashes, with the filed envelope on it.
        Raises VersionNotFound for a version that is not published.
        """
        about = describe_attachment(version, kind, name)
        if version is not None:
            self.get_manifest(version)  # never filed under a version that is not there
        _check_name("attachment kind", kind)
        _check_name("attachment name", name)
        refs = dict(sorted((blobs or {}).items()))
        for ref in refs.values():
            self.confirm_blob(ref, f"cannot file attachment {about}")
        attachment = Attachment(
            version=version,
            kind=kind,
            name=name,
            content=self.put_bytes_blob(content, f"filing attachment {about}"),
            blobs=refs,
        )
        data = attachment.model_dump_json(indent=2).encode()
        if not self.backend.put_bytes(attachment.key, data, exclusive=True):
            existing = self._read_envelope(attachment.key)
            if existing is None:  # taken, yet gone: nothing in Relay deletes an attachment
                raise StoreError(f"attachment {about} was removed while being filed")
            if existing != attachment:
                raise AttachmentExists(_conflict(existing, attachment), existing)
            return existing
        # As for publish: only a gc with too short a grace period could have taken these.
        for ref in attachment.referenced():
            self.confirm_blob(ref, f"attachment {about} was filed but a blob vanished meanwhile")
        return attachment

    def find_attachment(self, version: str | None, kind: str, name: str) -> Attachment | None:
        """The envelope of a named record, or None if none was filed."""
        _check_name("attachment kind", kind)
        _check_name("attachment name", name)
        if version is not None:
            _check_name("version", version)
        return self._read_envelope(attachment_key(version, kind, name))

    def get_attachment(self, version: str | None, kind: str, name: str) -> bytes | None:
        """The content of a named record, hash-checked; None if none was filed."""
        attachment = self.find_attachment(version, kind, name)
        return None if attachment is None else self.read_attachment(attachment)

    def list_attachments(self, version: str | None, kind: str) -> list[Attachment]:
        """Every record of one kind beside a version (None: beside the store), by name."""
        _check_name("attachment kind", kind)
        if version is not None:
            _check_name("version", version)
        prefix = attachments_prefix(version, kind)
        found = []
        for key in self.backend.list_keys(prefix):
            if is_attachment_key(key) and (envelope := self._read_envelope(key)) is not None:
                found.append(envelope)
        return found

    def read_attachment(self, attachment: Attachment) -> bytes:
        """An attachment's content, checked against its size and sha256.

        Raises BlobMissing if the content blob is gone, IntegrityError if it holds other bytes.
        """
        ref, key = attachment.content, blob_key(attachment.content.sha256)
        try:
            data = self.backend.get_bytes(key)
        except KeyError as exc:
            raise BlobMissing(
                f"attachment {attachment.describe()}: its content blob {self.backend.locate(key)} "
                f"is missing (expected sha256 {ref.sha256})"
            ) from exc
        actual = hashlib.sha256(data).hexdigest()
        if actual != ref.sha256 or len(data) != ref.size:
            raise IntegrityError(
                f"attachment {attachment.describe()} is corrupted: its content blob "
                f"{self.backend.locate(key)} should hold sha256 {ref.sha256} ({ref.size} bytes), "
                f"got {actual} ({len(data)} bytes)"
            )
        return data

    def _read_envelope(self, key: str) -> Attachment | None:
        try:
            raw = self.backend.get_bytes(key)
        except KeyError:
            return None
        try:
            return Attachment.model_validate_json(raw)
        except ValidationError as exc:
            raise StoreError(
                f"{self.backend.locate(key)} is not an attachment envelope (a record filed "
                f"before attachments existed?): {exc.error_count()} validation errors"
            ) from exc

    # -- aliases -------------------------------------------------------------------------------
    def _alias_keys(self, alias: str) -> list[str]:
        return [k for k in self.backend.list_keys(f"aliases/{alias}/") if k.endswith(".json")]

    def _alias_exists(self, alias: str) -> bool:
        return bool(alias) and "/" not in alias and bool(self._alias_keys(alias))

    def alias_history(self, alias: str) -> list[AliasEvent]:
        """Every move of an alias, oldest first."""
        _check_name("alias", alias)
        return [
            AliasEvent.model_validate_json(self.backend.get_bytes(k))
            for k in self._alias_keys(alias)
        ]

    def get_alias(self, alias: str) -> str | None:
        """The version an alias points at now, or None if never set or cleared."""
        history = self.alias_history(alias)
        return history[-1].version if history else None

    def set_alias(self, alias: str, version: str | None, *, actor: str, reason: str) -> AliasEvent:
        """Move an alias (None clears it), appending who and why to its history."""
        _check_name("alias", alias)
        if version is not None:
            self.get_manifest(version)  # an alias never points at a version that is not there
        for _ in range(_ALIAS_RACE_RETRIES):
            keys = self._alias_keys(alias)
            seq = int(keys[-1].rsplit("/", 1)[1].removesuffix(".json")) + 1 if keys else 0
            previous = (
                AliasEvent.model_validate_json(self.backend.get_bytes(keys[-1])).version
                if keys
                else None
            )
            event = AliasEvent(
                alias=alias,
                version=version,
                previous=previous,
                actor=actor,
                reason=reason,
                at=datetime.now(UTC),
            )
            key = f"aliases/{alias}/{seq:08d}.json"
            if self.backend.put_bytes(key, event.model_dump_json().encode(), exclusive=True):
                return event
        raise StoreError(f"could not move alias {alias!r}: too many concurrent writers")

    def alias_at(self, alias: str, when: datetime) -> str | None:
        """The version an alias pointed at, at a given time."""
        return version_at(self.alias_history(alias), when)

    def current_aliases(self) -> dict[str, str]:
        """Every alias that points at a version now, with that version."""
        latest: dict[str, str] = {}
        for key in self.backend.list_keys("aliases/"):
            if key.endswith(".json"):
                latest[key.split("/")[1]] = key  # keys sort by sequence: the last one wins
        current = {}
        for alias, key in sorted(latest.items()):
            version = AliasEvent.model_validate_json(self.backend.get_bytes(key)).version
            if version is not None:
                current[alias] = version
        return current

    # -- garbage collection ----------------------------------------------------------------------
    def gc(
        self,
        *,
        min_age: timedelta = timedelta(hours=1),
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> GcReport:
        """Delete blobs no manifest references, older (and leased longer ago) than min_age.

        Also aborts partial uploads older than min_age and drops expired leases. Never deletes a
        blob a readable manifest references, and refuses to run if any manifest is unreadable.
        """
        cutoff = (now or datetime.now(UTC)) - min_age
        # Blobs are listed before manifests, so a blob stored after this listing is never a
        # candidate, and any manifest published before the listing below is honoured.
        blobs = self.backend.list_objects("blobs/sha256/")
        referenced = self._referenced_digests()
        leases = self.backend.list_objects("leases/sha256/")
        plan = plan_gc(
            blobs, referenced, {_digest_of(lease.key): lease.modified for lease in leases}, cutoff
        )
        stale_leases = [lease for lease in leases if lease.modified < cutoff]
        if not dry_run:
            for blob in plan.delete:
                self.backend.delete(blob.key)
            for lease in stale_leases:
                self.backend.delete(lease.key)
        return GcReport(
            dry_run=dry_run,
            cutoff=cutoff,
            deleted=[_digest_of(blob.key) for blob in plan.delete],
            freed_bytes=sum(blob.size for blob in plan.delete),
            spared_recent=[_digest_of(blob.key) for blob in plan.spared_recent],
            referenced=plan.referenced,
            leases_removed=len(stale_leases),
            incomplete_uploads=self.backend.clean_incomplete_uploads(cutoff, dry_run=dry_run),
        )

    def _referenced_digests(self) -> set[str]:
        referenced: set[str] = set()
        for version in self.list_versions():
            try:
                manifest = self.get_manifest(version)
            except (ValueError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
                raise StoreError(
                    f"gc refused: the manifest of {version} in {self.backend.describe()} is "
                    f"unreadable, so the blobs it references are unknown ({exc})"
                ) from exc
            referenced.update(ref.sha256 for ref in _blob_refs(manifest))
        for key in self._record_keys():
            try:
                value = json.loads(self.backend.get_bytes(key))
            except (ValueError, KeyError) as exc:
                raise StoreError(
                    f"gc refused: record {key} in {self.backend.describe()} is unreadable, "
                    f"so the blobs it references are unknown ({exc})"
                ) from exc
            try:
                attachment = Attachment.model_validate(value)
            except ValidationError:
                referenced.update(_digests_in(value))  # a record filed before attachments
            else:
                referenced.update(ref.sha256 for ref in attachment.referenced())
        return referenced

    def _record_keys(self) -> list[str]:
        """Every attachment envelope, and every record filed before attachments existed."""
        keys = []
        for prefix in RECORD_PREFIXES:
            keys += [
                key
                for key in self.backend.list_keys(prefix)
                if key.endswith(".json") and not _is_manifest_key(key)
            ]
        return keys


# Attachments live under the first two. Stores written before attachments existed also hold
# records elsewhere (versions/<v>/calibration.json, versions/<v>/tensorrt/<gpu>.json,
# calibration/current.json, reports/impact/<id>.json): gc still honours every blob reference
# ({"sha256", "size"}) nested in those, so upgrading never loses the blobs they name.
RECORD_PREFIXES = ("versions/", "attachments/", "calibration/", "reports/")


def _conflict(existing: Attachment, attempted: Attachment) -> str:
    about = existing.describe()
    if existing.content != attempted.content:
        return (
            f"attachment {about} is already filed with content sha256 {existing.content.sha256}, "
            f"refusing to replace it with sha256 {attempted.content.sha256}"
        )
    return (
        f"attachment {about} is already filed (content sha256 {existing.content.sha256}) "
        f"referencing blobs {_digests(existing)}, refusing to file it again referencing "
        f"{_digests(attempted)}"
    )


def _digests(attachment: Attachment) -> str:
    return ", ".join(f"{label}={ref.sha256}" for label, ref in attachment.blobs.items()) or "none"


def _digests_in(value: object) -> set[str]:
    """Every sha256 of a blob reference ({"sha256": ..., "size": ...}) nested anywhere in value."""
    if isinstance(value, dict):
        found = (
            {value["sha256"]} if isinstance(value.get("sha256"), str) and "size" in value else set()
        )
        for item in value.values():
            found |= _digests_in(item)
        return found
    if isinstance(value, list):
        return set().union(*(_digests_in(item) for item in value)) if value else set()
    return set()


def _blob_refs(manifest: VersionManifest) -> list[BlobRef]:
    return list(manifest.blobs.values()) + [engine.blob for engine in manifest.engines]

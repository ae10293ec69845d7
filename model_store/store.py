"""The model store: content-addressed blobs, write-once manifests, aliases with history.

Layout (the same on every backend):
    blobs/sha256/<aa>/<digest>             write-once bytes, named by their sha256
    versions/<version>/manifest.json       written last, create-if-absent
    aliases/<alias>/<seq:08d>.json         one immutable object per move: the history
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from model_store.backend import Backend
from model_store.hashing import sha256_file
from relay.errors import BlobMissing, IntegrityError, StoreError, VersionExists, VersionNotFound
from relay.types import AliasEvent, BlobRef, VersionManifest

CHUNK = 4 * 1024 * 1024
_ALIAS_RACE_RETRIES = 20


def blob_key(sha256: str) -> str:
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


def manifest_key(version: str) -> str:
    return f"versions/{version}/manifest.json"


def _check_name(kind: str, name: str) -> None:
    if not name or "/" in name or name.startswith(".") or len(name) > 200:
        raise ValueError(f"invalid {kind} name {name!r}: non-empty, no '/', no leading '.'")


class ModelStore:
    """Versions of the model with their blobs and aliases, over any Backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    # -- blobs ---------------------------------------------------------------------------------
    def put_blob(self, path: Path) -> BlobRef:
        """Store a file under its sha256 (deduplicated) and return its reference."""
        digest, size = sha256_file(path)
        key = blob_key(digest)
        if not self.backend.exists(key):
            self.backend.put_file(key, path)
        return BlobRef(sha256=digest, size=size)

    def fetch_blob(self, ref: BlobRef, dest: Path) -> Path:
        """Download a blob to dest, verifying its hash while streaming; dest appears only if valid."""
        key = blob_key(ref.sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    for chunk in self.backend.iter_chunks(key, CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                except KeyError as exc:
                    raise BlobMissing(
                        f"blob {key} is missing from {self.backend.describe()} "
                        f"(expected sha256 {ref.sha256})"
                    ) from exc
            actual = digest.hexdigest()
            if actual != ref.sha256:
                raise IntegrityError(
                    f"blob {key} in {self.backend.describe()} is corrupted: "
                    f"expected sha256 {ref.sha256}, got {actual}"
                )
            os.replace(tmp_name, dest)
            return dest
        finally:
            Path(tmp_name).unlink(missing_ok=True)

    # -- versions ------------------------------------------------------------------------------
    def publish(self, manifest: VersionManifest) -> VersionManifest:
        """Write a version's manifest, last and once. Identical lineage re-publishes idempotently.

        Raises BlobMissing if a listed blob is not stored and VersionExists if the version holds
        different content.
        """
        _check_name("version", manifest.version)
        refs = list(manifest.blobs.values()) + [e.blob for e in manifest.engines]
        for ref in refs:
            if not self.backend.exists(blob_key(ref.sha256)):
                raise BlobMissing(
                    f"cannot publish {manifest.version}: blob {blob_key(ref.sha256)} is not stored"
                )
        data = manifest.model_dump_json(indent=2).encode()
        if self.backend.put_bytes(manifest_key(manifest.version), data, exclusive=True):
            return manifest
        existing = self.get_manifest(manifest.version)
        if existing.lineage_id != manifest.lineage_id:
            raise VersionExists(
                f"version {manifest.version} already exists with lineage {existing.lineage_id}, "
                f"refusing to overwrite it with {manifest.lineage_id}"
            )
        return existing

    def get_manifest(self, version: str) -> VersionManifest:
        """The manifest of a version. Raises VersionNotFound."""
        _check_name("version", version)
        try:
            raw = self.backend.get_bytes(manifest_key(version))
        except KeyError as exc:
            raise VersionNotFound(
                f"no version {version!r} in {self.backend.describe()}"
            ) from exc
        return VersionManifest.model_validate_json(raw)

    def list_versions(self) -> list[str]:
        """Every published version, oldest manifest key first."""
        return [
            key.split("/")[1]
            for key in self.backend.list_keys("versions/")
            if key.endswith("/manifest.json")
        ]

    def resolve(self, ref: str) -> VersionManifest:
        """A manifest by alias (if one by that name is set) or by version."""
        version = self.get_alias(ref) if self._alias_exists(ref) else ref
        if version is None:
            raise VersionNotFound(f"alias {ref!r} is cleared and points at no version")
        return self.get_manifest(version)

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

    def set_alias(
        self, alias: str, version: str | None, *, actor: str, reason: str
    ) -> AliasEvent:
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
        current = None
        for event in self.alias_history(alias):
            if event.at > when:
                break
            current = event.version
        return current

"""Attachments: named records kept beside a version, or beside the store as a whole.

A record that arrives after a version's manifest (its blessing, its TensorRT plan per GPU, its
impact reports) cannot be in the manifest, which is written once. Each is an attachment instead:
its bytes stored as a blob like every other, and an envelope at

    versions/<version>/attachments/<kind>/<name>.json     beside one version
    attachments/<kind>/<name>.json                        beside the store (version None)

that names the content blob and every blob the record references, so gc keeps them. Envelopes
are create-if-absent: the first writer wins, and a reader checks the content against its hash.
`ModelStore.put_attachment`, `get_attachment`, `list_attachments` and `read_attachment` are the
API; this module holds the envelope and its addressing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from relay.errors import StoreError
from relay.types import BlobRef

ATTACHMENTS = "attachments"


class Attachment(BaseModel):
    """The envelope of one attachment: where it hangs, its content blob, the blobs it references."""

    model_config = ConfigDict(frozen=True)

    version: str | None  # None: an attachment of the store, not of one version
    kind: str
    name: str
    content: BlobRef
    blobs: dict[str, BlobRef] = {}

    @property
    def key(self) -> str:
        return attachment_key(self.version, self.kind, self.name)

    def describe(self) -> str:
        """`kind/name of version v` (or `of the store`), for messages."""
        return describe_attachment(self.version, self.kind, self.name)

    def referenced(self) -> list[BlobRef]:
        """Every blob gc must keep while this attachment exists: its content and its references."""
        return [self.content, *self.blobs.values()]


class AttachmentExists(StoreError):
    """A write-once attachment is already filed with other content; `existing` is its envelope."""

    def __init__(self, message: str, existing: Attachment) -> None:
        super().__init__(message)
        self.existing = existing


def attachments_prefix(version: str | None, kind: str) -> str:
    """The key prefix under which every attachment of one kind of a version (or the store) lives."""
    scope = f"versions/{version}/{ATTACHMENTS}" if version is not None else ATTACHMENTS
    return f"{scope}/{kind}/"


def attachment_key(version: str | None, kind: str, name: str) -> str:
    """Where the envelope of one attachment is stored."""
    return f"{attachments_prefix(version, kind)}{name}.json"


def is_attachment_key(key: str) -> bool:
    """Whether a store key is the address of an attachment's envelope."""
    parts = key.split("/")
    if not key.endswith(".json"):
        return False
    return (len(parts) == 3 and parts[0] == ATTACHMENTS) or (
        len(parts) == 5 and parts[0] == "versions" and parts[2] == ATTACHMENTS
    )


def describe_attachment(version: str | None, kind: str, name: str) -> str:
    return f"{kind}/{name} of " + (f"version {version}" if version is not None else "the store")

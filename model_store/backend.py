"""The narrow interface a model-store backend implements: keyed, immutable-ish objects."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key, size in bytes and when it was last written (UTC)."""

    key: str
    size: int
    modified: datetime


class Backend(ABC):
    """Objects under '/'-separated keys. Writes are atomic: readers see all of an object or none."""

    @abstractmethod
    def describe(self) -> str:
        """Where the store lives, for messages (never credentials)."""

    @abstractmethod
    def locate(self, key: str) -> str:
        """The full address of one object, for messages (never credentials)."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Store a file's bytes under key, streaming (never whole in memory)."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Store small bytes. With exclusive=True, return False instead of overwriting.

        An exclusive write that finds exactly `data` already there returns True: a request that
        succeeded but whose answer was lost, then retried, is still this writer's success.
        """

    @abstractmethod
    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        """Stream an object's bytes. Raises KeyError if the key is absent."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """A small object whole. Raises KeyError if absent."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """Size and write time of one object, or None if absent."""

    @abstractmethod
    def list_objects(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with prefix, sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; absent keys are fine."""

    @abstractmethod
    def clean_incomplete_uploads(self, older_than: datetime, *, dry_run: bool = False) -> list[str]:
        """Remove partial uploads begun before older_than; return what was (or would be) removed."""

    def exists(self, key: str) -> bool:
        """Whether an object is stored under key."""
        return self.stat(key) is not None

    def list_keys(self, prefix: str) -> list[str]:
        """Every key starting with prefix, sorted."""
        return [info.key for info in self.list_objects(prefix)]

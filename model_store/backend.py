"""The narrow interface a model-store backend implements: keyed, immutable-ish objects."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path


class Backend(ABC):
    """Objects under '/'-separated keys. Writes are atomic: readers see all of an object or none."""

    @abstractmethod
    def describe(self) -> str:
        """Where the store lives, for messages (never credentials)."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Store a file's bytes under key, streaming (never whole in memory)."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Store small bytes. With exclusive=True, return False instead of overwriting."""

    @abstractmethod
    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        """Stream an object's bytes. Raises KeyError if the key is absent."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """A small object whole. Raises KeyError if absent."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under key."""

    @abstractmethod
    def list_keys(self, prefix: str) -> list[str]:
        """Every key starting with prefix, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; absent keys are fine."""

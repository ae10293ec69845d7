"""Streaming sha256: large blocks, one reused buffer, files hashed in parallel threads.

hashlib releases the GIL on large updates, so threads hash independent files on separate cores.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BLOCK = 4 * 1024 * 1024


def sha256_file(path: Path, block: int = BLOCK) -> tuple[str, int]:
    """(hex digest, size in bytes) of a file, read in `block`-sized pieces, never whole."""
    digest = hashlib.sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
            size += n
    return digest.hexdigest(), size


def sha256_files(paths: Iterable[Path], workers: int = 4) -> dict[Path, tuple[str, int]]:
    """sha256_file for many files at once, in parallel threads."""
    paths = list(paths)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(paths)))) as pool:
        return dict(zip(paths, pool.map(sha256_file, paths), strict=True))


class BackgroundDigest:
    """sha256 of a stream computed in a second thread, so hashing overlaps the network read.

    hashlib releases the GIL on large updates; the bounded queue keeps memory to `depth` chunks.
    Always call hexdigest() or close() so the thread ends.
    """

    def __init__(self, depth: int = 4) -> None:
        self._digest = hashlib.sha256()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()
        self._closed = False

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._digest.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        return self._digest.hexdigest()

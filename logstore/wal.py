"""The request log's write-ahead file: one framed record per row, written before the answer leaves.

Each serving worker copies every log row, as one record, into a file of its own in the spool
folder before the response is sent. The file is memory-mapped (shared), so a record is a
`memcpy` into the kernel's page cache: no system call, and so no release of the GIL on the
event loop. With a busy Python thread on the same core (the engine threads, under load) an
`os.write` of a row took 6.8 µs against 1.25 µs for the copy, because the loop had to win the
GIL back after every write. The page cache outlives a SIGKILL or an OOM kill of the
process, so no fsync is needed for process crashes (an fsync per request would cost more than
the request); a kernel crash or power loss can still lose it, and the segments the file is
rotated into are fsynced, so at most one rotation's rows are exposed to that. The file's space
is reserved up front (`posix_fallocate`): a full disk refuses a new file, instead of killing
the process with SIGBUS on a page it could not back.

A record is a 4-byte little-endian payload length, the payload's 4-byte CRC-32, then the
payload; the header is copied after the payload, so a record whose copy did not finish has no
valid header. Such a record, cut short or failing its CRC, can only be the last one: the
process died inside it, before that request's answer was sent, and it is dropped (`parse`).

Ownership is an exclusive `flock` that the writer holds for as long as the file exists; the
kernel releases it when the process dies, however it dies. Whoever then takes the lock
(`claim`) may recover the file; a file still locked belongs to a live worker.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import zlib
from pathlib import Path

HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
MAX_PAYLOAD = 16 << 20  # a length above this is garbage, not a row
CAPACITY = 8 << 20  # bytes reserved per file: ~40,000 rows, more than a rotation holds
# a file's name while `WalFile.create` locks and reserves it, or `write_segment` writes it
CREATING_PREFIX = ".tmp-"


def parse(data: bytes) -> tuple[list[bytes], int]:
    """The complete records' payloads, and how many bytes of torn tail follow them.

    The unused, zeroed rest of a file is not torn tail; the bytes of an unfinished record are.
    """
    payloads: list[bytes] = []
    at, end = 0, len(data)
    view = memoryview(data)
    while end - at >= HEADER.size:
        length, crc = HEADER.unpack_from(view, at)
        start = at + HEADER.size
        if not 0 < length <= MAX_PAYLOAD or start + length > end:
            break  # a zero length too: zeroed blocks after a power loss are no record
        payload = bytes(view[start : start + length])
        if zlib.crc32(payload) != crc:
            break
        payloads.append(payload)
        at = start + length
    return payloads, len(bytes(view[at:]).rstrip(b"\0"))


class WalFile:
    """An open, mapped write-ahead file that this process owns (holds the flock of)."""

    def __init__(self, path: Path, fd: int, pages: mmap.mmap) -> None:
        self.path = path
        self.fd = fd
        self._pages = pages
        self.used = 0  # bytes of records so far

    @classmethod
    def create(cls, directory: Path, name: str) -> WalFile:
        """A new, locked, mapped file `directory/name` with CAPACITY bytes reserved.

        It is created and locked under a hidden temporary name and only then renamed, so no
        recoverer ever sees it unlocked.
        """
        tmp = directory / f"{CREATING_PREFIX}{name}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        pages = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.posix_fallocate(fd, 0, CAPACITY)
            pages = mmap.mmap(fd, CAPACITY)  # shared: what is copied in is the file's page cache
            final = directory / name
            os.rename(tmp, final)
        except BaseException:
            if pages is not None:
                pages.close()
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return cls(final, fd, pages)

    def append(self, payload: bytes) -> bool:
        """Copy one record in; False (nothing written) if the file has no room for it."""
        body = self.used + HEADER.size
        end = body + len(payload)
        if end > len(self._pages):
            return False
        self._pages[body:end] = payload
        self._pages[self.used : body] = HEADER.pack(len(payload), zlib.crc32(payload))
        self.used = end
        return True

    def sync_tail(self, length: int) -> None:
        """Write the last `length` bytes of records through to the disk (msync) and wait.

        For RELAY_SERVING_LOG_FSYNC=request: a record copied in survives a SIGKILL as it is (the
        page cache is the kernel's), and after this a power loss too. msync takes whole pages.
        """
        start = max(self.used - length, 0) // mmap.PAGESIZE * mmap.PAGESIZE
        self._pages.flush(start, self.used - start)

    def rename(self, path: Path) -> None:
        """Move the file (still open and locked) to `path`."""
        os.rename(self.path, path)
        self.path = path

    def recycle(self, path: Path) -> None:
        """Empty the file and move it to `path`, to take new records on pages already mapped.

        Its rows must be safe elsewhere. A first write to a page of a mapped file costs a page
        fault, measured at ~0.2 ms here (ext4, in a VM); reusing the pages avoids one every
        ~15 rows. Emptied before it is renamed: a crash in between leaves an empty file, or
        one whose rows are in their segment already, under the old name.
        """
        self._pages[: self.used] = bytes(self.used)
        self.used = 0
        self.rename(path)

    def retire(self) -> None:
        """Delete the file, then give up its lock: its rows are safe elsewhere."""
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self._pages.close()
            os.close(self.fd)


def claim(path: Path) -> int | None:
    """A locked read descriptor of `path` if its writer is gone, else None.

    None too when the file was deleted while the lock was awaited: its rows were taken care of
    by whoever deleted it, and reading the orphaned inode would log them twice.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = os.fstat(fd)
        if held.st_nlink == 0 or os.stat(path).st_ino != held.st_ino:
            raise FileNotFoundError(path)
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_all(fd: int) -> bytes:
    """Every byte of the file behind `fd`, from its start."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)

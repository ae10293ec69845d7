"""A sealed write-ahead file's records copied, as they are, into a spool segment (`.records`).

RELAY_SERVING_LOG_SEGMENTER=copy, the default: the serving worker's log writer does no Arrow
work on a rotated file. The kernel copies its bytes (copy_file_range) while the writer's thread
holds no GIL; whoever ingests decodes them (`logstore.segments.read_segment`). The segment is
written as every segment is: a locked temporary name, fsync, rename, whole or not at all.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from logstore import wal
from logstore.segments import fsync_dir


def copy_segment(directory: Path, name: str, fd: int, length: int) -> Path:
    """The first `length` bytes of the file behind `fd` as the segment `directory/name`.

    As `write_segment`: a locked temporary name, fsync, rename, whole or not at all. The bytes
    move inside the kernel (copy_file_range), so the calling thread holds no GIL meanwhile.
    """
    final = directory / name
    tmp = directory / f"{wal.CREATING_PREFIX}{name}"
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(out, fcntl.LOCK_EX)
            _copy_range(fd, out, length)
            os.fsync(out)
            os.replace(tmp, final)  # still locked: the lock is dropped when the file closes
        finally:
            os.close(out)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(directory)
    return final


def _copy_range(src: int, dst: int, length: int) -> None:
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(src, dst, length - done, done, done)
        except OSError as exc:  # a kernel or file system without it: copy through memory
            if exc.errno not in (errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            chunk = os.pread(src, length - done, done)
            n = os.pwrite(dst, chunk, done) if chunk else 0
        if n == 0:
            raise OSError(errno.EIO, f"the source ends after {done} of its {length} bytes")
        done += n

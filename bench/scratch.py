"""The scratch directory of one benchmark run."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory, removed at the end only after this process's ClickHouse clients
    are closed: an embedded chdb under it may still be merging parts in the background, and
    a merge writing a new part while the directory is removed fails the removal ("Directory not
    empty"; a fresh-clone run of bench.rollback's smoke failed on it on a loaded host)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        try:
            yield Path(name)
        finally:
            import logstore  # heavy, and only needed here at the end

            logstore.close_all()

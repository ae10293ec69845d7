"""Saving a benchmark's figures: stamped with when and on what they were measured, written whole.

Every bench writes its JSON through `save`, so each result file says when it was measured and
on how many CPUs at what load (`measured_at`, `host`), and the figures table can print that next
to the figures instead of leaving a reader to guess from the commit. A file is written to a
temporary name and renamed over the old one: a run cut short never leaves half a file.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def stamped(figures: dict[str, Any]) -> dict[str, Any]:
    """`figures` with `measured_at` (UTC, now) and `host.cpus` / `host.loadavg_1m_at_end` added.

    What a bench set itself is kept: a bench that records its host in more detail (gpu_check)
    or measured before writing (`measured_at` at the start of a long run) is not overwritten.
    """
    figures.setdefault("measured_at", datetime.now(UTC).isoformat(timespec="seconds"))
    host = figures.setdefault("host", {})
    host.setdefault("cpus", os.cpu_count())
    host.setdefault("loadavg_1m_at_end", round(os.getloadavg()[0], 2))
    return figures


def write_whole(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def save(path: Path, figures: dict[str, Any], **dumps: Any) -> None:
    """The stamped figures as indented JSON in `path` (`dumps`: json.dumps options)."""
    write_whole(path, json.dumps(stamped(figures), indent=2, **dumps) + "\n")


def update_key(path: Path, key: str, value: Any) -> None:
    """Set one key of another bench's result file (gate.json's copies), whole or not at all.

    No file at `path` (a smoke run's scratch folder): nothing to keep current.
    """
    if not path.exists():
        return
    data = json.loads(path.read_text())
    data[key] = value
    write_whole(path, json.dumps(data, indent=2) + "\n")

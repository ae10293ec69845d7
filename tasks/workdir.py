"""Where a run keeps its intermediate files before they become blobs in the model store."""

from __future__ import annotations

import uuid
from pathlib import Path

from prefect.runtime import flow_run

from relay.settings import Settings


def run_workdir(settings: Settings) -> Path:
    """<home>/runs/<flow-run id> (a fresh id outside a flow run), created empty."""
    run_id = flow_run.id or f"local-{uuid.uuid4().hex[:12]}"
    path = (settings.home / "runs" / str(run_id)).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path

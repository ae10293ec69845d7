"""inference_logs rows for the query tests: the columns a served request writes, the rest zero."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pandas as pd

from logstore.impact import INFERENCE_LOG_COLUMNS


def inference_log_rows(
    ts: Sequence[datetime],
    request_ids: Sequence[str],
    users: np.ndarray,
    slot: str,
    version: str,
    latency_ms: np.ndarray,
    status: np.ndarray,
) -> pd.DataFrame:
    """One row per request, in INFERENCE_LOG_COLUMNS order (stage timings zero, one-row batches)."""
    frame = pd.DataFrame(
        {
            "ts": list(ts),
            "request_id": list(request_ids),
            "user_id": users.astype(np.uint64),
            "session_id": "s",
            "slot": slot,
            "model_version": version,
            "lineage_id": "l",
            "latency_ms": latency_ms.astype(np.float32),
            "queue_ms": 0.0,
            "preprocess_ms": 0.0,
            "compute_ms": 0.0,
            "postprocess_ms": 0.0,
            "batch_size": 1,
            "input_bytes": 100,
            "status": status.astype(np.uint16),
            "error_code": "",
        }
    )
    return frame[list(INFERENCE_LOG_COLUMNS)]

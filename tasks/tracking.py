"""The MLflow client, made in one place from the settings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from relay.settings import Settings


def mlflow_client(settings: Settings) -> Any:
    """An MLflow client for tracking and the registry (an SQLite file is created if needed)."""
    from mlflow import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    uri = settings.resolved_mlflow_uri
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)

"""Versions, content-addressed blobs, manifests and aliases with history."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from model_store.store import ModelStore
from relay.errors import ConfigError
from relay.settings import Settings


def open_store(settings: Settings) -> ModelStore:
    """The model store the settings point at."""
    url = settings.resolved_model_store_url
    parsed = urlparse(url)
    if parsed.scheme == "file":
        from model_store.local import LocalBackend

        return ModelStore(LocalBackend(Path(parsed.path)))
    raise ConfigError(
        f"RELAY_MODEL_STORE_URL {url!r}: unsupported scheme {parsed.scheme!r} (use file://)"
    )


__all__ = ["ModelStore", "open_store"]

"""Versions, content-addressed blobs, manifests and aliases with history."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from model_store.store import ModelStore
from relay.errors import ConfigError
from relay.settings import Settings


def open_store(settings: Settings) -> ModelStore:
    """The model store the settings point at: file:///path or s3://bucket[/prefix]."""
    url = settings.resolved_model_store_url
    parsed = urlparse(url)
    if parsed.username or parsed.password:
        # Credentials in the URL would end up in MLflow sources, manifests' neighbours and logs.
        raise ConfigError(
            "RELAY_MODEL_STORE_URL must not carry credentials; set RELAY_S3_ACCESS_KEY and "
            "RELAY_S3_SECRET_KEY instead"
        )
    if parsed.scheme == "file":
        from model_store.local import LocalBackend

        return ModelStore(LocalBackend(Path(parsed.path)))
    if parsed.scheme == "s3":
        from model_store.s3 import S3Backend

        if not parsed.netloc:
            raise ConfigError(f"RELAY_MODEL_STORE_URL {url!r}: s3:// needs a bucket name")
        return ModelStore(S3Backend.from_settings(settings, parsed.netloc, parsed.path))
    raise ConfigError(
        f"RELAY_MODEL_STORE_URL {url!r}: unsupported scheme {parsed.scheme!r} "
        "(use file:// or s3://)"
    )


__all__ = ["ModelStore", "open_store"]

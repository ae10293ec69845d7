"""open_store routes URLs to backends and refuses configurations that would leak or fail later."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_store import open_store
from model_store.local import LocalBackend
from model_store.s3 import S3Backend
from relay.errors import ConfigError
from relay.settings import Settings

SECRET = "not-in-any-message-42"


def settings(url: str, **extra) -> Settings:
    values = {"s3_endpoint": "127.0.0.1:9000", "s3_access_key": "AK", "s3_secret_key": SECRET}
    values.update(extra)
    return Settings(model_store_url=url, **values)


def test_file_url_opens_the_local_backend(tmp_path: Path):
    store = open_store(settings(f"file://{tmp_path}/models"))
    assert isinstance(store.backend, LocalBackend)
    assert store.backend.root == (tmp_path / "models").resolve()


def test_s3_url_opens_the_s3_backend_with_bucket_and_prefix_and_no_network():
    store = open_store(settings("s3://relay-models/team/ctr/"))
    backend = store.backend
    assert isinstance(backend, S3Backend)
    assert (backend.bucket, backend.prefix) == ("relay-models", "team/ctr/")
    assert backend.describe() == "s3://relay-models/team/ctr/ on http://127.0.0.1:9000"
    assert backend.locate("versions/v1/manifest.json").startswith(
        "s3://relay-models/team/ctr/versions/v1/manifest.json"
    )
    assert SECRET not in backend.describe()


def test_s3_url_without_prefix_stores_at_the_bucket_root():
    backend = open_store(settings("s3://relay-models", s3_secure=True)).backend
    assert isinstance(backend, S3Backend) and backend.prefix == ""
    assert backend.describe() == "s3://relay-models/ on https://127.0.0.1:9000"


def test_credentials_in_the_url_are_refused_without_echoing_them():
    with pytest.raises(ConfigError, match="must not carry credentials") as caught:
        open_store(settings(f"s3://AK:{SECRET}@relay-models/x"))
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "url, extra, message",
    [
        ("s3://relay-models", {"s3_endpoint": ""}, "needs RELAY_S3_ENDPOINT"),
        ("s3://relay-models", {"s3_secret_key": ""}, "set both"),
        ("s3:///just-a-path", {}, "needs a bucket name"),
        ("gs://relay-models", {}, "unsupported scheme 'gs'"),
    ],
)
def test_misconfigured_store_urls_are_config_errors(url, extra, message):
    with pytest.raises(ConfigError, match=message):
        open_store(settings(url, **extra))


def test_empty_url_means_the_local_store_under_relay_home(tmp_path: Path):
    store = open_store(Settings(home=tmp_path, model_store_url=""))
    assert isinstance(store.backend, LocalBackend)
    assert store.backend.root == (tmp_path / "models").resolve()

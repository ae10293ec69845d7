"""Fixtures for the model-store tests: a real S3 API server on loopback, stores over both
backends, and an outage relay. Test modules load them with
`pytest_plugins = ("tests.integration.store_fixtures",)`.

The server is moto's standalone one (no MinIO binary can be installed here); the store talks to
it through the `minio` client exactly as to MinIO.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_store import ModelStore, open_store
from model_store.local import LocalBackend
from tests.integration.store_testbed import Outage, fresh_bucket, s3_settings


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """host:port of an S3 API server on 127.0.0.1, for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ModelStore:
    """The same store API over the local directory and over S3 (a fresh bucket per test)."""
    if request.param == "local":
        return ModelStore(LocalBackend(tmp_path / "store"))
    endpoint = request.getfixturevalue("moto_endpoint")
    return open_store(s3_settings(endpoint, fresh_bucket()))


@pytest.fixture
def outage(moto_endpoint: str) -> Iterator[Outage]:
    """A relay to the test S3 server that the test can take down and bring back."""
    relay = Outage(moto_endpoint)
    yield relay
    relay.close()

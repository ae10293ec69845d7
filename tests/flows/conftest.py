"""Flow tests run real flows against Prefect's test harness (a temporary local server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="session")
def prefect_harness(relay_home) -> Iterator[None]:  # noqa: ANN001 - fixture
    """One Prefect server for every flow test in the session."""
    with prefect_test_harness(server_startup_timeout=120):
        yield

"""Shared fixtures: an isolated Relay home per test session and a small published model version.

chdb allows one engine path per process, so the whole session shares one ClickHouse path
(under the session's Relay home); tests that need clean tables use their own time windows or
their own store directories.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent

# Before anything imports Prefect: no telemetry (there is no internet) and a private Prefect home,
# so test servers never share ~/.prefect's database with a developer's own server.
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="relay-test-prefect-")
os.environ.pop("PREFECT_API_URL", None)  # flow tests use the harness, never a developer's server
for _name in [n for n in os.environ if n.startswith("RELAY_")]:
    del os.environ[_name]  # `make` exports the local stack's settings; tests make their own
# One OpenMP thread per process, before anything imports torch; the suite's servers, workers and
# flow runs inherit it. The suite's models are small: training the fixture's model (30k events)
# took 1.98 s on one thread and 2.09 s on torch's default two, alone; with both cores busy (as the
# other xdist process keeps them) 2.81 s against 3.65-4.48 s, and 1.96 against 3.0-3.3 CPU
# seconds, the second thread spinning for a core it does not get.
os.environ["OMP_NUM_THREADS"] = "1"

from relay.settings import Settings, get_settings  # noqa: E402

# Unit tests run in a random order (pytest-randomly: the seed is in the report header, and
# `--randomly-seed=N` replays one; `-p no:randomly` turns it off). The flow and
# integration tiers keep the order they are written in: they share session-scoped servers and
# one chdb path, and some scenarios build on the fleet state the one before them left.
SHUFFLED_TIERS = ("unit",)

# `make test` runs the suite in two pytest-xdist processes. Each test file is one unit of work,
# run whole and in its written order by one process, which has its own session fixtures (Relay
# home, chdb path, Prefect harness). The files that bring up a deployed stack from the
# repository's scripts (`prefect deploy --all` in the checkout) are one unit, so two of them
# never run at once. (xdist's own `--dist loadgroup` does not group under pytest 9.2: it renames
# `item._nodeid`, which pytest 9 no longer reads, so every file's tests were spread over both
# processes and its module fixtures set up twice; pytest-xdist issue 1386, fix open in PR 1388.)
SHARED_UNITS = {
    "tests/integration/test_deployments_e2e.py": "deployed-stack",
    "tests/integration/test_ui_browser.py": "deployed-stack",
}
# The longest units go first (each several minutes, in the last fresh-clone run's durations), so
# neither process is left running one alone at the end; the rest follow in collection order.
LONGEST_FIRST = (
    "tests/integration/test_deployments_e2e.py",
    "tests/integration/test_ui_browser.py",
    "tests/integration/test_release_scenarios.py",
    "tests/integration/test_bench_smoke.py",
)
_COLLECTED = pytest.StashKey[int]()


_collection_order = itertools.count()


def pytest_itemcollected(item: pytest.Item) -> None:
    item.stash[_COLLECTED] = next(_collection_order)


def _where(item: pytest.Item) -> str:
    """The item's file as its node id starts: tests/<tier>/test_x.py."""
    return Path(str(item.path)).relative_to(TESTS.parent).as_posix()


def _tier(item: pytest.Item) -> str:
    parts = _where(item).split("/")
    return parts[1] if len(parts) > 2 else ""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers in their written order; inside `unit` keep pytest-randomly's shuffle, elsewhere not."""
    first_of: dict[str, int] = {}
    for item in sorted(items, key=lambda i: i.stash.get(_COLLECTED, 0)):
        first_of.setdefault(_tier(item), item.stash.get(_COLLECTED, 0))
    shuffled = {id(item): n for n, item in enumerate(items)}

    in_xdist = "PYTEST_XDIST_WORKER" in os.environ

    def key(item: pytest.Item) -> tuple[int, int, int]:
        tier = _tier(item)
        within = shuffled[id(item)] if tier in SHUFFLED_TIERS else item.stash.get(_COLLECTED, 0)
        where = _where(item)
        first = in_xdist and where in LONGEST_FIRST
        rank = LONGEST_FIRST.index(where) if first else len(LONGEST_FIRST)
        return rank, first_of[tier], within

    items.sort(key=key)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's file-at-a-time scheduling, with the files of SHARED_UNITS as one unit."""
    from xdist.scheduler import LoadFileScheduling

    class FileUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SHARED_UNITS.get(file, file)

    return FileUnits(config, log)


@pytest.fixture(scope="session")
def relay_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """RELAY_HOME for the whole session: embedded ClickHouse, model store and MLflow live here."""
    home = tmp_path_factory.mktemp("relay-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELAY_HOME", str(home))
        for name in ("RELAY_MODEL_STORE_URL", "RELAY_CLICKHOUSE_DSN", "RELAY_MLFLOW_TRACKING_URI"):
            mp.delenv(name, raising=False)
        get_settings.cache_clear()
        yield home
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def settings(relay_home: Path) -> Settings:
    return get_settings()


@pytest.fixture(scope="session")
def prefect_harness(relay_home: Path) -> Iterator[None]:
    """One temporary Prefect server for every flow run in the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@dataclass
class PublishedVersion:
    """A small but real trained, exported, compiled and published model version."""

    store: object  # model_store.ModelStore
    manifest: object  # relay.types.VersionManifest
    workdir: Path
    holdout_x: object  # numpy float32 (n, 27)


@pytest.fixture(scope="session")
def published_version(tmp_path_factory: pytest.TempPathFactory) -> PublishedVersion:
    """Train on 30k simulated events (no ClickHouse, no Prefect) and publish to a local store."""
    from core.training.model import TrainConfig
    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay_testing.versions import train_and_publish
    from simulation.shop import ShopConfig, generate_events

    root = tmp_path_factory.mktemp("published")
    frame = generate_events(ShopConfig(seed=11), 30_000, datetime(2026, 11, 1, tzinfo=UTC))
    store = ModelStore(LocalBackend(root / "store"))
    manifest, trained = train_and_publish(
        store, frame, TrainConfig(seed=11, epochs=1), root / "run", "fixture-window"
    )
    return PublishedVersion(
        store=store, manifest=manifest, workdir=root / "run", holdout_x=trained.holdout_x
    )

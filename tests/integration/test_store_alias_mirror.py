"""Alias moves: recorded append-only in the model store, mirrored to MLflow's alias and tags
(a real MLflow registry on SQLite), over both store backends."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from model_store import ModelStore
from relay.errors import StoreError
from relay.settings import Settings
from relay.types import VersionManifest
from tasks.aliases import AliasMirrorFailed, mirror_alias, move_alias, record_alias_move
from tasks.registry import log_mlflow_run, register_mlflow_version
from tasks.tracking import mlflow_client
from tests.integration.store_testbed import publishable

pytest_plugins = ("tests.integration.store_fixtures",)


@pytest.fixture
def registry(settings: Settings) -> tuple[Settings, Any]:
    """Settings naming a registered model of this test's own, and an MLflow client for it."""
    own = settings.model_copy(update={"mlflow_model_name": f"relay-store-{uuid.uuid4().hex[:8]}"})
    return own, mlflow_client(own)


def registered(settings: Settings, store: ModelStore, workdir: Path, seed: str) -> tuple[str, str]:
    """Publish a version in the store and register it in MLflow: (store version, MLflow version)."""
    manifest: VersionManifest = publishable(store, workdir, seed=seed)
    manifest.mlflow_run_id = log_mlflow_run(settings, manifest)
    published = store.publish(manifest)
    return published.version, register_mlflow_version(settings, published, "file:///test-store")


def test_alias_moves_are_recorded_in_the_store_and_mirrored_to_mlflow(
    store: ModelStore, registry: tuple[Settings, Any], tmp_path: Path
):
    settings, client = registry
    name = settings.mlflow_model_name
    v1, mv1 = registered(settings, store, tmp_path, "one")
    v2, mv2 = registered(settings, store, tmp_path, "two")

    first = record_alias_move(store, client, name, "champion", v1, actor="alice", reason="blessed")
    assert first.mlflow_model_version == mv1
    assert str(client.get_model_version_by_alias(name, "champion").version) == mv1

    second = record_alias_move(
        store, client, name, "champion", v2, actor="release-flow", reason="canary passed"
    )
    assert second.mlflow_model_version == mv2
    assert str(client.get_model_version_by_alias(name, "champion").version) == mv2
    tags = client.get_registered_model(name).tags
    assert tags["relay.alias.champion.version"] == v2
    assert tags["relay.alias.champion.previous"] == v1
    assert tags["relay.alias.champion.moved_by"] == "release-flow"
    assert tags["relay.alias.champion.reason"] == "canary passed"

    record_alias_move(store, client, name, "champion", None, actor="bob", reason="retired")
    assert "champion" not in client.get_registered_model(name).aliases
    history = store.alias_history("champion")
    assert [(e.version, e.actor) for e in history] == [
        (v1, "alice"),
        (v2, "release-flow"),
        (None, "bob"),
    ]
    assert store.alias_at("champion", history[1].at) == v2


def test_version_unknown_to_mlflow_is_refused_before_the_store_is_touched(
    store: ModelStore, registry: tuple[Settings, Any], tmp_path: Path
):
    settings, client = registry
    registered(settings, store, tmp_path, "known")  # creates the registered model
    stray = store.publish(publishable(store, tmp_path, seed="stray")).version
    with pytest.raises(StoreError, match="no MLflow version"):
        record_alias_move(
            store, client, settings.mlflow_model_name, "champion", stray, actor="a", reason="b"
        )
    assert store.alias_history("champion") == []


def test_failed_mirror_leaves_the_record_and_mirroring_again_repairs_it(
    store: ModelStore, registry: tuple[Settings, Any], tmp_path: Path
):
    settings, client = registry
    name = settings.mlflow_model_name
    v1, mv1 = registered(settings, store, tmp_path, "one")

    class FlakyRegistry:
        """MLflow answering everything except the alias update."""

        def __getattr__(self, attr: str) -> Any:
            return getattr(client, attr)

        def set_registered_model_alias(self, *args: Any) -> None:
            raise ConnectionError("registry unreachable")

    with pytest.raises(AliasMirrorFailed, match="recorded in .*run mirror_alias again"):
        record_alias_move(store, FlakyRegistry(), name, "champion", v1, actor="a", reason="b")
    assert store.get_alias("champion") == v1  # the record stands
    repaired = mirror_alias(store, client, name, "champion")
    assert repaired.mlflow_model_version == mv1
    assert str(client.get_model_version_by_alias(name, "champion").version) == mv1
    assert len(store.alias_history("champion")) == 1  # repaired, not moved twice


def test_move_alias_task_opens_the_configured_store_and_registry(
    registry: tuple[Settings, Any], tmp_path: Path
):
    settings, client = registry
    settings = settings.model_copy(update={"model_store_url": f"file://{tmp_path / 'models'}"})
    from model_store import open_store

    store = open_store(settings)
    v1, mv1 = registered(settings, store, tmp_path, "one")
    moved = move_alias.fn(settings, "champion", v1, "on-call", "manual promote")
    assert moved.event.version == v1 and moved.mlflow_model_version == mv1
    assert open_store(settings).alias_history("champion")[0].reason == "manual promote"
    with pytest.raises(ValueError, match="not usable in MLflow"):
        move_alias.fn(settings, "v2", v1, "on-call", "looks like a version number")
    with pytest.raises(ValueError, match="needs an actor and a reason"):
        move_alias.fn(settings, "champion", v1, "on-call", " ")
    assert len(open_store(settings).alias_history("champion")) == 1

"""Move an alias (`champion`, `candidate` ...): the model store's append-only history is the
record of who moved it, when and why; MLflow's registered-model alias and tags mirror it.

Order matters: everything that can be checked is checked before the store is written, the store
is written before MLflow, and the mirror is rebuilt from the store's latest event, so a failed
mirror is repaired by running `mirror_alias` again (idempotent), never by moving twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from model_store import ModelStore, open_store
from relay.errors import RelayError, StoreError
from relay.settings import Settings
from relay.types import AliasEvent, LineageId
from tasks.tracking import mlflow_client

# MLflow's own rules for alias names: checked before the store is written, so a name MLflow
# would refuse never leaves a store move without its mirror.
_MLFLOW_ALIAS = re.compile(r"^[\w\-]{1,255}$")
_MLFLOW_VERSION_ALIAS = re.compile(r"^[vV]\d+$")


class AliasMirrorFailed(RelayError):
    """The store recorded an alias move but MLflow could not be updated to match."""


@dataclass(frozen=True)
class AliasMove:
    """A recorded alias move and the MLflow model version it now mirrors (None when cleared)."""

    event: AliasEvent
    mlflow_model_version: str | None


def check_alias_name(alias: str) -> None:
    """Raise ValueError unless MLflow accepts the alias name too."""
    if (
        not _MLFLOW_ALIAS.match(alias)
        or _MLFLOW_VERSION_ALIAS.match(alias)
        or alias.lower() == "latest"
    ):
        raise ValueError(
            f"alias {alias!r} is not usable in MLflow: letters, digits, '_' and '-' only, "
            "not 'latest' and not of the form v<number>"
        )


def mirror_tags(event: AliasEvent) -> dict[str, str]:
    """Registered-model tags that mirror an alias's latest move (MLflow keeps no alias history)."""
    prefix = f"relay.alias.{event.alias}"
    return {
        f"{prefix}.version": event.version or "",
        f"{prefix}.previous": event.previous or "",
        f"{prefix}.moved_by": event.actor,
        f"{prefix}.reason": event.reason,
        f"{prefix}.moved_at": event.at.isoformat(),
    }


def version_filter(model_name: str, lineage_id: str) -> str:
    """The MLflow search filter for a model version by lineage (MLflow filters are strings)."""
    LineageId.parse(lineage_id)  # hex and '_' only: nothing that could close the quotes
    if "'" in model_name:
        raise ValueError(f"model name {model_name!r} contains a quote")
    return f"name='{model_name}' and tags.lineage_id='{lineage_id}'"


def find_mlflow_version(client: Any, model_name: str, lineage_id: str) -> str:
    """The registered-model version carrying this lineage. Raises StoreError if there is none."""
    found = client.search_model_versions(version_filter(model_name, lineage_id))
    if not found:
        raise StoreError(
            f"no MLflow version of {model_name!r} has lineage {lineage_id}; register it first "
            "(an alias must point at the same version in the store and in MLflow)"
        )
    return str(found[0].version)


def mirror_alias(store: ModelStore, client: Any, model_name: str, alias: str) -> AliasMove:
    """Make MLflow's alias and tags match the store's latest move of `alias` (idempotent)."""
    history = store.alias_history(alias)
    if not history:
        raise StoreError(f"alias {alias!r} has never been set in {store.backend.describe()}")
    event = history[-1]
    mlflow_version = None
    try:
        if event.version is None:
            if alias in client.get_registered_model(model_name).aliases:
                client.delete_registered_model_alias(model_name, alias)
        else:
            lineage_id = store.get_manifest(event.version).lineage_id
            mlflow_version = find_mlflow_version(client, model_name, lineage_id)
            client.set_registered_model_alias(model_name, alias, mlflow_version)
        for key, value in mirror_tags(event).items():
            client.set_registered_model_tag(model_name, key, value)
    except Exception as exc:  # MLflow raises many types; the message says what to do
        raise AliasMirrorFailed(
            f"alias {alias!r} -> {event.version} is recorded in {store.backend.describe()}, but "
            f"mirroring it to MLflow model {model_name!r} failed ({type(exc).__name__}: {exc}); "
            "run mirror_alias again once MLflow is reachable"
        ) from exc
    return AliasMove(event=event, mlflow_model_version=mlflow_version)


def record_alias_move(
    store: ModelStore,
    client: Any,
    model_name: str,
    alias: str,
    version: str | None,
    *,
    actor: str,
    reason: str,
) -> AliasMove:
    """Check, append the move to the store's history, then mirror it to MLflow."""
    check_alias_name(alias)
    if not actor.strip() or not reason.strip():
        raise ValueError("an alias move needs an actor and a reason: they are the history")
    if version is not None:
        # Fail before writing anything if MLflow could not mirror this version.
        find_mlflow_version(client, model_name, store.get_manifest(version).lineage_id)
    store.set_alias(alias, version, actor=actor, reason=reason)
    return mirror_alias(store, client, model_name, alias)


@task(name="move-alias", cache_policy=NO_CACHE)
def move_alias(
    settings: Settings, alias: str, version: str | None, actor: str, reason: str
) -> AliasMove:
    """Point `alias` at `version` (None clears it), recorded in the store and mirrored to MLflow."""
    # No task retries: a retry would record the move twice. The mirror repairs itself instead.
    return record_alias_move(
        open_store(settings),
        mlflow_client(settings),
        settings.mlflow_model_name,
        alias,
        version,
        actor=actor,
        reason=reason,
    )

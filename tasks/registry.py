"""Register a candidate: blobs and manifest in the model store, a run and model version in MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from core.lineage.hashing import LineageRecord
from core.training.model import TrainedModel
from model_store import ModelStore, open_store
from relay.settings import Settings
from relay.types import LINEAGE_PARTS, EngineRecord, VersionManifest
from tasks.aliases import move_alias
from tasks.compilation import CompileOutcome
from tasks.tracking import mlflow_client

CANDIDATE = "candidate"


@dataclass(frozen=True)
class Registration:
    """Where the candidate landed."""

    version: str
    lineage_id: str
    mlflow_run_id: str
    mlflow_model_version: str
    newly_published: bool


def build_manifest(
    trained: TrainedModel,
    outcome: CompileOutcome,
    record: LineageRecord,
    store: ModelStore,
    model_path: Path,
    weights_path: Path,
) -> VersionManifest:
    """Upload the run's files as blobs and describe them; the manifest itself is not yet written."""
    lineage_id = str(record.lineage)
    params: dict[str, Any] = {
        **{k: v for k, v in vars(trained.config).items()},
        "train_rows": trained.rows["train"],
        "holdout_rows": trained.rows["holdout"],
    }
    return VersionManifest(
        version=lineage_id,  # content-derived: the same inputs give the same version
        created_at=datetime.now(UTC),
        lineage=record.lineage,
        lineage_id=lineage_id,
        metrics=trained.metrics,
        params=params,
        blobs={
            "model.onnx": store.put_blob(model_path),
            "weights.pt": store.put_blob(weights_path),
        },
        engines=[
            EngineRecord(name=e.name, blob=store.put_blob(e.path), options=e.options)
            for e in outcome.engines
        ],
        parity=outcome.parity,
        lineage_sources=record.sources,
    )


def log_mlflow_run(settings: Settings, manifest: VersionManifest) -> str:
    """The MLflow run for this lineage (params, metrics, lineage tags), created once."""
    client = mlflow_client(settings)
    experiment = client.get_experiment_by_name("relay")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("relay")
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.lineage_id = '{manifest.lineage_id}'", max_results=1
    )  # the value is our own hex id, never user input
    if found:
        return str(found[0].info.run_id)
    tags = {f"lineage.{part}": getattr(manifest.lineage, part) for part in LINEAGE_PARTS}
    tags["lineage_id"] = manifest.lineage_id
    run = client.create_run(
        experiment_id, run_name=f"train-{manifest.lineage.model[:8]}", tags=tags
    )
    run_id = str(run.info.run_id)
    for key, value in manifest.params.items():
        client.log_param(run_id, key, value)
    for key, value in manifest.metrics.items():
        client.log_metric(run_id, key, value)
    client.set_terminated(run_id)
    return run_id


def register_mlflow_version(settings: Settings, manifest: VersionManifest, store_url: str) -> str:
    """The registered-model version for this lineage, created once."""
    client = mlflow_client(settings)
    name = settings.mlflow_model_name
    existing = client.search_model_versions(
        f"name='{name}' and tags.lineage_id='{manifest.lineage_id}'"
    )
    if existing:
        return str(existing[0].version)
    if not client.search_registered_models(f"name='{name}'"):
        client.create_registered_model(name, description="Relay home-page CTR model")
    model_version = client.create_model_version(
        name,
        source=f"{store_url}/versions/{manifest.version}",
        run_id=manifest.mlflow_run_id,
        tags={"lineage_id": manifest.lineage_id},
    )
    return str(model_version.version)


@task(name="register-candidate", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def register_candidate(
    settings: Settings,
    trained: TrainedModel,
    outcome: CompileOutcome,
    record: LineageRecord,
    workdir: Path,
    actor: str,
) -> Registration:
    """Store blobs, write the manifest last, track in MLflow, and point `candidate` at it."""
    store = open_store(settings)
    manifest = build_manifest(
        trained, outcome, record, store, workdir / "model.onnx", workdir / "weights.pt"
    )
    existed = manifest.version in store.list_versions()
    manifest.mlflow_run_id = log_mlflow_run(settings, manifest)
    published = store.publish(manifest)  # last: a half-registered version never shows
    mlflow_version = register_mlflow_version(settings, published, settings.resolved_model_store_url)
    move_alias.fn(
        settings, CANDIDATE, published.version, actor, "registered by retrain_and_release"
    )
    return Registration(
        version=published.version,
        lineage_id=published.lineage_id,
        mlflow_run_id=published.mlflow_run_id or "",
        mlflow_model_version=mlflow_version,
        newly_published=not existed,
    )

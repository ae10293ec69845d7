"""retrain_and_release, run for real under Prefect's test harness on a small simulated window."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

import logstore
from flows.release import retrain_and_release
from model_store import open_store
from relay.settings import get_settings
from relay.types import LineageId
from simulation.seed import seed_events
from simulation.shop import ShopConfig, generate_events

GOOD_END = datetime(2026, 6, 1, tzinfo=UTC)
SMALL = {
    "window_days": 7.0,
    "training": {"epochs": 2},
    "data": {"min_rows": 5_000},
    "deploy": False,
}


def artifacts_of(flow_run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found}


@pytest.fixture(scope="module")
def release(prefect_harness, settings):
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    seed_events(client, 40_000, GOOD_END, config=ShopConfig(seed=21, n_users=3_000, n_items=1_000))
    state = retrain_and_release(window_end=GOOD_END, **SMALL, return_state=True)
    return state


def test_good_window_completes_and_registers_a_candidate(release, settings):
    assert release.is_completed(), release.message
    summary = release.result()
    store = open_store(settings)
    manifest = store.get_manifest(summary.version)
    assert store.get_alias("candidate") == summary.version
    assert manifest.lineage_id == summary.lineage_id == str(manifest.lineage)
    LineageId.parse(summary.lineage_id)
    assert summary.metrics["holdout_auc"] > 0.6
    assert [e.name for e in manifest.engines][0] == "ort-fp32"
    assert {p.engine for p in manifest.parity} == {"ort-fp32", "ort-int8"}
    assert manifest.lineage_sources["data"]["rows"] == 40_000


def test_registered_engine_downloads_with_verified_hash_and_scores_like_the_manifest(
    release, settings, tmp_path
):
    import onnxruntime as ort

    store = open_store(settings)
    manifest = store.get_manifest(release.result().version)
    path = store.fetch_blob(manifest.engines[0].blob, tmp_path / "engine.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scores = session.run(None, {"features": np.zeros((3, 27), dtype=np.float32)})[0]
    assert scores.shape == (3,) and np.all((scores > 0) & (scores < 1))


def test_mlflow_has_the_run_with_lineage_tags_and_the_candidate_alias(release, settings):
    from mlflow import MlflowClient

    summary = release.result()
    client = MlflowClient(
        tracking_uri=settings.resolved_mlflow_uri, registry_uri=settings.resolved_mlflow_uri
    )
    version = client.get_model_version_by_alias(settings.mlflow_model_name, "candidate")
    assert str(version.version) == summary.mlflow_model_version
    run = client.get_run(summary.mlflow_run_id)
    assert run.data.tags["lineage_id"] == summary.lineage_id
    for part in ("model", "data", "env", "build"):  # full hashes; the id shows their prefixes
        assert run.data.tags[f"lineage.{part}"].startswith(
            getattr(LineageId.parse(summary.lineage_id), part)
        )
    assert run.data.metrics["holdout_auc"] == pytest.approx(summary.metrics["holdout_auc"])


def test_run_publishes_summary_parity_and_validation_artifacts(release):
    found = artifacts_of(release.state_details.flow_run_id)
    assert {"release-summary", "parity", "data-validation"} <= set(found)
    assert release.result().lineage_id in found["release-summary"].data


def test_same_window_and_seed_reproduce_the_same_version(release, settings):
    again = retrain_and_release(window_end=GOOD_END, **SMALL, return_state=True)
    assert again.is_completed(), again.message
    assert again.result().version == release.result().version
    assert again.result().newly_published is False


def _bad_window(settings, end: datetime, mutate) -> None:
    frame = generate_events(ShopConfig(seed=31, n_users=1_000, n_items=500), 8_000, end)
    logstore.events.insert_events(logstore.connect(settings.resolved_clickhouse_dsn), mutate(frame))


def _nan_prices(frame):
    frame.loc[frame.index[:5], "price"] = np.nan
    return frame


@pytest.mark.parametrize(
    ("end", "mutate", "expected"),
    [
        (datetime(2019, 1, 1, tzinfo=UTC), None, "0 rows"),
        (
            datetime(2025, 1, 1, tzinfo=UTC),
            _nan_prices,
            "expect_column_values_to_not_be_null(price): observed 5 unexpected",
        ),
        (
            datetime(2025, 2, 1, tzinfo=UTC),
            lambda f: f.assign(clicked=np.uint8(1)),
            "expect_column_mean_to_be_between(clicked): observed 1.0",
        ),
    ],
    ids=["empty-window", "nan-features", "labels-all-one-class"],
)
def test_bad_window_stops_before_training_and_registers_nothing(
    release, settings, end, mutate, expected
):
    if mutate is not None:
        _bad_window(settings, end, mutate)
    store = open_store(settings)
    versions, candidate = store.list_versions(), store.get_alias("candidate")
    state = retrain_and_release(window_end=end, **SMALL, return_state=True)
    assert state.is_failed()
    assert "failed data validation" in state.message and expected in state.message
    assert store.list_versions() == versions and store.get_alias("candidate") == candidate


def test_unreachable_clickhouse_fails_naming_the_server_and_registers_nothing(
    release, settings, monkeypatch
):
    store = open_store(settings)
    versions = store.list_versions()
    monkeypatch.setenv("RELAY_CLICKHOUSE_DSN", "http://127.0.0.1:9/default")
    get_settings.cache_clear()
    try:
        state = retrain_and_release(window_end=GOOD_END, **SMALL, return_state=True)
    finally:
        monkeypatch.delenv("RELAY_CLICKHOUSE_DSN")
        get_settings.cache_clear()
    assert state.is_failed()
    assert "ClickHouse at http://127.0.0.1:9/default is unreachable" in state.message
    assert store.list_versions() == versions

"""compile_tensorrt_plan, run for real under Prefect's test harness on a host without CUDA.

The run must complete (a skip is data, not a failure), show why in its `tensorrt-plan`
artifact, and file nothing beside the version; an unknown version fails before any build.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from core.training.model import TrainConfig
from flows.tensorrt import compile_tensorrt_plan
from model_store import open_store
from model_store.attachments import attachment_key
from model_store.calibration import CALIBRATION_SET_KIND, CALIBRATION_SET_NAME, fix_calibration_set
from model_store.plans import list_plan_records
from relay.errors import VersionNotFound
from relay.gpu import NO_CUDA
from relay_testing.versions import train_and_publish
from simulation.shop import ShopConfig, generate_events

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")


@pytest.fixture(scope="module")
def published(prefect_harness, settings, tmp_path_factory):
    """A version in the session's store, and a calibration set if no release fixed one yet."""
    work = tmp_path_factory.mktemp("trt-flow")
    store = open_store(settings)
    frame = generate_events(
        ShopConfig(seed=5, n_users=2_000, n_items=500), 12_000, datetime(2026, 3, 1, tzinfo=UTC)
    )
    manifest, _ = train_and_publish(store, frame, TrainConfig(seed=5, epochs=1), work, "trt-flow")
    frame.tail(2_000).to_parquet(work / "calibration.parquet", index=False)
    ref = store.put_blob(work / "calibration.parquet")
    # Only if no release fixed the set yet, and removed afterwards: later releases in this
    # session must calibrate on their own shop's events, not on this one.
    created = fix_calibration_set(store, ref) == ref
    yield store, manifest.version
    if created:  # attachments are write-once by design: only a test takes one away
        store.backend.delete(attachment_key(None, CALIBRATION_SET_KIND, CALIBRATION_SET_NAME))


def test_plan_flow_without_cuda_completes_with_the_skip_as_data(published):
    store, version = published
    state = compile_tensorrt_plan(version=version, return_state=True)
    assert state.is_completed()
    assert state.result() is None  # nothing filed
    assert list_plan_records(store, version) == []
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    plan = next(a for a in artifacts if a.key == "tensorrt-plan")
    assert "skipped" in plan.description and NO_CUDA in str(plan.data)


def test_plan_flow_for_an_unknown_version_fails_before_any_build(published):
    state = compile_tensorrt_plan(version="no-such-version", return_state=True)
    assert state.is_failed()
    with pytest.raises(VersionNotFound, match="no-such-version"):
        state.result()

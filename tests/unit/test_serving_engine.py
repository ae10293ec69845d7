"""Engines: which one a host runs, the session options, and warm-up's refusal of bad output."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from relay.errors import ServingError
from relay.types import BlobRef, EngineRecord, LineageId, VersionManifest
from serving.engine import ort_session_options, warm_up
from serving.loading import HostCapabilities, choose_engine

CPU = HostCapabilities(("CPUExecutionProvider",))


def manifest_with(*names: str) -> VersionManifest:
    lineage = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)
    return VersionManifest(
        version="v1",
        created_at=datetime.now(UTC),
        lineage=lineage,
        lineage_id=str(lineage),
        engines=[EngineRecord(name=n, blob=BlobRef(sha256=n * 8, size=1)) for n in names],
    )


def test_a_tensorrt_record_in_a_manifest_is_not_an_onnx_runtime_engine() -> None:
    # plans are filed beside the version and loaded by serving.tensorrt_engine's hook
    assert choose_engine(manifest_with("trt-fp16", "ort-fp32"), CPU).name == "ort-fp32"


def test_fp32_is_preferred_to_int8_and_int8_serves_when_alone() -> None:
    assert choose_engine(manifest_with("ort-int8", "ort-fp32"), CPU).name == "ort-fp32"
    assert choose_engine(manifest_with("ort-int8"), CPU).name == "ort-int8"


def test_a_version_with_nothing_this_host_runs_is_refused_with_what_it_ships() -> None:
    with pytest.raises(ServingError, match=r"trt-fp16"):
        choose_engine(manifest_with("trt-fp16"), CPU)


def test_session_options_are_set_deliberately() -> None:
    import onnxruntime as ort

    opts = ort_session_options(2)
    assert opts.intra_op_num_threads == 2 and opts.inter_op_num_threads == 1
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert opts.enable_cpu_mem_arena and not opts.enable_mem_pattern
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


class NanEngine:
    name = "nan"

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.full(len(x), np.nan, dtype=np.float32)

    def close(self) -> None:
        pass


def test_warm_up_refuses_an_engine_whose_output_is_not_finite() -> None:
    with pytest.raises(ServingError, match="warm-up"):
        warm_up(NanEngine(), 64)

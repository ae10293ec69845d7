"""TensorRT without a GPU: skips are data, build options reach the build hash, the profile and
the builder calls are right, parity uses the trt-fp16 tolerance, plans are filed and found per GPU.

The real build and run need CUDA; bench/gpu_check.py exercises them on a GPU host.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from prefect.exceptions import ParameterTypeError
from prefect.flows import load_flow_from_entrypoint
from pydantic import ValidationError

import relay.gpu
import tasks.tensorrt as trt_tasks
from core.tensorrt.requests import PlanRun, plan_request_outcome
from model_store import ModelStore
from model_store.local import LocalBackend
from model_store.plans import list_plan_records, load_plan_record, save_plan_record
from relay.gpu import NO_CUDA, NO_TENSORRT, GpuProbe, GpuTarget, probe_gpu, unsupported_tensorrt
from relay.types import LineageId, VersionManifest
from serving import tensorrt_engine
from tasks.compilation import TOLERANCES, CompiledEngine, assess_parity, build_failed
from tasks.tensorrt import (
    TRT_ENGINE,
    BatchProfile,
    TensorRtBuild,
    TensorRtBuildOptions,
    build_and_check,
    build_plan,
    compile_tensorrt,
    plan_build_hash,
    plan_options,
    plan_record,
    profile_shapes,
)

ROOT = Path(__file__).resolve().parents[2]
H200 = GpuTarget(name="NVIDIA H200", compute_capability="9.0", tensorrt="10.13.3.9", cuda="12.8")
L4 = GpuTarget(name="NVIDIA L4", compute_capability="8.9", tensorrt="10.13.3.9", cuda="12.8")


# -- skips are data ---------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")
def test_compile_without_cuda_is_skipped_as_data_not_an_error(tmp_path):
    x = np.zeros((4, 27), dtype=np.float32)
    build = compile_tensorrt.fn(
        tmp_path / "model.onnx", x, tmp_path, labels=np.zeros(4), groups=np.zeros(4)
    )
    assert build.status == "skipped" and not build.accepted
    assert build.reason.startswith(NO_CUDA)
    assert build.engine is None and build.parity is None and build.build_hash is None
    assert build.summary()["status"] == "skipped"
    assert not list(tmp_path.glob("*.plan"))


def test_cuda_without_tensorrt_is_skipped_with_that_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(relay.gpu, "tensorrt_installed", lambda: False)
    probe = probe_gpu()
    assert not probe.available and probe.reason.startswith(NO_TENSORRT)


def test_tensorrt_outside_10_x_is_refused_with_the_reason():
    assert unsupported_tensorrt("10.13.3.9") is None
    assert "TensorRT 11 dropped the FP16 builder flag" in (unsupported_tensorrt("11.4.0.106") or "")
    assert unsupported_tensorrt("8.6.1") is not None


def test_serving_worker_without_tensorrt_loads_no_plan(tmp_path):
    tensorrt_engine.local_gpu.cache_clear()
    try:
        if relay.gpu.tensorrt_installed() and torch.cuda.is_available():
            pytest.skip("this host has tensorrt and CUDA")
        assert tensorrt_engine.local_gpu() is None
        store = ModelStore(LocalBackend(tmp_path / "store"))
        manifest = _publish(store, tmp_path)
        loaded = tensorrt_engine.load_local_plan(
            store, manifest, "champion", tmp_path / "cache", max_batch_rows=8
        )
        assert loaded is None
    finally:
        tensorrt_engine.local_gpu.cache_clear()


# -- the profile and the build options --------------------------------------------------------


def test_profile_shapes_replace_only_the_dynamic_batch_axis():
    shapes = profile_shapes((-1, 27), BatchProfile(min_batch=1, opt_batch=256, max_batch=4096))
    assert shapes == ((1, 27), (256, 27), (4096, 27))


@pytest.mark.parametrize(
    "shape, message",
    [((8, 27), "batch axis is fixed"), ((-1, -1), "only the batch axis"), ((), "scalar")],
)
def test_profile_shapes_refuse_inputs_without_one_dynamic_batch_axis(shape, message):
    with pytest.raises(ValueError, match=message):
        profile_shapes(shape, BatchProfile())


@pytest.mark.parametrize("bad", [(0, 1, 1), (8, 4, 16), (1, 64, 32)])
def test_batch_profile_must_be_ordered(bad):
    with pytest.raises(ValidationError, match="min_batch <= opt_batch <= max_batch|greater than"):
        BatchProfile(min_batch=bad[0], opt_batch=bad[1], max_batch=bad[2])


def test_plan_options_carry_the_gpu_and_the_profile():
    options = plan_options(H200, TensorRtBuildOptions(), "features", (-1, 27))
    assert options["gpu"] == "NVIDIA H200" and options["compute_capability"] == "9.0"
    assert options["tensorrt"] == "10.13.3.9" and options["precision"] == "fp16"
    assert options["profile"] == {"min": [1, 27], "opt": [256, 27], "max": [4096, 27]}


def test_the_gpu_enters_the_build_hash():
    digest = "ab" * 32
    on_h200 = plan_build_hash(digest, plan_options(H200, TensorRtBuildOptions(), "f", (-1, 27)))
    same = plan_build_hash(digest, plan_options(H200, TensorRtBuildOptions(), "f", (-1, 27)))
    on_l4 = plan_build_hash(digest, plan_options(L4, TensorRtBuildOptions(), "f", (-1, 27)))
    other_cc = H200.model_copy(update={"compute_capability": "10.0"})
    on_sm100 = plan_build_hash(
        digest, plan_options(other_cc, TensorRtBuildOptions(), "f", (-1, 27))
    )
    wider = TensorRtBuildOptions(profile=BatchProfile(max_batch=8192))
    wider_profile = plan_build_hash(digest, plan_options(H200, wider, "f", (-1, 27)))
    assert on_h200 == same
    assert len({on_h200, on_l4, on_sm100, wider_profile}) == 4


def test_gpu_key_names_model_capability_and_tensorrt():
    assert H200.key == "nvidia-h200-sm90-trt10.13.3.9"
    assert "/" not in GpuTarget(name="A/B  GPU", compute_capability="8.0", tensorrt="10.0").key


# -- the builder's calls, against a recording stand-in for the tensorrt module -----------------


class FakeTrt:
    """Just the TensorRT 10 Python API build_plan uses, recording each call."""

    def __init__(self, *, parses: bool = True, builds: bool = True) -> None:
        self.calls: list[tuple[Any, ...]] = []
        calls = self.calls
        self.Logger = type("Logger", (), {"WARNING": "WARNING", "__init__": lambda s, sev: None})
        self.BuilderFlag = SimpleNamespace(FP16="FP16")
        self.MemoryPoolType = SimpleNamespace(WORKSPACE="WORKSPACE")
        tensor = SimpleNamespace(name="features", shape=(-1, 27))
        network = SimpleNamespace(num_inputs=1, num_outputs=1, get_input=lambda i: tensor)

        class Profile:
            def set_shape(self, name, mn, opt, mx):
                calls.append(("set_shape", name, mn, opt, mx))

        class Config:
            def set_flag(self, flag):
                calls.append(("set_flag", flag))

            def set_memory_pool_limit(self, pool, size):
                calls.append(("set_memory_pool_limit", pool, size))

            def add_optimization_profile(self, profile):
                calls.append(("add_optimization_profile",))

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                calls.append(("create_network", flags))
                return network

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, net, config):
                calls.append(("build_serialized_network",))
                return b"PLAN-BYTES" if builds else None

        class OnnxParser:
            num_errors = 0 if parses else 1

            def __init__(self, net, logger):
                pass

            def parse_from_file(self, path):
                calls.append(("parse_from_file", Path(path).name))
                return parses

            def get_error(self, i):
                return "In node 3: unsupported operator Foo"

        self.Builder, self.OnnxParser = Builder, OnnxParser


def test_build_plan_makes_an_fp16_plan_with_the_batch_profile(tmp_path):
    fake = FakeTrt()
    options = TensorRtBuildOptions(profile=BatchProfile(min_batch=1, opt_batch=64, max_batch=512))
    engine = build_plan(fake, tmp_path / "model.onnx", tmp_path / "p.plan", H200, options)
    assert fake.calls == [
        ("create_network", 0),
        ("parse_from_file", "model.onnx"),
        ("set_flag", "FP16"),
        ("set_memory_pool_limit", "WORKSPACE", 1024 << 20),
        ("set_shape", "features", (1, 27), (64, 27), (512, 27)),
        ("add_optimization_profile",),
        ("build_serialized_network",),
    ]
    assert engine.name == TRT_ENGINE and engine.path.read_bytes() == b"PLAN-BYTES"
    assert engine.options == plan_options(H200, options, "features", (-1, 27))


def test_build_plan_reports_the_parsers_complaint(tmp_path):
    with pytest.raises(RuntimeError, match="unsupported operator Foo"):
        build_plan(
            FakeTrt(parses=False), tmp_path / "m.onnx", tmp_path / "p", H200, TensorRtBuildOptions()
        )


def test_build_plan_without_a_plan_is_an_error_naming_the_gpu(tmp_path):
    with pytest.raises(RuntimeError, match="NVIDIA H200"):
        build_plan(
            FakeTrt(builds=False), tmp_path / "m.onnx", tmp_path / "p", H200, TensorRtBuildOptions()
        )


# -- parity with the trt-fp16 tolerance -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """sigmoid(features @ w - 3): a real ONNX graph with the export's names and dynamic batch."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [27, 1], rng.normal(0, 0.3, 27).tolist())
    bias = helper.make_tensor("b", TensorProto.FLOAT, [1], [-3.0])
    shape = helper.make_tensor("s", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "w"], ["z"]),
            helper.make_node("Add", ["z", "b"], ["zb"]),
            helper.make_node("Sigmoid", ["zb"], ["p"]),
            helper.make_node("Reshape", ["p", "s"], ["ctr"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 27])],
        [helper.make_tensor_value_info("ctr", TensorProto.FLOAT, ["batch"])],
        initializer=[w, bias, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("tiny") / "model.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def calibration():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (2000, 27)).astype(np.float32)
    labels = (rng.random(2000) < 0.1).astype(np.int64)
    groups = np.repeat(np.arange(200), 10)
    return x, labels, groups


def _fake_gpu_build(monkeypatch, model: Path, noise: float) -> None:
    """build_plan writes a file; run_plan returns the ONNX Runtime scores plus `noise`."""
    from tasks.compilation import run_engine

    def fake_build(trt, model_path, out, gpu, options):
        out.write_bytes(b"PLAN")
        return CompiledEngine(TRT_ENGINE, out, plan_options(gpu, options, "features", (-1, 27)))

    monkeypatch.setattr(trt_tasks, "build_plan", fake_build)
    monkeypatch.setattr(trt_tasks, "run_plan", lambda path, x: run_engine(model, x) + noise)


@pytest.mark.parametrize("noise, status", [(4e-4, "built"), (0.03, "rejected")])
def test_plan_is_gated_on_parity_with_onnx_runtime_fp32(
    monkeypatch, tmp_path, tiny_model, calibration, noise, status
):
    _fake_gpu_build(monkeypatch, tiny_model, noise)
    x, labels, groups = calibration
    build = build_and_check(
        None, tiny_model, x, labels, groups, tmp_path, H200, TensorRtBuildOptions()
    )
    assert build.status == status and build.gpu == H200
    assert build.parity is not None and build.parity.engine == TRT_ENGINE
    assert build.parity.tolerances == TOLERANCES[TRT_ENGINE].as_dict()
    assert build.parity.max_abs_diff == pytest.approx(noise, rel=1e-2)
    assert build.build_hash and build.engine is not None
    if status == "rejected":
        assert "max |Δscore|" in build.reason


def test_a_plan_that_fails_to_build_is_rejected_with_the_reason(monkeypatch, tmp_path, calibration):
    def broken(*args):
        raise RuntimeError("out of workspace")

    monkeypatch.setattr(trt_tasks, "build_plan", broken)
    x, labels, groups = calibration
    build = build_and_check(
        None, tmp_path / "m.onnx", x, labels, groups, tmp_path, H200, TensorRtBuildOptions()
    )
    assert build.status == "rejected" and "out of workspace" in build.reason
    assert build.parity == build_failed(TRT_ENGINE, RuntimeError("out of workspace"))


def test_fp16_tolerance_is_between_int8_and_fp32():
    fp16, fp32, int8 = TOLERANCES["trt-fp16"], TOLERANCES["ort-fp32"], TOLERANCES["ort-int8"]
    assert fp32.max_abs_diff < fp16.max_abs_diff < int8.max_abs_diff
    assert fp32.min_topk_overlap > fp16.min_topk_overlap > int8.min_topk_overlap
    rng = np.random.default_rng(2)
    reference = rng.uniform(0, 0.3, 1000)
    labels = (rng.random(1000) < reference).astype(int)
    groups = np.repeat(np.arange(100), 10)
    half = reference.astype(np.float16).astype(np.float32)  # what fp16 rounding does to scores
    assert assess_parity(TRT_ENGINE, reference, half, labels, groups, fp16).accepted


# -- plans filed beside the version, found per GPU ---------------------------------------------


def _publish(store: ModelStore, tmp_path: Path, version: str = "v1") -> VersionManifest:
    model = tmp_path / f"{version}.onnx"
    model.write_bytes(b"onnx bytes of " + version.encode())
    lineage = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)
    return store.publish(
        VersionManifest(
            version=version,
            created_at=datetime.now(UTC),
            lineage=lineage,
            lineage_id=str(lineage),
            blobs={"model.onnx": store.put_blob(model)},
        )
    )


def _built(tmp_path: Path, gpu: GpuTarget, accepted: bool = True) -> TensorRtBuild:
    plan = tmp_path / f"{gpu.key}.plan"
    plan.write_bytes(b"plan for " + gpu.key.encode())
    options = plan_options(gpu, TensorRtBuildOptions(), "features", (-1, 27))
    return TensorRtBuild(
        status="built" if accepted else "rejected",
        reason="within tolerance" if accepted else "max |Δscore| 0.03 > 0.01",
        gpu=gpu,
        engine=CompiledEngine(TRT_ENGINE, plan, options),
        build_hash=plan_build_hash("x", options),
    )


def test_plans_are_filed_per_gpu_and_found_only_by_that_gpu(tmp_path):
    store = ModelStore(LocalBackend(tmp_path / "store"))
    _publish(store, tmp_path)
    build = _built(tmp_path, H200)
    saved = save_plan_record(store, plan_record("v1", build, store.put_blob(build.engine.path)))
    assert saved.accepted and saved.engine is not None
    assert saved.engine.options["compute_capability"] == "9.0"
    assert load_plan_record(store, "v1", H200.key) == saved
    assert tensorrt_engine.find_local_plan(store, "v1", H200) == saved.engine
    assert tensorrt_engine.find_local_plan(store, "v1", L4) is None  # another GPU model
    newer_trt = H200.model_copy(update={"tensorrt": "10.14.1.48"})
    assert tensorrt_engine.find_local_plan(store, "v1", newer_trt) is None


def test_a_rejected_plan_is_recorded_without_a_blob_and_never_served(tmp_path):
    store = ModelStore(LocalBackend(tmp_path / "store"))
    _publish(store, tmp_path)
    record = save_plan_record(store, plan_record("v1", _built(tmp_path, L4, accepted=False), None))
    assert not record.accepted and record.engine is None and "0.03" in record.reason
    assert tensorrt_engine.find_local_plan(store, "v1", L4) is None
    assert [r.gpu.key for r in list_plan_records(store, "v1")] == [L4.key]


def test_first_plan_filed_for_a_gpu_wins(tmp_path):
    store = ModelStore(LocalBackend(tmp_path / "store"))
    _publish(store, tmp_path)
    first = save_plan_record(store, plan_record("v1", _built(tmp_path, H200, accepted=False), None))
    build = _built(tmp_path, H200)
    second = save_plan_record(store, plan_record("v1", build, store.put_blob(build.engine.path)))
    assert second == first


def test_a_skip_is_never_filed(tmp_path, monkeypatch):
    monkeypatch.setattr(trt_tasks, "create_table_artifact", lambda **kwargs: None)
    monkeypatch.setattr(trt_tasks, "open_store", lambda settings: pytest.fail("store opened"))
    assert trt_tasks.store_tensorrt_plan.fn(None, "v1", trt_tasks.skipped(NO_CUDA)) is None
    with pytest.raises(ValueError, match="no GPU target"):
        plan_record("v1", trt_tasks.skipped(NO_CUDA), None)


def test_store_task_uploads_the_plan_and_gc_keeps_it(tmp_path, monkeypatch):
    from datetime import timedelta

    store = ModelStore(LocalBackend(tmp_path / "store"))
    _publish(store, tmp_path)
    artifacts: list[dict] = []
    monkeypatch.setattr(trt_tasks, "create_table_artifact", lambda **kw: artifacts.append(kw))
    monkeypatch.setattr(trt_tasks, "open_store", lambda settings: store)
    record = trt_tasks.store_tensorrt_plan.fn(None, "v1", _built(tmp_path, H200))
    assert record is not None and record.engine is not None
    assert store.gc(min_age=timedelta(0)).deleted == []
    fetched = store.fetch_blob(record.engine.blob, tmp_path / "fetched.plan")
    assert fetched.read_bytes() == (tmp_path / f"{H200.key}.plan").read_bytes()
    assert artifacts[0]["key"] == "tensorrt-plan" and artifacts[0]["table"][0]["status"] == "built"


def test_a_plan_that_does_not_load_falls_back_to_onnx_runtime(tmp_path, monkeypatch, caplog):
    store = ModelStore(LocalBackend(tmp_path / "store"))
    manifest = _publish(store, tmp_path)
    build = _built(tmp_path, H200)
    save_plan_record(store, plan_record("v1", build, store.put_blob(build.engine.path)))
    monkeypatch.setattr(tensorrt_engine, "local_gpu", lambda: H200)

    def no_runtime(name, path):
        raise ImportError("No module named 'tensorrt'")

    monkeypatch.setattr(tensorrt_engine, "TensorRtPlanEngine", no_runtime)
    with caplog.at_level(logging.WARNING, logger="serving.tensorrt"):
        loaded = tensorrt_engine.load_local_plan(
            store, manifest, "v1", tmp_path / "cache", max_batch_rows=8
        )
    assert loaded is None
    assert "loading ONNX Runtime instead" in caplog.text and H200.key in caplog.text


# -- asking the gpu pool from the release ------------------------------------------------------


def test_plan_request_outcomes_read_as_data(tmp_path):
    done = [PlanRun("r1", "COMPLETED", True)]
    accepted = plan_record("v1", _built(tmp_path, H200), None)
    accepted = accepted.model_copy(update={"accepted": True})
    rejected = plan_record("v1", _built(tmp_path, L4, accepted=False), None)
    assert plan_request_outcome(done, [accepted]).plans == [H200.key]
    assert plan_request_outcome(done, [rejected]).status == "rejected"
    assert plan_request_outcome([PlanRun("r1", "SCHEDULED", False)], []).status == "pending"
    assert plan_request_outcome(done, []).status == "skipped"
    assert plan_request_outcome([PlanRun("r1", "CRASHED", True)], []).status == "error"


@pytest.mark.parametrize("online, why", [(None, "does not exist"), (0, "has no online worker")])
def test_release_without_gpu_workers_skips_the_plan_at_once(monkeypatch, online, why):
    monkeypatch.setattr(trt_tasks, "_online_workers", lambda pool: online)
    request = trt_tasks.request_tensorrt_plan.fn(None, "v1", wait_s=600)
    assert request.status == "skipped" and why in request.reason


def test_plan_builds_go_to_every_queue_a_worker_polls_not_only_default():
    queues = [
        trt_tasks.GpuQueue("default", "NOT_READY"),  # nobody polls it once each GPU has its own
        trt_tasks.GpuQueue("l4", "READY"),
        trt_tasks.GpuQueue("h200", "READY"),
        trt_tasks.GpuQueue("a100", "PAUSED"),
    ]
    assert trt_tasks.queues_to_ask(queues) == ["h200", "l4"]
    assert trt_tasks.queues_to_ask([trt_tasks.GpuQueue("default", "READY")]) == ["default"]


def test_release_asks_each_gpu_models_queue_for_its_plan(monkeypatch, tmp_path):
    import prefect.deployments

    store = ModelStore(LocalBackend(tmp_path / "store"))
    _publish(store, tmp_path)
    for gpu in (H200, L4):  # what each queue's worker files
        build = _built(tmp_path, gpu)
        save_plan_record(store, plan_record("v1", build, store.put_blob(build.engine.path)))
    queues = [
        trt_tasks.GpuQueue("default", "NOT_READY"),
        trt_tasks.GpuQueue("h200", "READY"),
        trt_tasks.GpuQueue("l4", "READY"),
    ]
    started: list[dict[str, Any]] = []

    def run_deployment(name: str, **kwargs: Any) -> SimpleNamespace:
        started.append({"name": name, **kwargs})
        return SimpleNamespace(id=f"run-{kwargs['work_queue_name']}")

    monkeypatch.setattr(trt_tasks, "_online_workers", lambda pool: 2)
    monkeypatch.setattr(trt_tasks, "_pool_queues", lambda pool: queues)
    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment)
    monkeypatch.setattr(
        trt_tasks,
        "_wait_for_runs",
        lambda ids, wait_s: [PlanRun(i, "COMPLETED", True) for i in ids],
    )
    monkeypatch.setattr(trt_tasks, "open_store", lambda settings: store)

    request = trt_tasks.request_tensorrt_plan.fn(None, "v1", wait_s=60)
    assert [s["work_queue_name"] for s in started] == ["h200", "l4"]
    assert {s["name"] for s in started} == {trt_tasks.PLAN_DEPLOYMENT}
    assert [s["idempotency_key"] for s in started] == [
        "tensorrt-plan-v1-h200",
        "tensorrt-plan-v1-l4",
    ]
    assert request.status == "built" and request.flow_run_ids == ["run-h200", "run-l4"]
    assert request.plans == sorted([H200.key, L4.key])


def test_a_gpu_pool_whose_queues_nobody_polls_skips_the_plan_at_once(monkeypatch):
    monkeypatch.setattr(trt_tasks, "_online_workers", lambda pool: 1)
    monkeypatch.setattr(
        trt_tasks, "_pool_queues", lambda pool: [trt_tasks.GpuQueue("default", "NOT_READY")]
    )
    monkeypatch.setattr(trt_tasks, "_wait_for_runs", lambda *a: pytest.fail("waited"))
    request = trt_tasks.request_tensorrt_plan.fn(None, "v1", wait_s=600)
    assert request.status == "skipped" and "no work queue" in request.reason


def test_plan_flow_rejects_a_disordered_profile_before_any_work():
    flow = load_flow_from_entrypoint(str(ROOT / "flows/tensorrt.py:compile_tensorrt_plan"))
    with pytest.raises(ParameterTypeError, match="min_batch <= opt_batch"):
        flow.validate_parameters({"version": "v1", "profile": {"min_batch": 64, "opt_batch": 8}})
    assert flow.validate_parameters({})["version"] == "champion"


def test_probe_result_type_is_data():
    probe = GpuProbe(None, NO_CUDA)
    assert not probe.available and probe.reason == NO_CUDA


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")
def test_gpu_check_runs_on_a_cpu_host_and_says_why_tensorrt_was_skipped(tmp_path, capsys):
    from bench import gpu_check

    out = tmp_path / "gpu_check.json"
    argv = ["--events", "4000", "--batches", "1,16", "--seconds", "0.01", "--out", str(out)]
    assert gpu_check.main(argv) == 0
    figures = json.loads(out.read_text())
    assert figures == json.loads(capsys.readouterr().out)
    assert figures["tensorrt"]["status"] == "skipped"
    assert figures["tensorrt"]["reason"].startswith(NO_CUDA)
    assert set(figures["latency"]) == {"ort-fp32"}
    assert figures["latency"]["ort-fp32"]["16"]["p50_ms"] > 0

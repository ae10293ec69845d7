"""Compile the ONNX model into a TensorRT FP16 plan for this host's GPU, gated on parity.

A plan runs only on the GPU model and TensorRT version that built it, so it is built on a GPU
host (work pool `gpu`, flow `compile_tensorrt_plan`) after the version is published, and filed
beside the version under that GPU's key (model_store/plans.py); serving workers on the same GPU
load it (serving/tensorrt_engine.py). Every plan has one optimisation profile over the batch
axis and is checked against ONNX Runtime fp32 on the calibration set with the `trt-fp16`
tolerance. The GPU's name and compute capability are build options, so they enter the plan's
build hash. On a host without CUDA or tensorrt the step returns a `skipped` outcome with the
reason, as data: the release goes on with ONNX Runtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import pandas as pd
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field, model_validator

from core.lineage.hashing import build_hash
from core.tensorrt.requests import (
    GpuQueue,
    PlanRequest,
    PlanRun,
    plan_request_outcome,
    queues_to_ask,
)
from model_store import ModelStore, open_store
from model_store.calibration import current_calibration_set, load_report
from model_store.hashing import sha256_file
from model_store.plans import PlanRecord, list_plan_records, save_plan_record
from relay.errors import StoreError
from relay.features import LABEL, to_model_input
from relay.gpu import GpuTarget, probe_gpu
from relay.settings import Settings
from relay.types import BlobRef, EngineRecord, ParityResult
from tasks.compilation import (
    TOLERANCES,
    CompiledEngine,
    assess_parity,
    build_failed,
    run_engine,
)

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

TRT_ENGINE = "trt-fp16"
PLAN_DEPLOYMENT = "compile-tensorrt-plan/compile-tensorrt"  # flow name / deployment name
GPU_POOL = "gpu"

Status = Literal["built", "rejected", "skipped"]


class BatchProfile(BaseModel, frozen=True):
    """The plan's one optimisation profile over the batch axis: smallest, tuned-for, largest."""

    min_batch: int = Field(default=1, ge=1)
    opt_batch: int = Field(default=256, ge=1)  # around the rows of one batched call under load
    max_batch: int = Field(default=4096, ge=1, le=1 << 20)  # the runner splits larger batches

    @model_validator(mode="after")
    def _ordered(self) -> BatchProfile:
        if not 1 <= self.min_batch <= self.opt_batch <= self.max_batch:
            raise ValueError(
                "batch profile needs 1 <= min_batch <= opt_batch <= max_batch, got "
                f"{self.min_batch} / {self.opt_batch} / {self.max_batch}"
            )
        return self


class TensorRtBuildOptions(BaseModel, frozen=True):
    """How plans are built; everything here is a build option and so part of the build hash."""

    profile: BatchProfile = BatchProfile()
    workspace_mib: int = 1024  # scratch memory TensorRT may use while choosing tactics


def profile_shapes(
    input_shape: tuple[int, ...], profile: BatchProfile
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """min/opt/max shapes of an input whose first axis is the dynamic batch and the rest fixed."""
    if not input_shape:
        raise ValueError("the model input is a scalar: there is no batch axis to profile")
    batch, *rest = input_shape
    if batch >= 0:
        raise ValueError(
            f"the model input's batch axis is fixed at {batch} (shape {input_shape}); "
            "export it with a dynamic batch axis"
        )
    if any(d < 0 for d in rest):
        raise ValueError(f"only the batch axis may be dynamic, got input shape {input_shape}")
    min_shape, opt_shape, max_shape = (
        (n, *rest) for n in (profile.min_batch, profile.opt_batch, profile.max_batch)
    )
    return min_shape, opt_shape, max_shape


def plan_options(
    gpu: GpuTarget, options: TensorRtBuildOptions, input_name: str, input_shape: tuple[int, ...]
) -> dict[str, Any]:
    """The engine options recorded with a plan: the GPU it is tied to and how it was built."""
    min_shape, opt_shape, max_shape = profile_shapes(input_shape, options.profile)
    return {
        "precision": "fp16",
        "input": input_name,
        "profile": {"min": list(min_shape), "opt": list(opt_shape), "max": list(max_shape)},
        "workspace_mib": options.workspace_mib,
        "gpu": gpu.name,
        "compute_capability": gpu.compute_capability,
        "tensorrt": gpu.tensorrt,
        "cuda": gpu.cuda,
    }


def plan_build_hash(plan_sha256: str, options: dict[str, Any]) -> str:
    """The lineage build part of a plan: its bytes and options, hashed as for every engine."""
    return build_hash({TRT_ENGINE: plan_sha256}, {TRT_ENGINE: options})


@dataclass(frozen=True)
class TensorRtBuild:
    """What the TensorRT step did: a plan within tolerance, a rejected plan, or a skip (with why)."""

    status: Status
    reason: str
    gpu: GpuTarget | None = None
    engine: CompiledEngine | None = None
    parity: ParityResult | None = None
    build_hash: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status == "built"

    def summary(self) -> dict[str, Any]:
        """One flat row for artifacts, logs and bench JSON."""
        parity = self.parity
        return {
            "engine": TRT_ENGINE,
            "status": self.status,
            "reason": self.reason,
            "gpu": self.gpu.name if self.gpu else None,
            "compute_capability": self.gpu.compute_capability if self.gpu else None,
            "tensorrt": self.gpu.tensorrt if self.gpu else None,
            "plan_key": self.gpu.key if self.gpu else None,
            "build_hash": self.build_hash,
            "max_abs_diff": parity.max_abs_diff if parity else None,
            "auc_delta": parity.auc_delta if parity else None,
            "topk_overlap": parity.topk_overlap if parity else None,
        }


def skipped(reason: str) -> TensorRtBuild:
    return TensorRtBuild(status="skipped", reason=reason)


def build_plan(
    trt: Any, model_path: Path, out: Path, gpu: GpuTarget, options: TensorRtBuildOptions
) -> CompiledEngine:
    """Parse the ONNX model and build a serialized FP16 plan with one batch-axis profile.

    `trt` is the tensorrt module (passed in so the call sequence is testable without a GPU).
    Raises RuntimeError with the parser's or builder's complaint.
    """
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # Networks are always explicit-batch in TensorRT 10: the EXPLICIT_BATCH creation flag is
    # deprecated and ignored, so no flags. Not STRONGLY_TYPED: the FP16 flag needs weak typing.
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {model_path.name}: {errors or 'no detail'}")
    if network.num_inputs != 1 or network.num_outputs != 1:
        raise RuntimeError(
            f"{model_path.name} has {network.num_inputs} inputs and {network.num_outputs} "
            "outputs; the serving runner feeds one (n, 27) input and reads one (n,) output"
        )
    tensor = network.get_input(0)
    shape = tuple(int(d) for d in tensor.shape)
    recorded = plan_options(gpu, options, tensor.name, shape)
    min_shape, opt_shape, max_shape = profile_shapes(shape, options.profile)

    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    profile = builder.create_optimization_profile()
    profile.set_shape(tensor.name, min_shape, opt_shape, max_shape)
    config.add_optimization_profile(profile)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(
            f"TensorRT built no plan for {model_path.name} on {gpu.name} (see its log above)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        f.write(serialized)
    return CompiledEngine(TRT_ENGINE, out, recorded)


def run_plan(path: Path, x: np.ndarray) -> np.ndarray:
    """Scores from a plan over x, through the same runner the serving worker uses."""
    from serving.tensorrt_engine import TensorRtPlanEngine

    engine = TensorRtPlanEngine(TRT_ENGINE, path)
    try:
        return engine.run(np.ascontiguousarray(x, dtype=np.float32))
    finally:
        engine.close()


def build_and_check(
    trt: Any,
    model_path: Path,
    x: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    workdir: Path,
    gpu: GpuTarget,
    options: TensorRtBuildOptions,
) -> TensorRtBuild:
    """Build the plan on this GPU and gate it on parity with ONNX Runtime fp32 over x."""
    out = workdir / f"{TRT_ENGINE}-{gpu.key}.plan"
    try:
        engine = build_plan(trt, model_path, out, gpu, options)
        candidate = run_plan(engine.path, x)
    except Exception as exc:  # a plan that cannot be built or run is rejected, with the reason
        failed = build_failed(TRT_ENGINE, exc)
        return TensorRtBuild("rejected", failed.reason, gpu=gpu, parity=failed)
    reference = run_engine(model_path, x)
    parity = assess_parity(TRT_ENGINE, reference, candidate, labels, groups, TOLERANCES[TRT_ENGINE])
    digest, _ = sha256_file(engine.path)
    return TensorRtBuild(
        status="built" if parity.accepted else "rejected",
        reason=parity.reason,
        gpu=gpu,
        engine=engine,
        parity=parity,
        build_hash=plan_build_hash(digest, engine.options),
    )


@task(name="compile-tensorrt", cache_policy=NO_CACHE)
def compile_tensorrt(
    model_path: Path,
    calibration_x: np.ndarray,
    workdir: Path,
    *,
    labels: np.ndarray,
    groups: np.ndarray,
    options: TensorRtBuildOptions | None = None,
) -> TensorRtBuild:
    """An FP16 plan for this host's GPU checked against ONNX Runtime fp32, or why there is none."""
    probe = probe_gpu()
    if probe.target is None:
        print(f"TensorRT {probe.reason}; serving stays on ONNX Runtime")
        return skipped(probe.reason)
    import tensorrt as trt  # the probe found it

    return build_and_check(
        trt,
        model_path,
        calibration_x,
        labels,
        groups,
        workdir,
        probe.target,
        options or TensorRtBuildOptions(),
    )


# -- the plan beside its version -------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    """What a plan build needs from the store: the version's ONNX and its calibration set."""

    version: str  # resolved: an alias asked for becomes the version it points at
    model_path: Path
    x: np.ndarray
    labels: np.ndarray
    groups: np.ndarray
    calibration_set: BlobRef


def calibration_ref(store: ModelStore, version: str) -> BlobRef:
    """The set the version was blessed on, else the current one. Raises StoreError if neither."""
    report = load_report(store, version)
    if report is not None:
        return report.calibration_set
    current = current_calibration_set(store)
    if current is None:
        raise StoreError(
            f"no calibration set for {version} in {store.describe()}: run the release "
            "(its calibration step fixes the set) before building TensorRT plans"
        )
    return current


def plan_record(version: str, build: TensorRtBuild, blob: BlobRef | None) -> PlanRecord:
    """The record filed beside the version for a built or rejected plan (never for a skip)."""
    if build.gpu is None:
        raise ValueError(f"a {build.status} TensorRT build has no GPU target to file it under")
    engine = (
        EngineRecord(name=TRT_ENGINE, blob=blob, options=build.engine.options)
        if blob is not None and build.engine is not None and build.accepted
        else None
    )
    return PlanRecord(
        version=version,
        gpu=build.gpu,
        accepted=build.accepted and engine is not None,
        reason=build.reason,
        engine=engine,
        parity=build.parity,
        build_hash=build.build_hash or "",
    )


@task(name="load-plan-inputs", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def load_plan_inputs(settings: Settings, version_or_alias: str, workdir: Path) -> PlanInputs:
    """The ONNX model and calibration set of a version (or alias), downloaded and hash-checked."""
    store = open_store(settings)
    manifest = store.resolve(version_or_alias)
    version = manifest.version
    onnx = manifest.blobs.get("model.onnx")
    if onnx is None:
        raise StoreError(f"version {version} lists no model.onnx blob to build a plan from")
    model_path = store.fetch_blob(onnx, workdir / f"{version}-model.onnx")
    ref = calibration_ref(store, version)
    frame = pd.read_parquet(
        store.fetch_blob(ref, workdir / f"calibration-{ref.sha256[:12]}.parquet")
    )
    return PlanInputs(
        version=version,
        model_path=model_path,
        x=to_model_input(frame),
        labels=frame[LABEL].to_numpy().astype(np.int64),
        groups=pd.factorize(frame["session_id"])[0],
        calibration_set=ref,
    )


@task(name="store-tensorrt-plan", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def store_tensorrt_plan(
    settings: Settings, version: str, build: TensorRtBuild
) -> PlanRecord | None:
    """File a built or rejected plan beside the version (a skip files nothing) and show it."""
    record: PlanRecord | None = None
    if build.status != "skipped":
        store = open_store(settings)
        blob = store.put_blob(build.engine.path) if build.accepted and build.engine else None
        record = save_plan_record(store, plan_record(version, build, blob))
    create_table_artifact(
        key="tensorrt-plan",
        table=[build.summary()],
        description=f"TensorRT plan of {version}: {build.status} ({build.reason})",
    )
    return record


# -- asking the gpu pool from the release (the decisions: core.tensorrt.requests) ------------


def _online_workers(pool: str) -> int | None:
    """Workers of the pool that heartbeat now; None when the pool does not exist."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkerStatus
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            workers = client.read_workers_for_work_pool(pool)
        except ObjectNotFound:
            return None
    return sum(1 for w in workers if w.status == WorkerStatus.ONLINE)


def _pool_queues(pool: str) -> list[GpuQueue]:
    """Every work queue of the pool with its status."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        queues = client.read_work_queues(work_pool_name=pool)
    return [
        GpuQueue(q.name, q.status.value if q.status else ("PAUSED" if q.is_paused else "NOT_READY"))
        for q in queues
    ]


@task(name="request-tensorrt-plan", cache_policy=NO_CACHE)
def request_tensorrt_plan(settings: Settings, version: str, wait_s: float = 900.0) -> PlanRequest:
    """Have the gpu pool build the version's plans (one run per polled queue, i.e. per GPU model)
    and wait up to wait_s for them; never fails the release.

    No gpu pool, no online worker in it, no queue a worker polls, or no `compile-tensorrt`
    deployment is `skipped`, at once: the release then serves ONNX Runtime everywhere, as on
    hosts without CUDA.
    """
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    runs: list[PlanRun] = []
    try:
        online = _online_workers(GPU_POOL)
        if not online:
            why = "does not exist" if online is None else "has no online worker"
            return PlanRequest(status="skipped", reason=f"skipped: work pool {GPU_POOL!r} {why}")
        gpu_queues = queues_to_ask(_pool_queues(GPU_POOL))
        if not gpu_queues:
            return PlanRequest(
                status="skipped",
                reason=f"skipped: no work queue of pool {GPU_POOL!r} is polled by a worker",
            )
        # Start every queue's build first, then wait: the GPU models build side by side.
        started = [
            run_deployment(
                PLAN_DEPLOYMENT,
                parameters={"version": version},
                timeout=0,
                work_queue_name=queue,
                idempotency_key=f"tensorrt-plan-{version}-{queue}",  # a retried release reuses it
            )
            for queue in gpu_queues
        ]
        runs = _wait_for_runs([cast("FlowRun", run).id for run in started], wait_s)
    except ObjectNotFound:
        return PlanRequest(
            status="skipped", reason=f"skipped: deployment {PLAN_DEPLOYMENT} is not deployed"
        )
    except Exception as exc:  # the plan is an optimisation: asking for it never stops a release
        return PlanRequest(status="error", reason=f"{type(exc).__name__}: {exc}")
    return plan_request_outcome(runs, list_plan_records(open_store(settings), version))


def _wait_for_runs(ids: list[Any], wait_s: float, poll_s: float = 5.0) -> list[PlanRun]:
    """Each flow run's state once all are final or wait_s has passed."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + wait_s
    with get_client(sync_client=True) as client:
        while True:
            runs = []
            for run_id in ids:
                state = client.read_flow_run(run_id).state
                runs.append(
                    PlanRun(
                        str(run_id),
                        state.type.value if state else "UNKNOWN",
                        bool(state and state.is_final()),
                    )
                )
            if all(r.final for r in runs) or time.monotonic() >= deadline:
                return runs
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

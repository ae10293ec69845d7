"""compile_tensorrt_plan: a published version's TensorRT plan for the GPU this worker runs on.

Runs on the `gpu` work pool (deployment `compile-tensorrt`), one run per GPU model that serves.
The release asks for it after registration (tasks.tensorrt.request_tensorrt_plan) with the
candidate's version; started by hand from the UI it defaults to `champion`, e.g. when a new GPU
model joins the fleet. On a host without CUDA
or tensorrt the run completes with a `skipped` artifact and files nothing.
"""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from pydantic import Field

from model_store.plans import PlanRecord
from relay.settings import get_settings
from tasks.tensorrt import (
    BatchProfile,
    TensorRtBuildOptions,
    compile_tensorrt,
    load_plan_inputs,
    store_tensorrt_plan,
)
from tasks.workdir import run_workdir


@flow(name="compile-tensorrt-plan", log_prints=True)
def compile_tensorrt_plan(
    version: Annotated[str, Field(min_length=1)] = "champion",
    profile: BatchProfile = BatchProfile(),  # noqa: B008 - frozen pydantic model
    workspace_mib: Annotated[int, Field(ge=64, le=65_536)] = 1024,
) -> PlanRecord | None:
    """Fetch the version's (or alias's) ONNX and calibration set, build and check the plan, file it."""
    settings = get_settings()
    workdir = run_workdir(settings)
    inputs = load_plan_inputs(settings, version, workdir)
    build = compile_tensorrt(
        inputs.model_path,
        inputs.x,
        workdir,
        labels=inputs.labels,
        groups=inputs.groups,
        options=TensorRtBuildOptions(profile=profile, workspace_mib=workspace_mib),
    )
    return store_tensorrt_plan(settings, inputs.version, build)

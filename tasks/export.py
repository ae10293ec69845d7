"""Export the trained PyTorch model to ONNX with a dynamic batch axis, and check the graph."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from core.training.model import CtrModel, TrainedModel
from relay.features import N_FEATURES

INPUT_NAME = "features"
OUTPUT_NAME = "ctr"
OPSET = 17


def export_model(model: CtrModel, path: Path) -> Path:
    """Write `model` as ONNX (input `features` float32 [batch, 27] -> `ctr` float32 [batch])."""
    model.eval()
    example = torch.zeros((2, N_FEATURES), dtype=torch.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        opset_version=OPSET,
        dynamo=False,  # the dynamo exporter needs onnxscript; the TorchScript one is enough here
    )
    onnx.checker.check_model(str(path), full_check=True)
    return path


@task(name="export-onnx", cache_policy=NO_CACHE)
def export_onnx(trained: TrainedModel, workdir: Path) -> Path:
    """The run's model.onnx, checked by onnx.checker."""
    return export_model(trained.model, workdir / "model.onnx")

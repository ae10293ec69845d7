"""A real model version in a store: trained, exported, compiled and published in-process."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from core.lineage.hashing import compute_lineage_record
from core.training.model import TrainConfig, TrainedModel, train_model
from model_store import ModelStore
from relay.types import VersionManifest
from tasks.compilation import CompileOutcome, optimise_fp32, quantise_int8
from tasks.export import export_model
from tasks.registry import build_manifest


def train_and_publish(
    store: ModelStore, frame: pd.DataFrame, config: TrainConfig, workdir: Path, window: str
) -> tuple[VersionManifest, TrainedModel]:
    """Train on `frame`, export, compile (ort-fp32 + ort-int8), publish; the manifest and model.

    The same tasks as the release, called directly: no Prefect run, no MLflow, no blessing, so
    nothing is checked for parity. The version is the lineage id, as in a release.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    trained = train_model(frame, config)
    torch.save(trained.model.state_dict(), workdir / "weights.pt")
    model_path = export_model(trained.model, workdir / "model.onnx")
    engines = [
        optimise_fp32(model_path, workdir / "ort-fp32.onnx"),
        quantise_int8(model_path, workdir / "ort-int8.onnx"),
    ]
    record = compute_lineage_record(model_path, frame, engines, window)
    manifest = build_manifest(
        trained,
        CompileOutcome(engines=engines, parity=[]),
        record,
        store,
        model_path,
        workdir / "weights.pt",
    )
    return store.publish(manifest), trained

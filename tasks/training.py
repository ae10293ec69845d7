"""Prefect shell of training: fit the model (core.training) and save its weights for the run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

# The model, its knobs and metrics live in the pure core; re-exported for existing callers.
from core.training.model import (
    CtrModel,
    TrainConfig,
    TrainedModel,
    auc,
    logloss,
    predict,
    split_by_time,
    train_model,
)

__all__ = [
    "CtrModel",
    "TrainConfig",
    "TrainedModel",
    "auc",
    "logloss",
    "predict",
    "split_by_time",
    "train_ctr_model",
    "train_model",
]


@task(name="train-ctr-model", cache_policy=NO_CACHE)
def train_ctr_model(frame: pd.DataFrame, config: TrainConfig, workdir: Path) -> TrainedModel:
    """Train on the validated window and save the weights into the run's work directory."""
    trained = train_model(frame, config)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.save(trained.model.state_dict(), workdir / "weights.pt")
    return trained

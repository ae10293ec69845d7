"""Train the CTR model: embeddings for categorical columns + an MLP over scaled dense features.

Pure: a frame in, a trained model and its holdout metrics out. The Prefect shell that saves the
weights into a run's work directory is `tasks.training`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
import pandas as pd
import torch
from pydantic import Field
from scipy.stats import rankdata
from torch import nn

from relay.features import CATEGORICAL, LABEL, N_CATEGORICAL, N_FEATURES, to_model_input


class CtrModel(nn.Module):
    """float32 (n, 27) raw model input -> P(click) (n,). Dense scaling lives in the graph."""

    def __init__(
        self,
        dense_mean: np.ndarray,
        dense_std: np.ndarray,
        embedding_dim: int = 8,
        hidden: tuple[int, ...] = (64, 32),
    ) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(
            nn.Embedding(spec.buckets, embedding_dim) for spec in CATEGORICAL
        )
        self.register_buffer("dense_mean", torch.as_tensor(dense_mean, dtype=torch.float32))
        self.register_buffer("dense_std", torch.as_tensor(dense_std, dtype=torch.float32))
        layers: list[nn.Module] = []
        width = N_CATEGORICAL * embedding_dim + (N_FEATURES - N_CATEGORICAL)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        idx = x[:, :N_CATEGORICAL].to(torch.int64)
        parts = [emb(idx[:, i]) for i, emb in enumerate(self.embeddings)]
        mean, std = self.dense_mean, self.dense_std
        assert isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor)  # buffers
        parts.append((x[:, N_CATEGORICAL:] - mean) / std)
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))


@dataclass(frozen=True)
class TrainConfig:
    """Training knobs, each logged to MLflow as a param. The one home of their defaults."""

    # The bounds are checked where a run's parameters are validated (the flow's run form).
    seed: int = 7
    epochs: Annotated[int, Field(ge=1, le=50)] = 2
    batch_size: Annotated[int, Field(ge=32, le=65_536)] = 1024
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 3e-3
    embedding_dim: Annotated[int, Field(ge=1, le=256)] = 8
    hidden: tuple[int, ...] = (64, 32)
    holdout_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1


@dataclass
class TrainedModel:
    """A trained model with its holdout, the reference every compiled engine is checked against."""

    model: CtrModel
    config: TrainConfig
    metrics: dict[str, float]
    holdout_x: np.ndarray
    holdout_y: np.ndarray
    holdout_groups: np.ndarray  # session index per holdout row: ranking is checked per request
    reference_scores: np.ndarray
    rows: dict[str, int] = field(default_factory=dict)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the rank-sum formula (ties get average ranks). NaN when one class is absent."""
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logloss(labels: np.ndarray, scores: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of predicted probabilities."""
    p = np.clip(scores.astype(np.float64), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def split_by_time(
    frame: pd.DataFrame, holdout_fraction: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train on the earlier part of the window, hold out the latest: how the model is used."""
    ordered = frame.sort_values("ts", kind="stable")
    cut = int(len(ordered) * (1 - holdout_fraction))
    return ordered.iloc[:cut], ordered.iloc[cut:]


def predict(model: CtrModel, x: np.ndarray, batch: int = 65_536) -> np.ndarray:
    """Scores for a matrix of model inputs, in batches."""
    model.eval()
    out = np.empty(len(x), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, len(x), batch):
            out[start : start + batch] = model(torch.from_numpy(x[start : start + batch])).numpy()
    return out


def train_model(frame: pd.DataFrame, config: TrainConfig) -> TrainedModel:
    """Fit the model on the window's earlier rows; measure AUC and logloss on the latest rows."""
    torch.manual_seed(config.seed)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(config.seed)
    train_frame, holdout_frame = split_by_time(frame, config.holdout_fraction)
    x_train = to_model_input(train_frame)
    y_train = train_frame[LABEL].to_numpy().astype(np.float32)
    x_hold = to_model_input(holdout_frame)
    y_hold = holdout_frame[LABEL].to_numpy().astype(np.int64)
    if len(np.unique(y_train)) < 2:
        raise ValueError("training labels are all one class: the model cannot learn from them")

    dense = x_train[:, N_CATEGORICAL:]
    model = CtrModel(
        dense.mean(axis=0),
        np.maximum(dense.std(axis=0), 1e-6),
        config.embedding_dim,
        config.hidden,
    )
    optimiser = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    loss_fn = nn.BCEWithLogitsLoss()
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    started = time.perf_counter()
    for _ in range(config.epochs):
        model.train()
        order = torch.from_numpy(rng.permutation(len(xt)))
        for start in range(0, len(order), config.batch_size):
            idx = order[start : start + config.batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss = loss_fn(model.logits(xt[idx]), yt[idx])
            loss.backward()
            optimiser.step()
    train_s = time.perf_counter() - started

    scores = predict(model, x_hold)
    groups = pd.factorize(holdout_frame["session_id"])[0]
    return TrainedModel(
        model=model,
        config=config,
        metrics={
            "holdout_auc": auc(y_hold, scores),
            "holdout_logloss": logloss(y_hold, scores),
            "holdout_ctr": float(y_hold.mean()),
            "mean_predicted_ctr": float(scores.mean()),
            "train_seconds": train_s,
        },
        holdout_x=x_hold,
        holdout_y=y_hold,
        holdout_groups=groups,
        reference_scores=scores,
        rows={"train": len(train_frame), "holdout": len(holdout_frame)},
    )

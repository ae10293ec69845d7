from datetime import UTC, datetime

import numpy as np
import pytest
import torch

from core.training.model import TrainConfig, auc, logloss, train_model
from simulation.shop import ShopConfig, generate_events


@pytest.fixture(scope="module")
def frame():
    return generate_events(
        ShopConfig(seed=5, n_users=2_000, n_items=800), 20_000, datetime(2026, 2, 1, tzinfo=UTC)
    )


def test_auc_matches_the_pairwise_definition_including_ties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = rng.integers(0, 10, 300).astype(float)  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert auc(labels, scores) == pytest.approx(pairwise)
    assert np.isnan(auc(np.zeros(5), np.arange(5.0)))


def test_logloss_of_perfect_and_coin_flip_predictions():
    y = np.array([0, 1, 1, 0])
    assert logloss(y, y.astype(float)) < 1e-6
    assert logloss(y, np.full(4, 0.5)) == pytest.approx(np.log(2))


# Two trainings: 20-120 s on the shared 2 cores (torch's threads contend under load).
@pytest.mark.slow
def test_training_learns_real_signal_and_is_deterministic_under_a_seed(frame):
    config = TrainConfig(seed=3, epochs=2, batch_size=256)
    first = train_model(frame, config)
    second = train_model(frame, config)
    assert first.metrics["holdout_auc"] > 0.62  # the shop's ground truth has real signal
    assert first.metrics["holdout_logloss"] < 0.25
    for (name, a), (_, b) in zip(
        first.model.state_dict().items(), second.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert np.array_equal(first.reference_scores, second.reference_scores)


def test_holdout_is_the_latest_part_of_the_window(frame):
    trained = train_model(frame, TrainConfig(seed=1, epochs=1, holdout_fraction=0.2))
    assert trained.rows == {"train": 16_000, "holdout": 4_000}


def test_labels_all_one_class_are_refused(frame):
    flat = frame.assign(clicked=0)
    with pytest.raises(ValueError, match="all one class"):
        train_model(flat, TrainConfig(epochs=1))

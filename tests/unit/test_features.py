import numpy as np
import pandas as pd
import pytest

from relay.features import (
    CATEGORICAL,
    DENSE,
    FEATURE_NAMES,
    N_CATEGORICAL,
    N_FEATURES,
    bucket_ids,
    to_model_input,
)
from simulation.shop import ShopConfig, generate_events


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from datetime import UTC, datetime

    return generate_events(
        ShopConfig(seed=3, n_users=500, n_items=300), 2_000, datetime(2026, 1, 8, tzinfo=UTC)
    )


def test_model_input_has_27_float32_columns_with_categoricals_in_range(events):
    x = to_model_input(events)
    assert x.shape == (len(events), N_FEATURES) == (2_000, 27)
    assert x.dtype == np.float32
    for j, spec in enumerate(CATEGORICAL):
        assert x[:, j].min() >= 0 and x[:, j].max() < spec.buckets
        assert np.array_equal(x[:, j], np.round(x[:, j]))  # exact integers survive float32
    assert np.isfinite(x).all()


def test_bucket_ids_are_stable_across_calls_and_spread_out():
    ids = np.arange(1_000_000, 1_010_000, dtype=np.uint64)
    a, b = bucket_ids(ids, 50_000), bucket_ids(ids.copy(), 50_000)
    assert np.array_equal(a, b)
    assert len(np.unique(a)) > 9_000  # few collisions for 10k ids in 50k buckets
    assert bucket_ids(np.array([1_000_123], dtype=np.uint64), 50_000)[0] == a[123]


def test_column_order_does_not_change_the_model_input(events):
    shuffled = events[list(reversed(events.columns))]
    assert np.array_equal(to_model_input(events), to_model_input(shuffled))


def test_missing_feature_column_is_named(events):
    with pytest.raises(ValueError, match="missing feature columns: price"):
        to_model_input(events.drop(columns=["price"]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_dense_value_is_named(events, bad):
    broken = events.copy()
    broken.loc[5, "user_ctr_30d"] = bad
    with pytest.raises(ValueError, match="non-finite.*user_ctr_30d"):
        to_model_input(broken)


def test_feature_names_are_unique_and_split_9_categorical_18_dense():
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) == 27
    assert N_CATEGORICAL == 9


def _column_by_column(frame: pd.DataFrame) -> np.ndarray:
    """The pipeline as it was written before it was encoded block by block: the reference."""
    out = np.empty((len(frame), N_FEATURES), dtype=np.float32)
    for j, spec in enumerate(CATEGORICAL):
        raw = frame[spec.name].to_numpy()
        if spec.hashed:
            out[:, j] = bucket_ids(raw, spec.buckets)
        else:
            out[:, j] = np.clip(raw.astype(np.int64), 0, spec.buckets - 1)
    for j, dspec in enumerate(DENSE, start=N_CATEGORICAL):
        v = frame[dspec.name].to_numpy(dtype=np.float64)
        if dspec.transform == "log1p":
            v = np.log1p(np.clip(v, 0.0, None))
        elif dspec.transform == "clip01":
            v = np.clip(v, 0.0, 1.0)
        out[:, j] = v
    return out


@pytest.mark.parametrize("id_dtype", [np.uint64, np.float64])
def test_block_encoding_equals_the_column_by_column_pipeline_at_the_edges(id_dtype):
    # ids up to 2**53 (JSON's exact limit), codes below and above range, negative counts,
    # rates outside [0, 1]: every branch of every encoding, bit for bit
    rng = np.random.default_rng(11)
    n = 500
    frame = pd.DataFrame(
        {
            **{
                c.name: (
                    rng.integers(0, 2**53, n, dtype=np.uint64).astype(id_dtype)
                    if c.hashed
                    else rng.integers(-5, c.buckets + 5, n).astype(np.float64)
                )
                for c in CATEGORICAL
            },
            **{d.name: rng.normal(0, 1, n) * d.high for d in DENSE},
        }
    )
    got = to_model_input(frame)
    assert np.array_equal(got, _column_by_column(frame))
    assert np.array_equal(to_model_input(frame.iloc[:1]), _column_by_column(frame.iloc[:1]))
    assert to_model_input(frame.iloc[:0]).shape == (0, N_FEATURES)

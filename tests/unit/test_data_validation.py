from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from core.data.validation import (
    DataLimits,
    failure_message,
    validate_frame,
    window_ending,
    with_served,
)
from simulation.shop import ShopConfig, generate_events

LIMITS = DataLimits(min_rows=1_000)


@pytest.fixture(scope="module")
def good():
    return generate_events(
        ShopConfig(seed=2, n_users=1_000, n_items=500), 3_000, datetime(2026, 3, 1, tzinfo=UTC)
    )


def failed(report) -> dict[str, str]:
    return {f"{f.expectation}({f.column})": f.observed for f in report.failures}


def test_simulated_window_passes_the_suite(good):
    report = validate_frame(good, LIMITS)
    assert report.success, failure_message(report, window_ending(None, 7))
    assert report.rows == 3_000 and len(report.outcomes) > 60


def test_empty_window_fails_with_zero_rows_observed(good):
    report = validate_frame(good.iloc[:0], LIMITS)
    assert not report.success and "0 rows" in failure_message(report, window_ending(None, 7))


def test_missing_column_is_named(good):
    report = validate_frame(good.drop(columns=["item_rating"]), LIMITS)
    assert "expect_table_columns_to_match_set()" in failed(report)
    assert "item_rating" not in failed(report)["expect_table_columns_to_match_set()"]


def test_nan_and_inf_features_fail_naming_columns_and_counts(good):
    broken = good.copy()
    broken.loc[[1, 2], "price"] = np.nan
    broken.loc[7, "user_ctr_30d"] = np.inf
    fails = failed(validate_frame(broken, LIMITS))
    assert fails["expect_column_values_to_not_be_null(price)"].startswith("2 unexpected")
    assert fails["expect_column_values_to_be_between(user_ctr_30d)"].startswith("1 unexpected")


def test_labels_all_one_class_fail_the_label_rate_bounds(good):
    report = validate_frame(good.assign(clicked=np.uint8(0)), LIMITS)
    assert failed(report)["expect_column_mean_to_be_between(clicked)"] == "0.0"


def test_too_few_rows_and_message_lists_each_failure(good):
    report = validate_frame(good.iloc[:500], LIMITS)
    message = failure_message(report, window_ending(datetime(2026, 3, 1, tzinfo=UTC), 7))
    assert "expect_table_row_count_to_be_between(): observed 500" in message
    assert "2026-02-22T00:00:00+00:00" in message


def test_window_must_have_positive_length():
    with pytest.raises(ValueError, match="window_days must be positive"):
        window_ending(None, 0)


def test_served_impressions_join_the_window_in_time_order() -> None:
    events = pd.DataFrame({"ts": pd.to_datetime([1, 3], unit="s", utc=True), "clicked": [0, 1]})
    served = pd.DataFrame({"ts": pd.to_datetime([2], unit="s", utc=True), "clicked": [1]})
    joined = with_served(events, served)
    assert joined["ts"].is_monotonic_increasing and joined["clicked"].tolist() == [0, 1, 1]
    assert with_served(events, served.iloc[:0]) is events

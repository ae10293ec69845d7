"""The mirror cost's interval for a median is the binomial order-statistic one, with its coverage."""

from __future__ import annotations

import numpy as np

from bench.mirror_cost import median_interval


def test_too_few_rounds_give_no_interval_and_six_give_their_extremes() -> None:
    assert median_interval([0.1, 0.2, 0.3, 0.4, 0.5]) is None  # 1 - 2/32 = 93.75 % < 95 %
    assert median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)  # 96.9 %


def test_twenty_rounds_use_the_sixth_value_from_each_end() -> None:
    # P(Binomial(20, 1/2) < 6) = 2.07 %, so (x_(6), x_(15)) covers 95.9 %; x_(7) would cover 88 %
    assert median_interval([float(i) for i in range(1, 21)]) == (6.0, 15.0)


def test_the_interval_covers_a_skewed_population_median_as_often_as_it_claims() -> None:
    rng = np.random.default_rng(7)
    true_median = float(np.log(2))  # of an exponential with rate 1
    covered = 0
    for _ in range(4000):
        lo, hi = median_interval(list(rng.exponential(1.0, 20)))
        covered += lo <= true_median <= hi
    assert 0.945 <= covered / 4000 <= 0.975  # 95.9 % nominal; binomial SE over 4,000 is 0.3 pt

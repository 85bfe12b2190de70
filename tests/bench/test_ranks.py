"""bench/ranks.py against Spearman's correlation worked by hand."""
from __future__ import annotations

import math

from bench.ranks import pearson, ranks, spearman


def test_ties_share_their_average_rank():
    assert ranks([10.0, 30.0, 20.0, 30.0]).tolist() == [1.0, 3.5, 2.0, 3.5]


def test_spearman_by_hand():
    # ranks 1,2,3,4,5 against 2,1,4,3,5: d² = 1+1+1+1+0 = 4, rho = 1 - 6·4 / (5·24) = 0.8
    assert math.isclose(spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50]), 0.8)
    assert math.isclose(spearman([1, 2, 3], [3, 2, 1]), -1.0)
    # with a tie: x ranks 1, 2.5, 2.5, 4; y ranks 1..4 -> centred (-1.5, 0, 0, 1.5) · (-1.5, -0.5, 0.5, 1.5)
    # = 4.5 over sqrt(4.5 · 5)
    assert math.isclose(spearman([1, 2, 2, 3], [1, 2, 3, 4]), 4.5 / math.sqrt(4.5 * 5))


def test_no_spread_is_nan():
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_pearson_by_hand():
    # x centred (-1, 0, 1), y = (1, 3, 2) centred (-1, 1, 0): products 1 + 0 + 0 = 1, over sqrt(2 · 2)
    assert math.isclose(pearson([1, 2, 3], [1, 3, 2]), 0.5)
    assert math.isnan(pearson([2, 2, 2], [1, 2, 3]))

"""Error-message helpers of fedalign.errors: how a message shows the array it got."""

from __future__ import annotations

import numpy as np
import pytest

from fedalign.errors import short_array


@pytest.mark.parametrize("a, kw, want", [
    ([0.25, 0.25], {}, "[0.25 0.25]"),
    ([40, 0], {}, "[40  0]"),
    (np.arange(6), {}, "[0 1 2 3 4 5]"),                       # nothing to leave out
    (np.arange(7), {}, "[0 1 2 ... 4 5 6]"),                   # more than 5 values: summarised
    (np.arange(8), dict(threshold=8), "[0 1 2 3 4 5 6 7]"),
    (np.arange(9), dict(threshold=8), "[0 1 2 ... 6 7 8]"),
    ([1 / 3, 1 / 3, 0.5], dict(precision=4), "[0.3333 0.3333 0.5   ]"),
    (np.array("1"), {}, "'1'"),
    ([[1, 2], [3, 4]], {}, "[[1 2] [3 4]]"),                   # rows on one line
])
def test_short_array_is_a_few_values_on_one_line(a, kw, want):
    assert short_array(a, **kw) == want


def test_short_array_never_breaks_a_line():
    rows = np.random.default_rng(0).normal(size=(4, 50)) * 1e6
    text = short_array(rows, precision=10)
    assert "\n" not in text and text.count("...") == 4 and text.startswith("[[")
    assert "\n" in np.array2string(rows, threshold=5)          # what numpy alone gives

"""The one accuracy of the package: the fraction of labelled rows a classifier gets right.

Every score in fedalign goes through :func:`accuracy`: the one-shot heads
(:meth:`fedalign.heads.LinearHead.accuracy`) and every DaDiL classifier
(:mod:`fedalign.dadil.classifiers`). Rows labelled −1 are unlabelled and not scored; a test set
with no labelled row is an error, never NaN.
"""

from __future__ import annotations

import numpy as np

from fedalign.errors import FedalignError


def accuracy(predict, X, y) -> float:
    """Fraction of labelled rows (y ≥ 0) predicted correctly: mean over {i : y_i ≥ 0} of
    [predict(X)_i = y_i].

    Parameters
    ----------
    predict : callable X (m, d) → (m,) labels; called once, on the labelled rows only
    X : (n, d) features; y : (n,) int labels, −1 = unlabelled

    Raises
    ------
    FedalignError
        When no row is labelled (the score would be 0/0).
    """
    y = np.asarray(y)
    keep = y >= 0
    if not np.any(keep):
        raise FedalignError("no labeled rows to score (every label is −1)")
    return float(np.mean(np.asarray(predict(np.asarray(X)[keep])) == y[keep]))

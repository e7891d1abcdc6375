"""The linear head of a labeled GMM trained on its samples (fedalign.gmm_head)."""

from __future__ import annotations

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.gmm import GMM, fit_gmm
from fedalign.gmm_head import sample_balanced, train_head_from_gmm


def _two_class_gmm(labels=((1, 0), (1, 0), (0, 1))) -> GMM:
    """Class 0 owns components 0 (w 0.2) and 1 (w 0.3); class 1 owns component 2."""
    return GMM([0.2, 0.3, 0.5], [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]],
               [[1.0, 4.0], [0.25, 1.0], [1.0, 1.0]], np.array(labels, dtype=float))


def test_sample_balanced_draws_n_per_owning_class_from_its_components():
    X, y = sample_balanced(_two_class_gmm(), 20_000, 0)
    assert X.shape == (40_000, 2) and y.dtype == np.int64
    assert np.array_equal(np.bincount(y), [20_000, 20_000])       # the masses do not matter
    near_second = np.mean(X[y == 0, 0] > 5)                       # class 0: w 0.2 vs 0.3
    assert abs(near_second - 0.6) < 0.02
    np.testing.assert_allclose(X[y == 1].mean(0), [0.0, 10.0], atol=0.05)
    one_class = _two_class_gmm(((1, 0), (1, 0), (1, 0)))        # class 1 owns nothing
    assert np.array_equal(np.unique(sample_balanced(one_class, 5, 0)[1]), [0])


def test_sample_balanced_draws_as_before_the_split():
    """The seeded draws of fedalign.gmm before this module split off (same RNG use order:
    per class, the components, then the noise), to the last bit."""
    X, y = sample_balanced(_two_class_gmm(), 3, 0)
    want = [[10.05245005857652, -0.535669373161111], [0.36159505490948474, 2.6080000902602745],
            [0.9470809631292422, -1.4074704716139852], [-2.3250307746388343, 9.781208336067454],
            [-1.2459109472530652, 9.26773264529655], [-0.5442589828573099, 9.683699843630846]]
    np.testing.assert_array_equal(X, want)
    assert y.tolist() == [0, 0, 0, 1, 1, 1]


def test_head_from_gmm_samples_classifies_the_data_it_models():
    rng = np.random.default_rng(6)
    y = rng.integers(0, 3, 600)
    X = rng.normal(size=(3, 5))[y] * 4.0 + rng.normal(size=(600, 5))
    g = fit_gmm(X, y, components_per_class=2)
    head = train_head_from_gmm(g, n_per_class=200, seed=0)
    assert (head.predict(X) == y).mean() > 0.98
    again = train_head_from_gmm(g, n_per_class=200, seed=0)
    assert np.array_equal(head[-1].coef_, again[-1].coef_)        # the seed fixes the samples


def test_unlabeled_or_one_class_gmms_are_refused():
    g = _two_class_gmm()
    unlabeled = GMM(g.weights, g.means, g.variances)
    with pytest.raises(FedalignError, match="the GMM has no labels"):
        sample_balanced(unlabeled, 5)
    with pytest.raises(FedalignError, match="fewer than 2 classes"):
        train_head_from_gmm(_two_class_gmm(((1, 0), (1, 0), (1, 0))), n_per_class=5)

"""Classification EM of the lda head: the fast LDA family against fedcgs.server_aggregate, the
iteration against a plain loop of it, and bad inputs."""

import numpy as np
import pytest

from fedalign.dadil.classification_em import _LDAFamily, cem_lda
from fedalign.errors import FedalignError
from fedalign.heads.fedcgs import Config, class_statistics, server_aggregate

C, D = 4, 30


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    msgs = []
    for k in range(2):                       # two labeled sources, shifted
        X = rng.normal(size=(200, D)) * rng.uniform(0.5, 2.0, D) + k
        y = rng.integers(0, C, 200)
        X[np.arange(200), y] += 3.0
        msgs.append(class_statistics(X, y, C))
    Xt = rng.normal(size=(150, D)) + 0.5
    yt = rng.integers(0, C, 150)
    Xt[np.arange(150), yt] += 3.0
    return msgs, Xt, yt, rng.integers(0, C, 150)


def _lda(msgs, X, y, ridge, to):
    return server_aggregate(msgs + [class_statistics(X, y, C)], C,
                            Config(covariance="within", ridge=ridge, shrink_to=to))


@pytest.mark.parametrize("to", ["identity", "diagonal"])
@pytest.mark.parametrize("ridge", [0.0, 0.01, 0.3, 0.6])
def test_family_is_the_lda_of_the_summed_statistics(data, to, ridge):
    msgs, Xt, _, y0 = data
    fam = _LDAFamily(msgs, Xt, C, ridge, to)
    for y in (y0, np.roll(y0, 7), np.zeros_like(y0)):     # an empty class too
        got, want = fam.head(y), _lda(msgs, Xt, y, ridge, to)
        np.testing.assert_allclose(got.W, want.W, rtol=1e-9, atol=1e-9 * np.abs(want.W).max())
        np.testing.assert_allclose(got.b, want.b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("to", ["identity", "diagonal"])
def test_cem_is_the_plain_iteration(data, to):
    msgs, Xt, _, y0 = data
    res = cem_lda(msgs, Xt, y0, C, 0.1, to)
    y, changed = y0.copy(), []
    for _ in range(10):                      # the oracle: relabel with the LDA until stable
        new = _lda(msgs, Xt, y, 0.1, to).predict(Xt)
        if np.array_equal(new, y):
            break
        changed.append(int(np.sum(new != y)))
        y = new
    np.testing.assert_array_equal(res.labels, y)
    assert res.changed == changed and res.iterations == len(changed) >= 1 and res.converged
    np.testing.assert_array_equal(res.head.predict(Xt), _lda(msgs, Xt, y, 0.1, to).predict(Xt))


def test_cem_zero_iterations_is_the_one_pass_head(data):
    msgs, Xt, _, y0 = data
    res = cem_lda(msgs, Xt, y0, C, 0.1, "identity", max_iter=0)
    assert res.iterations == 0 and res.converged and res.changed == []
    np.testing.assert_array_equal(res.labels, y0)
    want = _lda(msgs, Xt, y0, 0.1, "identity")
    np.testing.assert_array_equal(res.head.predict(Xt), want.predict(Xt))


def test_cem_stops_at_max_iter(data):
    msgs, Xt, _, y0 = data
    full = cem_lda(msgs, Xt, y0, C, 0.1, "identity")
    one = cem_lda(msgs, Xt, y0, C, 0.1, "identity", max_iter=1)
    assert full.iterations > 1 and one.iterations == 1 and not one.converged
    assert one.changed == full.changed[:1]


@pytest.mark.parametrize("X, y, kw, match", [
    (np.ones((5, D)), np.array([0, 1, 2, 3, 4]), {}, "labels must be in"),
    (np.ones((5, D)), np.array([0, 1, -1, 3, 0]), {}, "labels must be in"),
    (np.ones((5, D)), np.array([0, 1, 2]), {}, "needs rows"),
    (np.ones((0, D)), np.zeros(0, int), {}, "needs rows"),
    (np.ones((5, D)), np.zeros(5, int), dict(max_iter=-1), "max_iter"),
    (np.ones((5, D)), np.zeros(5, int), dict(shrink_to="ledoit"), "shrink_to"),
])
def test_cem_bad_inputs(data, X, y, kw, match):
    msgs = data[0]
    shrink_to = kw.pop("shrink_to", "identity")
    with pytest.raises(FedalignError, match=match):
        cem_lda(msgs, X, y, C, 0.1, shrink_to, **kw)

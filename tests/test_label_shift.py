"""fedalign.label_shift: Saerens' EM against a likelihood maximiser, the completed Gaussian
against the mixture's moments, and the map onto it on a shifted federation that lacks a class."""

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.stats import multivariate_normal

from fedalign.dadil.target_head import class_statistics
from fedalign.errors import FedalignError
from fedalign.gaussian import ot_map
from fedalign.label_shift import (ABSENT_RATIO, PriorEstimate, completed_gaussian, em_priors,
                                  estimate_priors, target_reference)

MEANS = np.array([[0.0, 0.0, 0.0], [4.0, 0.0, 0.0], [0.0, 4.0, 0.0]])


def _rows(rng, counts, shift=0.0):
    X = np.concatenate([rng.normal(MEANS[c] + shift, 1.0, size=(n, 3)) for c, n in enumerate(counts)])
    y = np.repeat(np.arange(len(counts)), counts)
    return X, y


def _posteriors(X, priors):
    lik = np.stack([multivariate_normal(MEANS[c], np.eye(3)).pdf(X) for c in range(3)], axis=1)
    P = lik * priors
    return P / P.sum(axis=1, keepdims=True), lik


def test_em_priors_is_the_maximum_likelihood_of_the_priors():
    rng = np.random.default_rng(0)
    X, _ = _rows(rng, [600, 300, 100])
    train = np.array([0.2, 0.3, 0.5])
    P, lik = _posteriors(X, train)
    pi, it, ok = em_priors(P, train, tol=1e-12)

    def nll(z):  # softmax parametrisation of the simplex
        p = np.exp(z - z.max())
        return -np.log(lik @ (p / p.sum())).sum()

    z = minimize(nll, np.zeros(3), method="BFGS", options=dict(gtol=1e-10)).x
    oracle = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert ok and it > 1
    np.testing.assert_allclose(pi, oracle, atol=1e-5)
    np.testing.assert_allclose(pi, [0.6, 0.3, 0.1], atol=0.04)


def test_em_priors_refuses_mismatched_shapes():
    with pytest.raises(FedalignError, match="posteriors must be"):
        em_priors(np.ones((4, 2)) / 2, np.ones(3) / 3)


def _sources(rng):
    return [_rows(rng, [200, 200, 200]), _rows(rng, [150, 250, 200])]


def test_estimate_priors_marks_the_class_the_target_lacks():
    rng = np.random.default_rng(1)
    msgs = [class_statistics(X, y, 3) for X, y in _sources(rng)]
    full = estimate_priors(msgs, _rows(rng, [100, 100, 100])[0], 3)
    lacking = estimate_priors(msgs, _rows(rng, [150, 150, 0])[0], 3)
    assert full.absent == [] and lacking.absent == [2]
    assert lacking.priors[2] < ABSENT_RATIO * lacking.train_priors[2]
    np.testing.assert_allclose(lacking.priors.sum(), 1.0)
    assert lacking.record()["absent"] == [2]


def test_completed_gaussian_is_the_mixtures_gaussian():
    rng = np.random.default_rng(2)
    srcs = _sources(rng)
    msgs = [class_statistics(X, y, 3) for X, y in srcs]
    mT, ST = np.array([1.0, 2.0, 0.5]), np.diag([2.0, 1.0, 0.5])
    est = PriorEstimate(np.array([0.5, 0.5, 0.0]), np.ones(3) / 3, 3, True, [2])
    mu, cov = completed_gaussian(mT, ST, msgs, est)
    # independently: the pooled rows' class moments, then E[xxᵀ] − μμᵀ of the mixture
    X = np.concatenate([s[0] for s in srcs])
    y = np.concatenate([s[1] for s in srcs])
    pi_s = np.bincount(y) / len(y)
    Mc = np.stack([X[y == c].mean(0) for c in range(3)])
    Sw = sum(np.cov(X[y == c].T, bias=True) * (y == c).sum() for c in range(3)) / len(y)
    m2 = Mc[2] + mT - 0.5 * (Mc[0] + Mc[1])
    w2 = pi_s[2]
    mean = (1 - w2) * mT + w2 * m2
    second = (1 - w2) * (ST + np.outer(mT, mT)) + w2 * (Sw + np.outer(m2, m2))
    np.testing.assert_allclose(mu, mean, rtol=1e-12)
    np.testing.assert_allclose(cov, second - np.outer(mean, mean), rtol=1e-10, atol=1e-12)


def test_nothing_absent_leaves_the_target_gaussian_as_it_is():
    rng = np.random.default_rng(3)
    msgs = [class_statistics(X, y, 3) for X, y in _sources(rng)]
    X_t = _rows(rng, [100, 100, 100])[0]
    mT, ST = X_t.mean(0), np.cov(X_t.T)
    mu, cov, rec = target_reference(mT, ST, msgs, X_t, 3)
    assert mu is mT and cov is ST and rec["absent"] == []


def test_the_map_onto_the_completed_reference_puts_the_missing_class_where_it_is():
    """Target = sources moved by δ, class 2 removed: the plain map drags the sources' class 2
    towards the present classes; the completed one sends it near its true place μ_2 + δ."""
    rng = np.random.default_rng(4)
    delta = np.array([1.5, -1.0, 2.0])
    srcs = _sources(rng)
    X_s = np.concatenate([s[0] for s in srcs])
    y_s = np.concatenate([s[1] for s in srcs])
    msgs = [class_statistics(X, y, 3) for X, y in srcs]
    X_t = _rows(rng, [200, 200, 0], shift=delta)[0]
    mT, ST = X_t.mean(0), np.cov(X_t.T)
    mu, cov, rec = target_reference(mT, ST, msgs, X_t, 3)
    assert rec["absent"] == [2]
    ms, Ss = X_s.mean(0), np.cov(X_s.T)
    errs = []
    for m, S in ((mT, ST), (mu, cov)):
        A, b = ot_map(ms, Ss, m, S)
        errs.append(np.linalg.norm((X_s[y_s == 2] @ A.T + b).mean(0) - (MEANS[2] + delta)))
    plain, completed = errs
    assert completed < 0.5 < 1.5 < plain


def test_onto_target_shrinkage_one_maps_each_source_by_one_scale_and_a_shift():
    """Shrinkage s = 1 makes every Gaussian tr(Σ̂)/d · I, so with nothing absent each source's
    map is x ↦ μ_T + (tr Σ̂_T / tr Σ̂_k)^{1/2} (x − μ_k); the default stays Ledoit–Wolf."""
    from fedalign.label_shift import onto_target

    rng = np.random.default_rng(5)
    srcs = _sources(rng)
    X_t = _rows(rng, [100, 100, 100], shift=np.array([1.0, -2.0, 0.5]))[0] * 1.7
    mapped, rec = onto_target(srcs, X_t, 3, shrinkage=1.0)
    assert rec["absent"] == []

    def tr(X):
        return np.trace(np.cov(X.T, bias=True))

    for (X, _), Xm in zip(srcs, mapped):
        expected = X_t.mean(0) + np.sqrt(tr(X_t) / tr(X)) * (X - X.mean(0))
        np.testing.assert_allclose(Xm, expected, rtol=1e-6, atol=1e-6 * np.abs(X_t).max())
    default, _ = onto_target(srcs, X_t, 3)
    lw, _ = onto_target(srcs, X_t, 3, shrinkage="auto")
    assert all(np.array_equal(a, b) for a, b in zip(default, lw))
    assert not np.allclose(default[0], mapped[0])

"""Gaussian OT: closed forms, properties, and POT as an independent oracle."""

import numpy as np
import ot
import pytest

from fedalign.errors import FedalignError
from fedalign.gaussian import (bures_barycenter, bures_squared, gaussian_barycenter,
                               interpolate_map, ot_map, w2_squared)
from fedalign.linalg import is_spd, sqrtm_psd


def _spd(d, rng, cond=100.0):
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (Q * np.geomspace(1, cond, d) * rng.uniform(0.5, 2)) @ Q.T


def _rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_map_pushes_covariance_and_is_spd():
    rng = np.random.default_rng(0)
    S1, S2 = _spd(10, rng), _spd(10, rng)
    A, b = ot_map(np.ones(10), S1, np.zeros(10), S2)
    assert _rel(A @ S1 @ A, S2) < 1e-8
    assert is_spd(A)
    np.testing.assert_allclose(A @ np.ones(10) + b, 0, atol=1e-12)


def test_map_matches_pot():
    rng = np.random.default_rng(1)
    m1, m2 = rng.normal(size=6), rng.normal(size=6)
    S1, S2 = _spd(6, rng), _spd(6, rng)
    A, b = ot_map(m1, S1, m2, S2)
    Ap, bp = ot.gaussian.bures_wasserstein_mapping(m1, m2, S1, S2)
    assert _rel(A, Ap) < 1e-8
    assert np.abs(b - bp).max() < 1e-8 * max(1, np.abs(bp).max())


def test_bures_one_dimensional_closed_form():
    assert bures_squared(np.array([[4.0]]), np.array([[1.0]])) == pytest.approx(1.0)
    assert w2_squared([1.0], [[9.0]], [3.0], [[1.0]]) == pytest.approx(4.0 + 4.0)


def test_bures_matches_pot():
    rng = np.random.default_rng(2)
    S1, S2 = _spd(7, rng), _spd(7, rng)
    ref = float(ot.gaussian.bures_distance(S1, S2)) ** 2
    assert bures_squared(S1, S2) == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.5, 1.0])
def test_geodesic_scales_w2(tau):
    rng = np.random.default_rng(3)
    m1, m2 = rng.normal(size=5), rng.normal(size=5)
    S1, S2 = _spd(5, rng), _spd(5, rng)
    A, b = ot_map(m1, S1, m2, S2)
    At, bt = interpolate_map(A, b, tau)
    m_tau, S_tau = At @ m1 + bt, At @ S1 @ At.T
    w_full = np.sqrt(w2_squared(m1, S1, m2, S2))
    w_tau = np.sqrt(w2_squared(m_tau, S_tau, m2, S2))
    assert w_tau == pytest.approx((1 - tau) * w_full, rel=1e-7, abs=1e-7)


def test_tau_out_of_range():
    with pytest.raises(FedalignError):
        interpolate_map(np.eye(2), np.zeros(2), 1.5)


def test_barycenter_commuting_closed_form():
    rng = np.random.default_rng(4)
    diags = [rng.uniform(0.1, 5, size=6) for _ in range(4)]
    w = rng.dirichlet(np.ones(4))
    B = bures_barycenter([np.diag(v) for v in diags], w)
    expected = np.diag(sum(wk * np.sqrt(v) for wk, v in zip(w, diags)) ** 2)
    assert _rel(B.covariance, expected) < 1e-10
    assert B.converged and B.record()["converged"]


def test_barycenter_fixed_point_and_pot():
    rng = np.random.default_rng(5)
    covs = [_spd(8, rng) for _ in range(5)]
    w = rng.dirichlet(np.ones(5))
    B = bures_barycenter(covs, w, tol=1e-12)
    S = B.covariance
    assert B.residual < 1e-10
    # maps barycenter -> clients average to the identity
    Minv = sum(wk * np.linalg.inv(ot_map(np.zeros(8), C, np.zeros(8), S)[0]) for wk, C in zip(w, covs))
    np.testing.assert_allclose(Minv, np.eye(8), atol=1e-8)
    _, Sp = ot.gaussian.bures_wasserstein_barycenter(np.zeros((5, 8)), np.array(covs), w,
                                                     num_iter=5000, eps=1e-14)
    assert _rel(S, Sp) < 1e-7


def test_barycenter_single_client_is_itself():
    rng = np.random.default_rng(6)
    C = _spd(4, rng)
    bc = gaussian_barycenter([np.arange(4.0)], [C])
    np.testing.assert_allclose(bc.covariance, C, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(bc.mean, np.arange(4.0))


def test_barycenter_of_identical_inputs():
    rng = np.random.default_rng(7)
    C = _spd(5, rng)
    S = bures_barycenter([C, C, C]).covariance
    assert _rel(S, C) < 1e-10


def test_near_singular_inputs_give_finite_spd():
    rng = np.random.default_rng(8)
    d = 12
    covs = []
    for _ in range(3):
        Z = rng.normal(size=(5, d))  # n < d: rank-deficient
        covs.append(np.cov(Z.T, bias=True))
    covs.append(np.zeros((d, d)))  # constant features
    S = bures_barycenter(covs).covariance
    assert np.all(np.isfinite(S)) and is_spd(S)
    A, b = ot_map(np.zeros(d), covs[0], np.zeros(d), S)
    assert np.all(np.isfinite(A)) and is_spd(A)


def test_dimension_mismatch():
    with pytest.raises(FedalignError, match="dimension"):
        bures_barycenter([np.eye(2), np.eye(3)])
    with pytest.raises(FedalignError, match="dimension"):
        ot_map(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))


def test_sqrt_used_is_principal():
    rng = np.random.default_rng(9)
    C = _spd(6, rng)
    R = sqrtm_psd(C)
    assert is_spd(R)


def test_low_rank_plus_scalar_reduction_is_exact():
    """Shrunk covariances of clients with n_k ≪ d: reduced solve equals the full solve."""
    rng = np.random.default_rng(10)
    d, covs = 80, []
    for k in range(3):
        Z = rng.normal(size=(6, d)) * rng.uniform(0.5, 2, d)
        C = np.cov(Z.T, bias=True)
        s = 0.3 + 0.1 * k
        covs.append((1 - s) * C + s * np.trace(C) / d * np.eye(d))
    w = np.array([0.2, 0.3, 0.5])
    red = bures_barycenter(covs, w, tol=1e-12)
    full = bures_barycenter(covs, w, tol=1e-12, reduce=False)
    assert red.reduced_dim is not None and red.reduced_dim <= 18 and full.reduced_dim is None
    assert _rel(red.covariance, full.covariance) < 1e-9
    # scalar-only inputs: closed form
    B = bures_barycenter([2.0 * np.eye(d), 8.0 * np.eye(d)])
    np.testing.assert_allclose(B.covariance, ((np.sqrt(2) + np.sqrt(8)) / 2) ** 2 * np.eye(d),
                               rtol=1e-10)
    assert B.reduced_dim == 0 and B.iterations == 0

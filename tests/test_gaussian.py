"""Gaussian OT: closed forms, properties, and POT as an independent oracle."""

import numpy as np
import ot
import pytest

from fedalign.errors import FedalignError
from fedalign.gaussian import (bures_barycenter, bures_squared, gaussian_barycenter,
                               interpolate_map, ot_map, w2_squared)
from fedalign.linalg import is_spd, sqrtm_psd
from gaussian_data import numpy_kernels, rel as _rel, spd as _spd


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


def _with_constant_features(covs, d, const, Q):
    """Embed (r, r) covariances as the varying block of (d, d) ones, zero at rows/columns
    ``const``, then rotate all by the orthogonal ``Q``."""
    keep = [j for j in range(d) if j not in const]
    out = []
    for C in covs:
        F = np.zeros((d, d))
        F[np.ix_(keep, keep)] = C
        out.append(Q @ F @ Q.T)
    return out, keep


@pytest.mark.parametrize("rotate", [False, True])
def test_features_constant_on_every_client_stay_at_the_ridge(rotate):
    """A feature no client varies in: the barycenter is the ridge there (its exact barycenter)
    and, on the rest, the barycenter of the varying block (POT as the oracle). The fixed
    point alone made it ~1e-6·scale there (its roots' eigenvalue floor): 10⁶ × the ridge.
    The same holds for a fixed combination of features (``rotate``: a random rotation)."""
    rng = np.random.default_rng(11)
    d, const = 7, (0, 4)
    block = [_spd(d - len(const), rng, cond=20) for _ in range(3)]
    w = np.array([0.5, 0.3, 0.2])
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0] if rotate else np.eye(d)
    covs, keep = _with_constant_features(block, d, const, Q)
    res = bures_barycenter(covs, w, tol=1e-12)
    ridge = 1e-12 * max(np.trace(C) for C in covs) / d
    S = Q.T @ res.covariance @ Q                  # back to the coordinates of the blocks
    _, Sp = ot.gaussian.bures_wasserstein_barycenter(np.zeros((3, d - 2)), np.array(block), w,
                                                     num_iter=5000, eps=1e-14)
    assert res.converged and res.reduced_dim == d - len(const)
    assert _rel(S[np.ix_(keep, keep)], Sp) < 1e-9
    # the ridge there: to its last digits in place, to the rounding of ‖S‖ (1e-16 · 10) when
    # rotated back (the old result was off by ~1e-5, 10⁶ × the ridge)
    err = np.abs(S[np.ix_(const, const)] - ridge * np.eye(2)).max()
    assert err < (1e-14 * np.abs(Sp).max() if rotate else 1e-9 * ridge), err
    assert np.abs(S[np.ix_(keep, const)]).max() < 1e-9 * np.abs(Sp).max()
    assert is_spd(res.covariance)


def test_no_client_varies_at_all_and_a_common_range_is_only_sought_below_the_ridge():
    """All features constant: the ridge itself, no iteration. SPD inputs (every shrunk
    covariance) are not split: one Cholesky factorisation shows it."""
    from fedalign.gaussian import _common_range

    d = 5
    res = bures_barycenter([np.zeros((d, d)), np.zeros((d, d))])
    assert res.iterations == 0 and res.converged and res.reduced_dim == 0
    np.testing.assert_array_equal(res.covariance, 1e-12 * np.finfo(float).tiny * np.eye(d))
    rng = np.random.default_rng(3)
    covs = [_spd(d, rng, cond=1e6) for _ in range(3)]
    assert _common_range(covs, np.ones(3) / 3, 1e-12 * np.trace(covs[0]) / d) is None
    res = bures_barycenter(covs)
    assert res.reduced_dim is None and res.converged
    # a direction varying by less than the ridge counts as constant, one above it does not
    C = np.diag([1.0, 1.0, 1.0, 1.0, 0.5e-12])
    assert _common_range([C, C], np.ones(2) / 2, 1e-12).shape == (d, d - 1)
    C[-1, -1] = 2e-12
    assert _common_range([C, C], np.ones(2) / 2, 1e-12) is None


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


# --------------------------------------------------------------------------------------------
# The convergence record, the iteration's edges and the exact reduction (mutation survivors)
# --------------------------------------------------------------------------------------------


def _lowrank_plus_scalar(d, ranks, rng, shared=False):
    """Σ_k = (k + 1) I + U_k D_k U_kᵀ with U_k orthonormal of rank ranks[k]: disjoint blocks of
    one orthonormal basis (or the same first columns with ``shared``)."""
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    covs, start = [], 0
    for k, r in enumerate(ranks):
        U = Q[:, :r] if shared else Q[:, start:start + r]
        start += r
        covs.append((k + 1.0) * np.eye(d) + (U * rng.uniform(1, 4, r)) @ U.T)
    return covs


def test_commuting_covariances_converge_in_one_step_and_record_it():
    """Diagonal Σ_k from S₀ = Σ w_k Σ_k: the first step lands on (Σ w_k Σ_k^{1/2})², so the
    second residual is zero: 2 iterations, and the first record is the closed form
    residual ‖Σ w_k Σ_k^{1/2} S₀^{-1/2} − I‖_F/√d, rel_change ‖(Σ w_k Σ_k^{1/2})² − S₀‖_F/‖S₀‖_F."""
    import json

    rng = np.random.default_rng(4)
    d = 6
    diags = [rng.uniform(0.1, 5, size=d) for _ in range(4)]
    w = rng.dirichlet(np.ones(4))
    calls = []
    B = bures_barycenter([np.diag(v) for v in diags], w, progress=lambda *a: calls.append(a))
    S0 = sum(wk * v for wk, v in zip(w, diags))
    T = sum(wk * np.sqrt(v) for wk, v in zip(w, diags))
    assert B.iterations == 2 and B.converged and len(B.history) == 2
    rel0, res0 = B.history[0]
    assert res0 == pytest.approx(np.linalg.norm(T / np.sqrt(S0) - 1) / np.sqrt(d), rel=1e-9)
    assert rel0 == pytest.approx(np.linalg.norm(T**2 - S0) / np.linalg.norm(S0), rel=1e-9)
    assert B.history[-1] == (B.rel_change, B.residual) and B.residual < 1e-12
    assert B.rel_change < 1e-12
    assert calls == [(i + 1, *h) for i, h in enumerate(B.history)]     # progress after each
    rec = json.loads(json.dumps(B.record()))
    assert rec == dict(iterations=2, rel_change=B.rel_change, residual=B.residual, converged=True)
    g = gaussian_barycenter([np.zeros(d)] * 4, [np.diag(v) for v in diags], w)
    assert g.record() == B.record() and g.history == B.history


def test_identical_covariances_stop_at_the_first_residual():
    rng = np.random.default_rng(7)
    C = _spd(5, rng)
    B = bures_barycenter([C, C, C], [0.2, 0.5, 0.3])
    assert B.iterations == 1 and B.converged and B.residual < 1e-12
    np.testing.assert_allclose(B.covariance, C, rtol=1e-10, atol=1e-12)


def test_iteration_cap_returns_the_iterate_it_measured_not_converged():
    """max_iter = 1: the weighted mean Σ w_k Σ_k is returned (the iterate whose residual was
    measured), not converged, with the residual of :func:`fixed_point_residual` there."""
    from fedalign.gaussian import fixed_point_residual

    rng = np.random.default_rng(11)
    covs, w = [_spd(5, rng) for _ in range(3)], np.array([0.2, 0.3, 0.5])
    S0 = sum(wk * C for wk, C in zip(w, covs))
    B = bures_barycenter(covs, w, max_iter=1)
    assert B.iterations == 1 and not B.converged and not B.record()["converged"]
    assert B.residual > 1e-3
    np.testing.assert_allclose(B.covariance, S0, rtol=1e-10)
    assert B.residual == pytest.approx(fixed_point_residual(S0, covs, w), rel=1e-8)
    assert fixed_point_residual(bures_barycenter(covs, w, tol=1e-12).covariance, covs, w) < 1e-10


def test_a_start_at_the_barycenter_is_returned_after_one_residual():
    """``init`` = the barycenter: one residual evaluation, the start itself returned; and a
    given start solves the full problem (no scalar-complement reduction)."""
    rng = np.random.default_rng(12)
    covs = _lowrank_plus_scalar(64, (6, 6), rng)
    w = np.array([0.4, 0.6])
    full = bures_barycenter(covs, w, tol=1e-12)
    assert full.reduced_dim == 12
    B = bures_barycenter(covs, w, tol=1e-8, init=full.covariance)
    assert B.iterations == 1 and B.converged and B.reduced_dim is None
    np.testing.assert_array_equal(B.covariance, full.covariance)


def test_anderson_mixing_reaches_the_same_barycenter_in_fewer_iterations():
    rng = np.random.default_rng(5)
    covs = [_spd(8, rng) for _ in range(5)]
    w = rng.dirichlet(np.ones(5))
    plain = bures_barycenter(covs, w, tol=1e-12, anderson=0)
    mixed = bures_barycenter(covs, w, tol=1e-12, anderson=5)
    assert plain.converged and mixed.converged
    assert mixed.iterations <= 0.75 * plain.iterations, (mixed.iterations, plain.iterations)
    assert _rel(mixed.covariance, plain.covariance) < 1e-10
    one = bures_barycenter(covs, w, tol=1e-12, workers=1)      # the clients' thread split
    three = bures_barycenter(covs, w, tol=1e-12, workers=3)
    assert _rel(one.covariance, three.covariance) < 1e-12 and one.iterations == three.iterations


def test_weights_are_normalised_and_bad_weights_refused():
    rng = np.random.default_rng(13)
    covs = [_spd(4, rng) for _ in range(2)]
    means = [np.zeros(4), np.ones(4)]
    a = gaussian_barycenter(means, covs, [2.0, 6.0])
    b = gaussian_barycenter(means, covs, [0.25, 0.75])
    np.testing.assert_array_equal(a.weights, [0.25, 0.75])
    np.testing.assert_allclose(a.mean, 0.75, rtol=1e-15)
    np.testing.assert_allclose(a.covariance, b.covariance, rtol=1e-13)
    np.testing.assert_array_equal(gaussian_barycenter(means, covs).weights, [0.5, 0.5])
    for bad in ([1.0], [1.0, -0.5], [np.nan, 1.0], [0.0, 0.0], [1.0, np.inf]):
        with pytest.raises(FedalignError, match="weights must be 2 nonnegative numbers"):
            bures_barycenter(covs, bad)


def test_one_client_and_no_client():
    rng = np.random.default_rng(6)
    C = _spd(4, rng)
    bc = gaussian_barycenter([np.arange(4.0)], [C], weights=[3.0])
    np.testing.assert_array_equal(bc.weights, [1.0])
    assert bc.record() == dict(iterations=0, rel_change=0.0, residual=0.0, converged=True)
    with pytest.raises(FedalignError, match="at least one covariance"):
        bures_barycenter([])
    with pytest.raises(FedalignError, match="means of size 2 and 3"):
        gaussian_barycenter([np.zeros(2), np.zeros(3)], [np.eye(2), np.eye(2)])


def test_scalar_clients_closed_form_uses_the_weights():
    d = 64
    B = bures_barycenter([2.0 * np.eye(d), 8.0 * np.eye(d)], [0.25, 0.75])
    np.testing.assert_allclose(B.covariance, (0.25 * np.sqrt(2) + 0.75 * np.sqrt(8)) ** 2
                               * np.eye(d), rtol=1e-10)
    assert B.reduced_dim == 0
    assert B.record() == dict(iterations=0, rel_change=0.0, residual=0.0, converged=True)


@pytest.mark.parametrize("d, ranks, shared, reduced", [
    (64, (16, 16), False, 32),     # the non-scalar span is exactly half the dimension
    (64, (16, 17), False, None),   # one more: solved in full
    (64, (32, 0), False, 32),      # one client alone non-scalar on half the dimension
    (64, (33, 0), False, None),
    (64, (8, 8), True, 8),         # a shared subspace counts once
    (63, (8, 8), False, None),     # below 64 dimensions there is no reduction
])
def test_reduction_to_the_common_non_scalar_subspace_and_its_bounds(d, ranks, shared, reduced):
    rng = np.random.default_rng(14)
    covs = _lowrank_plus_scalar(d, ranks, rng, shared)
    B = bures_barycenter(covs, [0.3, 0.7], tol=1e-12)
    assert B.reduced_dim == reduced
    full = bures_barycenter(covs, [0.3, 0.7], tol=1e-12, reduce=False)
    assert full.reduced_dim is None and _rel(B.covariance, full.covariance) < 1e-10


def test_bures_closed_forms_below_one_and_at_zero():
    """Commuting matrices: B² = Σ (√a_i − √b_i)² (here < 1); a matrix with itself: 0."""
    a, b = np.array([1.0, 0.25, 2.0]), np.array([0.81, 0.36, 2.25])
    assert bures_squared(np.diag(a), np.diag(b)) == pytest.approx(
        np.sum((np.sqrt(a) - np.sqrt(b)) ** 2), rel=1e-10)
    C = _spd(5, np.random.default_rng(15))
    assert bures_squared(C, C) == pytest.approx(0.0, abs=1e-9)
    assert w2_squared(np.ones(5), C, np.ones(5), C) == pytest.approx(0.0, abs=1e-9)


def test_tau_below_zero_and_mismatched_map_shapes_are_named():
    with pytest.raises(FedalignError, match=r"tau must be in \[0, 1\], got -0.1"):
        interpolate_map(np.eye(2), np.zeros(2), -0.1)
    with pytest.raises(FedalignError, match=r"source covariance \(2, 2\), reference \(3, 3\)"):
        ot_map(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))
    with pytest.raises(FedalignError, match=r"covariances \(2, 2\) and \(3, 3\)"):
        bures_barycenter([np.eye(2), np.eye(3)])


def test_singular_iterate_gets_the_smallest_ridge_that_factors_it():
    """A ridge s·10^j·1e-14 (s = tr S / d), j = 0, 1, … until Cholesky succeeds: for
    eigenvalues 1 and −3e-10 (s ≈ 0.5) the first that works is s·1e-9; a negative definite S
    is an error."""
    from fedalign._bures_fixed_point import _safe_cholesky

    with numpy_kernels() as kern:
        S = np.diag([1.0, -3e-10])
        L = _safe_cholesky(S, kern)
        np.testing.assert_allclose(L @ L.T - S, np.trace(S) / 2 * 1e-9 * np.eye(2), rtol=1e-6,
                                   atol=1e-20)
        S = np.ones((2, 2))                                  # singular PSD: the first ridge, 1e-14
        L = _safe_cholesky(S, kern)
        np.testing.assert_allclose(np.diag(L @ L.T - S), 1e-14, rtol=0.05)
        L = _safe_cholesky(np.eye(2) * 3.0, kern)            # SPD: no ridge at all
        np.testing.assert_array_equal(L, np.sqrt(3.0) * np.eye(2))
        with pytest.raises(FedalignError, match="lost positive definiteness"):
            _safe_cholesky(-np.eye(2), kern)


def _small_clients(K, d, n, seed=0):
    """K shrunk covariances of n < d rows each (the form of many small clients), with c."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(K):
        X = (rng.normal(size=(n, d)) * rng.uniform(0.2, 3.0, size=d)) @ np.diag(
            rng.uniform(0.5, 2.0, size=d))
        X -= X.mean(0)
        S = X.T @ X / n
        s = rng.uniform(0.1, 0.6)
        C = (1 - s) * S
        C[np.diag_indices(d)] += s * np.trace(S) / d
        out.append((C, s * np.trace(C) / d))
    return out


@pytest.mark.parametrize("K,d,n", [(12, 70, 8), (2, 80, 12)])  # full span; reduced (span ≤ d/2)
def test_factored_covariances_give_the_dense_barycenter(K, d, n):
    """c I + W Wᵀ storage is exact: the dense fixed point is the oracle (≤ 1e-8 relative),
    with the same convergence record; the second case takes the scalar-complement split."""
    from fedalign.linalg import factor_scaled_identity

    cl = _small_clients(K, d, n)
    w = np.random.default_rng(1).uniform(1, 2, size=K)
    dense = bures_barycenter([C for C, _ in cl], w)
    fact = bures_barycenter([factor_scaled_identity(C, c, d // 2) for C, c in cl], w)
    rel = np.linalg.norm(fact.covariance - dense.covariance) / np.linalg.norm(dense.covariance)
    assert rel <= 1e-8 and fact.converged and fact.iterations == dense.iterations
    assert fact.reduced_dim == dense.reduced_dim
    assert (fact.reduced_dim is not None) == (K == 2)


def test_identical_clients_merge_into_one_with_their_summed_weight():
    rng = np.random.default_rng(5)
    covs = [_spd(6, rng) for _ in range(3)]
    w = np.array([0.1, 0.2, 0.3, 0.4])
    merged = bures_barycenter(covs + [covs[1].copy()], w, merge_identical=True)
    oracle = bures_barycenter(covs, [0.1, 0.6, 0.3])
    np.testing.assert_allclose(merged.covariance, oracle.covariance, rtol=1e-12)
    plain = bures_barycenter(covs + [covs[1].copy()], w)
    np.testing.assert_allclose(plain.covariance, oracle.covariance, rtol=1e-8)


def test_factored_covariances_on_the_torch_backend():
    pytest.importorskip("torch")
    from fedalign._bures_fixed_point import _BatchedRootSum
    from fedalign.linalg import factor_scaled_identity

    cl = _small_clients(5, 70, 6, seed=2)
    fact = [factor_scaled_identity(C, c, 35) for C, c in cl]
    mixed = fact[:3] + [C for C, _ in cl[3:]]
    ref = bures_barycenter([C for C, _ in cl])
    old = _BatchedRootSum.BATCH
    _BatchedRootSum.BATCH = 2  # several batches
    try:
        got = bures_barycenter(mixed, backend="torch")
    finally:
        _BatchedRootSum.BATCH = old
    assert np.linalg.norm(got.covariance - ref.covariance) <= 1e-8 * np.linalg.norm(ref.covariance)


def test_ot_maps_equal_one_ot_map_per_source_bit_for_bit():
    from fedalign.gaussian import ot_maps

    rng = np.random.default_rng(11)
    d = 6
    spd = [(lambda G: G @ G.T + 0.1 * np.eye(d))(rng.normal(size=(d, d))) for _ in range(4)]
    srcs = [(rng.normal(size=d), S) for S in spd[:3]]
    many = ot_maps(srcs, np.ones(d), spd[3])
    for (m, S), (A, b) in zip(srcs, many):
        A1, b1 = ot_map(m, S, np.ones(d), spd[3])
        np.testing.assert_array_equal(A, A1)
        np.testing.assert_array_equal(b, b1)

import numpy as np

from fedalign.linalg import inv_sqrtm_psd, is_spd, sqrt_and_inv_sqrt, sqrtm_psd


def _spd(d, seed=0, cond=1e3):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (Q * np.geomspace(1, cond, d)) @ Q.T


def test_sqrt_squares_back():
    S = _spd(12)
    R = sqrtm_psd(S)
    np.testing.assert_allclose(R @ R, S, rtol=1e-10, atol=1e-10 * np.abs(S).max())
    assert is_spd(R)


def test_inverse_sqrt():
    S = _spd(9, 1)
    R, Ri = sqrt_and_inv_sqrt(S)
    np.testing.assert_allclose(R @ Ri, np.eye(9), atol=1e-9)
    np.testing.assert_allclose(inv_sqrtm_psd(S), Ri, rtol=1e-12)


def test_singular_is_clipped_finite():
    v = np.arange(5.0)
    S = np.outer(v, v)  # rank one
    Ri = inv_sqrtm_psd(S)
    assert np.all(np.isfinite(Ri)) and is_spd(Ri)


def test_diagonal_closed_form():
    D = np.diag([4.0, 9.0, 0.25])
    np.testing.assert_allclose(sqrtm_psd(D), np.diag([2.0, 3.0, 0.5]), atol=1e-14)


def test_project_psd_clips_eigenvalues_in_an_arbitrary_basis():
    from fedalign.linalg import project_psd

    Q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(4, 4)))
    S = (Q * np.array([-2.0, 0.5, 3.0, 9.0])) @ Q.T
    np.testing.assert_allclose(project_psd(S), (Q * [0.0, 0.5, 3.0, 9.0]) @ Q.T, atol=1e-12)
    P = project_psd(S + np.triu(np.ones((4, 4)), 1))         # the symmetric part is projected
    np.testing.assert_array_equal(P, P.T)


def _shrunk_low_rank(d, n, s, seed=0):
    """A Ledoit–Wolf-form covariance (1 − s) Σ̂ + s (tr Σ̂/d) I of n < d rows, and its c."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.2, 3.0, size=d)
    X -= X.mean(0)
    S = X.T @ X / n
    C = (1 - s) * S
    C[np.diag_indices(d)] += s * np.trace(S) / d
    return C, s * np.trace(C) / d


def test_scaled_identity_factor_is_exact_with_rank_n_minus_one():
    from fedalign.linalg import factor_scaled_identity

    C, c = _shrunk_low_rank(60, 12, 0.3)
    F = factor_scaled_identity(C, c, 30)
    assert F.rank == 11 and F.c == c          # rank Σ̂ = n − 1 (centred rows)
    np.testing.assert_allclose(F.dense(), C, rtol=0, atol=1e-13 * np.abs(C).max())
    assert abs(F.trace() - np.trace(C)) < 1e-12 * np.trace(C)
    assert F.nbytes < C.nbytes / 4
    U = np.linalg.qr(np.random.default_rng(1).normal(size=(60, 7)))[0]
    np.testing.assert_allclose(F.project(U).dense(), U.T @ C @ U, atol=1e-12 * np.abs(C).max())


def test_scaled_identity_factor_refuses_what_it_cannot_hold_exactly():
    from fedalign.linalg import factor_scaled_identity

    C, c = _shrunk_low_rank(60, 12, 0.3)
    assert factor_scaled_identity(C, 1.01 * c, 30) is None   # wrong scalar part
    assert factor_scaled_identity(C, 0.99 * c, 30) is None   # (C − c I full rank)
    assert factor_scaled_identity(C, c, 10) is None          # rank 11 > max_rank
    full, c_full = _shrunk_low_rank(20, 40, 0.2)             # n > d: full rank
    assert factor_scaled_identity(full, c_full, 10) is None


def test_scaled_identity_factor_holds_only_its_own_bytes():
    """The factor is not a view of the (d, max_rank) work array: K clients must hold K·d·r."""
    from fedalign.linalg import factor_scaled_identity

    C, c = _shrunk_low_rank(60, 12, 0.3)
    F = factor_scaled_identity(C, c, 30)
    assert F.W.base is None or F.W.base.nbytes == F.W.nbytes

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

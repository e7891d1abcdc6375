"""Gaussian OT behaviours found untested by the mutation runs of ``fedalign/gaussian.py`` and
``fedalign/_bures_fixed_point.py`` (issue 19, docs/mutation.md): closed forms on rank-deficient
and zero-weight inputs, float64 results for float32 inputs, the iteration's budget and
tolerance edges, the scalar-complement thresholds, exact error lines, bad backend strings, and
the torch path (where it computes, its out-of-memory line)."""

import math

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.gaussian import (bures_barycenter, bures_squared, gaussian_barycenter,
                               interpolate_map, normalize_weights, ot_map)
from gaussian_data import numpy_kernels, rel as _rel, spd as _spd


# -- closed forms and dtypes -----------------------------------------------------------------
def test_bures_to_a_rank_deficient_matrix_is_the_commuting_closed_form():
    """B²(I, diag(1, 0)) = (1 − 1)² + (1 − 0)² = 1: the zero eigenvalue of S1^{1/2} S2 S1^{1/2}
    stays zero (no relative floor); B²(diag(4, 0, 1), diag(1, 0, 0)) = 1 + 0 + 1."""
    assert bures_squared(np.eye(2), np.diag([1.0, 0.0])) == pytest.approx(1.0, rel=1e-12)
    assert bures_squared(np.diag([4.0, 0.0, 1.0]), np.diag([1.0, 0.0, 0.0])) == pytest.approx(
        2.0, rel=1e-12)


def test_interpolated_map_of_a_float32_map_is_float64():
    rng = np.random.default_rng(20)
    A, b = _spd(4, rng).astype(np.float32), rng.normal(size=4).astype(np.float32)
    At, bt = interpolate_map(A, b, 0.3)
    assert At.dtype == np.float64 and bt.dtype == np.float64
    np.testing.assert_array_equal(At, 0.3 * A.astype(np.float64) + 0.7 * np.eye(4))
    np.testing.assert_array_equal(bt, 0.3 * b.astype(np.float64))


def test_float32_weights_and_a_float32_single_client_give_float64_results():
    w = normalize_weights(np.array([1.0, 2.0], dtype=np.float32), 2)
    assert w.dtype == np.float64
    np.testing.assert_array_equal(w, np.array([1.0, 2.0]) / 3.0)
    C = _spd(3, np.random.default_rng(21)).astype(np.float32)
    B = bures_barycenter([C])
    assert B.covariance.dtype == np.float64
    np.testing.assert_array_equal(B.covariance, 0.5 * (C.astype(np.float64) + C.T))


def test_a_zero_weight_client_is_accepted_and_ignored():
    rng = np.random.default_rng(22)
    covs, means = [_spd(4, rng), _spd(4, rng)], [np.zeros(4), np.arange(4.0)]
    bc = gaussian_barycenter(means, covs, [0.0, 1.0])
    np.testing.assert_array_equal(bc.weights, [0.0, 1.0])
    np.testing.assert_array_equal(bc.mean, means[1])
    assert bc.converged and _rel(bc.covariance, covs[1]) < 1e-10


@pytest.mark.filterwarnings("error")
def test_barycenter_is_that_of_the_inputs_with_the_relative_ridge():
    """Commuting inputs: B = (Σ_k w_k (Σ_k + ε I)^{1/2})² with ε = 1e-12 · max_k tr Σ_k / d, the
    ridge that keeps singular inputs positive (visible at 1e-8 on a coordinate of variance
    1e-2 next to one of 300); and no (deprecation) warning on the way."""
    a = [np.array([100.0, 1e-2]), np.array([300.0, 3e-2])]
    eps = 1e-12 * max(v.sum() for v in a) / 2
    B = bures_barycenter([np.diag(v) for v in a], [0.4, 0.6])
    expected = (0.4 * np.sqrt(a[0] + eps) + 0.6 * np.sqrt(a[1] + eps)) ** 2
    np.testing.assert_allclose(np.diag(B.covariance), expected, rtol=1e-10)
    assert B.covariance[0, 1] == 0.0 and B.converged


# -- errors ----------------------------------------------------------------------------------
def test_bad_inputs_are_refused_with_their_exact_messages():
    with pytest.raises(FedalignError, match=r"^barycenter needs at least one covariance$"):
        bures_barycenter([])
    with pytest.raises(FedalignError, match=r"^dimension mismatch: covariances \(3,\) and"):
        bures_barycenter([np.ones(3), np.ones(3)])      # vectors, not matrices: no IndexError
    from fedalign._bures_fixed_point import _safe_cholesky

    with numpy_kernels() as kern:
        with pytest.raises(FedalignError, match=r"^barycenter iterate lost positive "
                                                r"definiteness \(inputs too singular\)$"):
            _safe_cholesky(-np.eye(2), kern)


def test_the_largest_cholesky_ridge_is_a_ten_thousandth_of_the_mean_eigenvalue():
    """Ridges s·1e-14, …, s·1e-4 (s = tr S / d) and no more: an eigenvalue of −4e-5 (s ≈ 0.5)
    factors with the last one, −3e-4 is an error."""
    from fedalign._bures_fixed_point import _safe_cholesky

    with numpy_kernels() as kern:
        S = np.diag([1.0, -4e-5])
        L = _safe_cholesky(S, kern)
        np.testing.assert_allclose(L @ L.T - S, np.trace(S) / 2 * 1e-4 * np.eye(2), rtol=1e-9,
                                   atol=1e-20)
        with pytest.raises(FedalignError, match="lost positive definiteness"):
            _safe_cholesky(np.diag([1.0, -3e-4]), kern)


@pytest.mark.parametrize("kw", [dict(backend="jax"), dict(device="tpu")])
def test_every_public_function_refuses_a_bad_backend_or_device(kw):
    rng = np.random.default_rng(23)
    covs = [_spd(3, rng), _spd(3, rng)]
    what = "backend" if "backend" in kw else "device"
    with pytest.raises(FedalignError, match=f"^{what} must be"):
        ot_map(np.zeros(3), covs[0], np.zeros(3), covs[1], **kw)
    with pytest.raises(FedalignError, match=f"^{what} must be"):
        bures_barycenter(covs, **kw)
    with pytest.raises(FedalignError, match=f"^{what} must be"):
        gaussian_barycenter([np.zeros(3)] * 2, covs, **kw)


# -- the iteration's budget and tolerance ----------------------------------------------------
def _three(seed=24, d=3):
    rng = np.random.default_rng(seed)
    return [_spd(d, rng) for _ in range(3)], np.array([0.2, 0.3, 0.5])


def test_the_default_budget_is_100_residual_evaluations():
    """A tolerance no residual meets: the default ``max_iter`` (100) stops the loop."""
    covs, w = _three()
    B = bures_barycenter(covs, w, tol=-1.0)
    assert B.iterations == 100 and len(B.history) == 100 and not B.converged


def test_gaussian_barycenter_passes_its_budget_tolerance_and_progress_on():
    covs, w = _three()
    means = [np.zeros(3)] * 3
    assert gaussian_barycenter(means, covs, w, tol=-1.0).iterations == 100
    g = gaussian_barycenter(means, covs, w, tol=-1.0, max_iter=3)
    assert g.iterations == 3 and not g.converged
    loose, tight = bures_barycenter(covs, w, tol=1e-2), bures_barycenter(covs, w)
    assert loose.iterations < tight.iterations
    calls = []
    g = gaussian_barycenter(means, covs, w, tol=1e-2, progress=lambda *a: calls.append(a))
    assert g.record() == loose.record() and g.history == loose.history
    assert calls == [(i + 1, *h) for i, h in enumerate(g.history)]


def test_a_zero_budget_returns_the_start_unconverged_with_no_residual():
    covs, w = _three()
    B = bures_barycenter(covs, w, max_iter=0)
    assert B.iterations == 0 and not B.converged and B.history == []
    assert math.isinf(B.residual) and math.isinf(B.rel_change)
    np.testing.assert_allclose(B.covariance, sum(wk * C for wk, C in zip(w, covs)), rtol=1e-10)


def test_a_residual_equal_to_the_tolerance_counts_as_converged():
    covs, w = _three()
    first = bures_barycenter(covs, w, max_iter=1, workers=1).residual
    B = bures_barycenter(covs, w, tol=first, workers=1)
    assert B.iterations == 1 and B.converged and B.residual == first


# -- the scalar-complement reduction's thresholds --------------------------------------------
def _spiked(d, offset):
    """Two diagonal clients k = 1, 2: eigenvalue k once, k·(1 + offset) d − 5 times, and the
    spikes 1000 k, 10 k, 10 k, 10 k (so λ_max = 1000 k ≫ the second largest)."""
    out = []
    for k in (1.0, 2.0):
        lam = np.full(d, k * (1 + offset))
        lam[0], lam[-4:] = k, [10 * k, 10 * k, 10 * k, 1000 * k]
        out.append(np.diag(lam))
    return out


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("factor, reduced", [(0.5, 4), (2.0, None)])
def test_eigenvalues_within_rtol_of_the_top_above_the_smallest_count_as_scalar(factor, reduced):
    """_scalar_complement's rule: λ ≤ λ_min + rtol·λ_max (rtol = 1e-10) is the scalar part.
    Half the threshold above λ_min: reduced to the 4 spikes; twice: solved in full."""
    covs = _spiked(64, factor * 1e-10 * 1000)
    B = bures_barycenter(covs, [0.3, 0.7], tol=1e-12)
    assert B.reduced_dim == reduced
    full = bures_barycenter(covs, [0.3, 0.7], tol=1e-12, reduce=False)
    assert _rel(B.covariance, full.covariance) < 1e-6


def test_directions_closer_than_the_rank_tolerance_count_once():
    """Two clients non-scalar along e1 and along v at an angle θ = 1.5e-8 from it: the stacked
    bases [e1, v] have singular values ≈ √2 and θ/√2 ≈ 1.06e-8 < 1e-8·√2 (the rank tolerance,
    relative to the largest): one common direction; the barycenter still agrees with the full
    solve."""
    d, theta = 64, 1.5e-8
    v = np.zeros(d)
    v[0], v[1] = np.cos(theta), np.sin(theta)
    covs = [np.eye(d) + 3.0 * np.outer(np.eye(d)[0], np.eye(d)[0]), 2.0 * np.eye(d)
            + 4.0 * np.outer(v, v)]
    B = bures_barycenter(covs, [0.5, 0.5], tol=1e-12)
    assert B.reduced_dim == 1
    full = bures_barycenter(covs, [0.5, 0.5], tol=1e-12, reduce=False)
    assert _rel(B.covariance, full.covariance) < 1e-7


# -- the torch path --------------------------------------------------------------------------
@pytest.fixture
def torch_calls(monkeypatch):
    """Count torch.linalg.eigh / eigvalsh calls (the backend's kernels look them up per call)."""
    torch = pytest.importorskip("torch")
    calls = {"eigh": 0, "eigvalsh": 0}
    for name in calls:
        real = getattr(torch.linalg, name)

        def spy(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(torch.linalg, name, spy)
    return calls


def test_torch_ot_map_does_both_eigendecompositions_with_torch(torch_calls):
    rng = np.random.default_rng(25)
    S1, S2, m = _spd(5, rng), _spd(5, rng), rng.normal(size=5)
    A, b = ot_map(m, S1, -m, S2)
    At, bt = ot_map(m, S1, -m, S2, backend="torch", device="cpu")
    assert torch_calls["eigh"] == 2
    assert isinstance(At, np.ndarray) and _rel(At, A) < 1e-12 and _rel(bt, b) < 1e-12


@pytest.mark.filterwarnings("error")
def test_torch_barycenter_takes_one_batched_eigh_per_iteration(torch_calls):
    rng = np.random.default_rng(26)
    covs, w = [_spd(6, rng) for _ in range(3)], np.array([0.5, 0.3, 0.2])
    a = bures_barycenter(covs, w, reduce=False)
    b = bures_barycenter(covs, w, reduce=False, backend="torch", device="cpu")
    assert b.converged and torch_calls == {"eigh": b.iterations, "eigvalsh": 0}
    assert abs(a.iterations - b.iterations) <= 1 and _rel(b.covariance, a.covariance) < 1e-9


def test_torch_barycenter_reduces_to_the_common_subspace_with_torch(torch_calls):
    rng = np.random.default_rng(27)
    Q, _ = np.linalg.qr(rng.normal(size=(64, 8)))        # two disjoint rank-4 spikes
    covs = [(k + 1.0) * np.eye(64) + (U * rng.uniform(1, 4, 4)) @ U.T
            for k, U in enumerate((Q[:, :4], Q[:, 4:]))]
    a = bures_barycenter(covs, [0.4, 0.6])
    b = bures_barycenter(covs, [0.4, 0.6], backend="torch", device="cpu")
    assert a.reduced_dim == b.reduced_dim == 8
    assert torch_calls["eigvalsh"] == 1 and torch_calls["eigh"] == 2 + b.iterations
    assert _rel(b.covariance, a.covariance) < 1e-9


def test_torch_kernels_floor_eigenvalues_like_numpy_on_a_constant_feature():
    """A feature constant in every client: its barycenter variance is set by the relative
    eigenvalue floor of the roots (EIG_FLOOR · λ_max, as in :func:`eigh_clipped`), so the
    torch kernels must floor exactly as the numpy path does."""
    pytest.importorskip("torch")
    covs = [np.diag([100.0, 0.0]), np.diag([300.0, 0.0])]
    a = bures_barycenter(covs, [0.4, 0.6])
    b = bures_barycenter(covs, [0.4, 0.6], backend="torch", device="cpu")
    assert a.converged and b.converged
    np.testing.assert_allclose(np.diag(b.covariance), np.diag(a.covariance), rtol=1e-8)


def _oom(*a, **k):
    import torch

    raise torch.cuda.OutOfMemoryError("CUDA out of memory")


def test_torch_out_of_memory_is_one_line_naming_the_step_and_its_size(monkeypatch):
    """6 d × d float64 arrays for the OT map (d = 1200: 0.064 GiB), 2 (K + 8) for the
    barycenter (K = 2, d = 1024: 0.156 GiB)."""
    pytest.importorskip("torch")
    import fedalign.gaussian as g

    monkeypatch.setattr(g, "sqrt_and_inv_sqrt", _oom)
    Z = np.zeros((1200, 1200))
    with pytest.raises(FedalignError, match=r"^out of GPU memory in the OT map: it needs about "
                                            r"0\.06 GiB"):
        ot_map(np.zeros(1200), Z, np.zeros(1200), Z, backend="torch", device="cpu")
    monkeypatch.setattr(g, "_scalar_complement", _oom)
    eye = np.eye(1024)  # (all-zero inputs are solved before the guard: the ridge, exactly)
    with pytest.raises(FedalignError, match=r"^out of GPU memory in the barycenter \(K=2, "
                                            r"d=1024\): it needs about 0\.16 GiB"):
        bures_barycenter([eye, eye], backend="torch", device="cpu")


def test_the_default_anderson_memory_is_five():
    # 5 clients, d = 8: the fixed point needs ≥ 8 residual evaluations, after which a memory of
    # 6 mixes differently (other iterates, the same barycenter to ~1e-12)
    rng = np.random.default_rng(4)
    covs = [_spd(8, rng) for _ in range(5)]
    default = bures_barycenter(covs, tol=1e-12)
    five = bures_barycenter(covs, tol=1e-12, anderson=5)
    assert default.iterations >= 8
    assert default.iterations == five.iterations
    np.testing.assert_array_equal(default.covariance, five.covariance)
    six = bures_barycenter(covs, tol=1e-12, anderson=6)
    assert not np.array_equal(six.covariance, default.covariance)
    np.testing.assert_allclose(six.covariance, default.covariance, rtol=1e-9)

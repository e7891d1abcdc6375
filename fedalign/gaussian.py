"""Gaussian optimal transport: Bures–Wasserstein distance, OT maps and barycenters.

All computations are float64 and use symmetric eigendecompositions with eigenvalue clipping
(:mod:`fedalign.linalg`). :func:`ot_map`, :func:`bures_barycenter` and
:func:`gaussian_barycenter` take ``backend`` and ``device`` (:func:`fedalign.backend.get_backend`):
the same algorithm with torch kernels, on a CPU or a GPU, float64 throughout; inputs and
results are numpy arrays either way.

Formulas
--------
Bures distance      B²(Σ₁, Σ₂) = tr Σ₁ + tr Σ₂ − 2 tr (Σ₁^{1/2} Σ₂ Σ₁^{1/2})^{1/2}
Wasserstein-2       W₂²(N(μ₁,Σ₁), N(μ₂,Σ₂)) = ‖μ₁ − μ₂‖² + B²(Σ₁, Σ₂)
OT map k → b        A_k = Σ_b^{1/2} (Σ_b^{1/2} Σ_k Σ_b^{1/2})^{-1/2} Σ_b^{1/2},  b_k = μ_b − A_k μ_k
Geodesic (τ)        T_τ(z) = (1 − τ) z + τ (A_k z + b_k)
Barycenter          Σ_b = argmin_Σ Σ_k w_k B²(Σ, Σ_k), μ_b = Σ_k w_k μ_k

The barycenter covariance is the fixed point of the Álvarez-Esteban et al. iteration

    S ← S^{-1/2} ( Σ_k w_k (S^{1/2} Σ_k S^{1/2})^{1/2} )² S^{-1/2},

which converges far faster than the averaging iteration S ← Σ_k w_k (S^{1/2} Σ_k S^{1/2})^{1/2}.
At the fixed point the maps from the barycenter to the clients average to the identity:
Σ_k w_k A_k^{-1} = S^{-1/2} (Σ_k w_k (S^{1/2} Σ_k S^{1/2})^{1/2}) S^{-1/2} = I; the RMS deviation
‖Σ_k w_k A_k^{-1} − I‖_F / √d is reported as the fixed-point residual.

References
----------
P. C. Álvarez-Esteban, E. del Barrio, J. A. Cuesta-Albertos, C. Matrán, "A fixed-point
approach to barycenters in Wasserstein space", J. Math. Anal. Appl. 441 (2016).
M. Agueh and G. Carlier, "Barycenters in the Wasserstein space", SIAM J. Math. Anal. (2011).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedalign._bures_fixed_point import (_iterate, _project, _scalar_complement,
                                         _weighted_sum)
from fedalign.backend import array_bytes, get_backend
from fedalign.errors import FedalignError
from fedalign.linalg import (ScaledIdentityPlusLowRank, eigh_clipped, sqrt_and_inv_sqrt,
                             sqrtm_psd, sym)


def bures_squared(S1: np.ndarray, S2: np.ndarray) -> float:
    """Squared Bures distance B²(S1, S2) between two PSD (d, d) matrices."""
    R = sqrtm_psd(S1)
    w, _ = eigh_clipped(R @ S2 @ R, floor=0.0)
    val = np.trace(S1) + np.trace(S2) - 2.0 * np.sum(np.sqrt(np.maximum(w, 0.0)))
    return float(max(val, 0.0))


def w2_squared(m1, S1, m2, S2) -> float:
    """Squared 2-Wasserstein distance between N(m1, S1) and N(m2, S2)."""
    dm = np.asarray(m1, float) - np.asarray(m2, float)
    return float(dm @ dm) + bures_squared(S1, S2)


def ot_map(mean_src, cov_src, mean_ref, cov_ref, backend="numpy",
           device="cpu") -> tuple[np.ndarray, np.ndarray]:
    """Closed-form Gaussian OT map from N(mean_src, cov_src) to N(mean_ref, cov_ref).

    ``backend``, ``device``: where the two eigendecompositions run (float64 either way).

    Returns
    -------
    A : (d, d) symmetric positive definite,
        A = Σ_b^{1/2} (Σ_b^{1/2} Σ_k Σ_b^{1/2})^{-1/2} Σ_b^{1/2}
    b : (d,)  b = μ_b − A μ_k
    """
    return ot_maps([(mean_src, cov_src)], mean_ref, cov_ref, backend, device)[0]


def ot_maps(sources, mean_ref, cov_ref, backend="numpy", device="cpu") -> list:
    """:func:`ot_map` of every (mean (d,), covariance (d, d)) in ``sources`` onto one
    reference: Σ_b^{1/2} is computed once, then one eigendecomposition per source (the same
    arithmetic as K calls of :func:`ot_map`, bit for bit). Returns a list of (A, b)."""
    cov_ref = np.asarray(cov_ref, float)
    covs = [np.asarray(c, float) for _, c in sources]
    for c in covs:
        if c.shape != cov_ref.shape:
            raise FedalignError(
                f"dimension mismatch: source covariance {c.shape}, reference {cov_ref.shape}")
    xp = get_backend(backend, device)
    out = []
    with xp.guard("the OT map", array_bytes(*[cov_ref.shape] * 6)):
        Rb, _ = sqrt_and_inv_sqrt(cov_ref, backend=xp)
        for (mean_src, _), cov_src in zip(sources, covs):
            w, V = eigh_clipped(Rb @ xp.asarray(cov_src) @ Rb, backend=xp)
            M = (V / xp.sqrt(w)) @ V.T
            A = xp.to_numpy(sym(Rb @ M @ Rb))
            out.append((A, np.asarray(mean_ref, float) - A @ np.asarray(mean_src, float)))
    return out


def interpolate_map(A: np.ndarray, b: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Affine map of the geodesic at time τ: T_τ(z) = ((1−τ) I + τ A) z + τ b."""
    tau = check_tau(tau)
    At = tau * np.asarray(A, float)
    At[np.diag_indices_from(At)] += 1.0 - tau
    return At, tau * np.asarray(b, float)


def check_tau(tau) -> float:
    """Validate τ ∈ [0, 1]."""
    tau = float(tau)
    if not (0.0 <= tau <= 1.0):
        raise FedalignError(f"tau must be in [0, 1], got {tau}", param="tau")
    return tau


@dataclass
class Barycenter:
    """Bures–Wasserstein barycenter of K Gaussians with its convergence record.

    Attributes
    ----------
    mean : (d,)
    covariance : (d, d)
    weights : (K,)
    iterations : int
    rel_change : float   ‖S_{t+1} − S_t‖_F / ‖S_t‖_F at the last iteration
    residual : float     ‖Σ_k w_k A_k^{-1} − I‖_F / √d at the returned S
    converged : bool
    history : list of (rel_change, residual)
    """

    mean: np.ndarray
    covariance: np.ndarray
    weights: np.ndarray
    iterations: int
    rel_change: float
    residual: float
    converged: bool
    history: list = field(default_factory=list)

    def record(self) -> dict:
        """JSON-serialisable convergence record."""
        return dict(iterations=self.iterations, rel_change=self.rel_change,
                    residual=self.residual, converged=self.converged)


@dataclass
class BuresBarycenter:
    """The Bures–Wasserstein barycenter covariance with its convergence record.

    Attributes
    ----------
    covariance : (d, d)
    iterations : int (residual evaluations, K eigendecompositions each)
    rel_change : float   ‖S_next − S‖_F / ‖S‖_F at the last iteration
    residual : float     ‖Σ_k w_k A_k^{-1} − I‖_F / √d at the returned S (exact)
    converged : bool
    history : list of (rel_change, residual)
    reduced_dim : int or None, the dimension of the common non-scalar subspace solved on
        (:func:`fedalign._bures_fixed_point._scalar_complement`), None when not reduced
    """

    covariance: np.ndarray
    iterations: int
    rel_change: float
    residual: float
    converged: bool
    history: list = field(default_factory=list)
    reduced_dim: int | None = None

    def record(self) -> dict:
        """JSON-serialisable convergence record."""
        return dict(iterations=self.iterations, rel_change=self.rel_change,
                    residual=self.residual, converged=self.converged)


def _mean_root(S, covs, weights):
    """(S^{1/2}, S^{-1/2}, Σ_k w_k (S^{1/2} Σ_k S^{1/2})^{1/2}) by plain eigendecompositions."""
    R, Rinv = sqrt_and_inv_sqrt(S)
    T = np.zeros_like(S)
    for w, C in zip(weights, covs):
        T += w * sqrtm_psd(R @ C @ R)
    return R, Rinv, sym(T)


def fixed_point_residual(S, covs, weights) -> float:
    """‖Σ_k w_k A_k⁻¹ − I‖_F / √d at S (exact eigendecompositions); 0 at the barycenter."""
    _, Rinv, T = _mean_root(S, covs, weights)
    return float(np.linalg.norm(sym(Rinv @ T @ Rinv) - np.eye(S.shape[0])) / np.sqrt(S.shape[0]))



def bures_barycenter(covs, weights=None, tol: float = 1e-10, max_iter: int = 100,
                     init: np.ndarray | None = None, anderson: int = 5,
                     workers: int | None = None, reduce: bool = True,
                     progress=None, backend="numpy", device="cpu",
                     merge_identical: bool = False) -> BuresBarycenter:
    """Bures–Wasserstein barycenter covariance by the Álvarez-Esteban fixed point.

    Iteration (with S = L Lᵀ, Cholesky):
        G = L^{-T} (Σ_k w_k (Lᵀ Σ_k L)^{1/2}) L^{-1}   (= Σ_k w_k A_k⁻¹, maps barycenter → clients)
        S ← G S G                                       (= S^{-1/2} T² S^{-1/2})
    accelerated by Anderson mixing (memory ``anderson``, SPD-safeguarded; the machinery is in
    :mod:`fedalign._bures_fixed_point`). Every iteration uses
    exact eigendecompositions, so the residual ‖G − I‖_F/√d measured at an iterate is exact;
    the iterate returned is the one whose residual was measured last.

    Parameters
    ----------
    covs : sequence of K (d, d) SPD matrices
    weights : (K,) nonnegative, summing to 1 (uniform if None)
    tol : stop when the fixed-point residual ‖Σ w_k A_k⁻¹ − I‖_F/√d ≤ tol
    max_iter : bound on the number of residual evaluations (K eigendecompositions each)
    init : starting matrix; default Σ_k w_k Σ_k
    anderson : Anderson memory (0 disables)
    workers : threads for the K square roots (default: CPU count)
    reduce : solve on the common subspace outside which all Σ_k are scalar when it is at most
        half the dimension (exact; :func:`fedalign._bures_fixed_point._scalar_complement`) —
        clients with n_k ≪ d. Directions no client varies in (constant features; below the
        1e-12·tr/d ridge every Σ_k gets) are always split off, unless ``init`` is given: the
        barycenter is the ridge there (:func:`_common_range`)
    progress : optional callable(iteration, rel_change, residual), called after every
        iteration (the CLI's progress display)
    backend, device : ``"numpy"``/``"cpu"`` (default) or ``"torch"`` on ``"cpu"``,
        ``"cuda[:N]"``, ``"auto"`` (:func:`fedalign.backend.get_backend`): the same iteration
        with torch kernels (the K roots as one batched float64 eigh); the result is a numpy
        array and agrees with the numpy path to the order of ``tol``
    merge_identical : count clients with identical covariances (equal bytes) once, with
        their weights summed (exact; :func:`_merge_identical`), e.g. many clients holding
        the same data

    Each covariance may be a dense (d, d) array or a
    :class:`fedalign.linalg.ScaledIdentityPlusLowRank` c I + W Wᵀ (the exact form of a
    shrunk covariance of a client with n_k < d rows): the server then holds K·d·r numbers
    instead of K·d², and each client's Lᵀ Σ_k L = c LᵀL + (LᵀW)(LᵀW)ᵀ costs O(d² r) before its
    eigendecomposition; the result equals the dense one to rounding.

    Returns
    -------
    :class:`BuresBarycenter` (the covariance and its convergence record)
    """
    covs = [C if isinstance(C, ScaledIdentityPlusLowRank)
            else sym(np.asarray(C, dtype=np.float64)) for C in covs]
    K = len(covs)
    if K == 0:
        raise FedalignError("barycenter needs at least one covariance")
    d = covs[0].shape[0]
    for C in covs:
        if C.shape != (d, d):
            raise FedalignError(f"dimension mismatch: covariances {covs[0].shape} and {C.shape}")
    weights = normalize_weights(weights, K)
    if merge_identical:
        covs, weights = _merge_identical(covs, weights)
        K = len(covs)
    if K == 1:
        C = covs[0]
        return BuresBarycenter(C.dense() if isinstance(C, ScaledIdentityPlusLowRank)
                               else C.copy(), 0, 0.0, 0.0, True)
    # a tiny ridge keeps singular inputs (constant features, n <= d) strictly positive
    scale = max(max(C.trace() if isinstance(C, ScaledIdentityPlusLowRank) else np.trace(C)
                    for C in covs) / d, np.finfo(float).tiny)
    ridge = 1e-12 * scale
    U = _common_range(covs, weights, ridge) if init is None else None
    covs = [C.shifted(ridge) if isinstance(C, ScaledIdentityPlusLowRank)
            else C + ridge * np.eye(d) for C in covs]
    if U is None:
        return _solve(covs, weights, tol, max_iter, init, anderson, workers, reduce, progress,
                      backend, device)
    # directions no client varies in (constant features): every ridged Σ_k is ridge·I there,
    # so the barycenter splits exactly, B = U B_U Uᵀ + ridge (I − U Uᵀ)
    if U.shape[1] == 0:
        return BuresBarycenter(ridge * np.eye(d), 0, 0.0, 0.0, True, reduced_dim=0)
    sub = _solve([_project(C, U) for C in covs], weights, tol, max_iter, None, anderson,
                 workers, reduce, progress, backend, device)
    S = sym(U @ (sub.covariance - ridge * np.eye(U.shape[1])) @ U.T)
    S[np.diag_indices_from(S)] += ridge
    return BuresBarycenter(S, sub.iterations, sub.rel_change, sub.residual, sub.converged,
                           sub.history, reduced_dim=sub.reduced_dim or U.shape[1])


def _common_range(covs, weights, ridge: float):
    """Orthonormal basis U (d, r) of the directions some client varies in (by more than
    ``ridge``), when others exist; else None.

    A direction v with vᵀ(Σ_k w_k Σ_k)v ≤ ridge (a feature constant on every client, or one
    fixed combination of features) is below the ridge every Σ_k gets, and the fixed point
    cannot resolve it: its roots (Lᵀ Σ_k L)^{1/2} square the condition number, and their
    eigenvalue floor (1e-12 λ_max) made the barycenter ~1e-6·scale there instead of the
    ridge. One Cholesky factorisation of W − ridge·I (W = Σ_k w_k Σ_k) shows none exists, so
    inputs without such directions take the fixed point unchanged; otherwise W's
    eigenvectors above the ridge are U.
    """
    from scipy.linalg import LinAlgError, cholesky

    d = covs[0].shape[0]
    W = _weighted_sum(covs, weights)
    try:
        cholesky(W - ridge * np.eye(d), lower=True)
        return None
    except LinAlgError:
        pass
    lam, V = np.linalg.eigh(W)
    return V[:, lam > ridge]


def _solve(covs, weights, tol, max_iter, init, anderson, workers, reduce, progress, backend,
           device) -> BuresBarycenter:
    """The fixed point on SPD ``covs`` (numpy), reduced to their common non-scalar subspace
    when ``reduce`` applies (:func:`fedalign._bures_fixed_point._scalar_complement`)."""
    import os

    K, d = len(covs), covs[0].shape[0]
    workers = workers or os.cpu_count() or 1
    xp = get_backend(backend, device)
    n_dense = sum(not isinstance(C, ScaledIdentityPlusLowRank) for C in covs)
    with xp.guard(f"the barycenter (K={K}, d={d})",
                  array_bytes(*[(min(K, n_dense + 64) + 8, d, d)] * 2)):
        covs = [C if isinstance(C, ScaledIdentityPlusLowRank) else xp.asarray(C)
                for C in covs]  # (numpy: the float64 arrays themselves)
        split = _scalar_complement(covs, workers, backend=xp) if reduce and init is None else None
        if split is not None:
            U, c = split
            cb = float(np.dot(weights, np.sqrt(c))) ** 2
            if U.shape[1] == 0:
                return BuresBarycenter(cb * np.eye(d), 0, 0.0, 0.0, True, reduced_dim=0)
            Ux = xp.asarray(U)
            covs = [C.project(U) if isinstance(C, ScaledIdentityPlusLowRank)
                    else sym(Ux.T @ C @ Ux) for C in covs]
        if init is not None:
            S = sym(xp.asarray(np.array(init, float)))
        elif n_dense < K:  # factored inputs: the start Σ_k w_k Σ_k is summed in numpy
            S = xp.asarray(_weighted_sum([C if isinstance(C, ScaledIdentityPlusLowRank)
                                          else xp.to_numpy(C) for C in covs], weights))
        else:
            S = _weighted_sum(covs, weights)
        S, info = _iterate(S, covs, weights, tol, max_iter, anderson, workers, progress, xp)
        S = xp.to_numpy(S)
    if split is not None:  # S = U B Uᵀ + (Σ_k w_k √c_k)² (I − U Uᵀ)
        S = sym(U @ (S - cb * np.eye(U.shape[1])) @ U.T)
        S[np.diag_indices_from(S)] += cb
    return BuresBarycenter(S, reduced_dim=None if split is None else int(split[0].shape[1]),
                           **info)


def _merge_identical(covs, weights):
    """Clients with identical covariances as one client with their summed weight (exact:
    the root sum Σ_k w_k (Lᵀ Σ_k L)^{1/2} has equal terms); inputs unchanged when all differ.
    Equality is of the stored representation (bytes), found by hashing each once."""
    import hashlib

    first, keep, merged = {}, [], list(map(float, weights))
    for k, C in enumerate(covs):
        key = (C.key() if isinstance(C, ScaledIdentityPlusLowRank)
               else np.ascontiguousarray(C).tobytes())
        h = (type(C).__name__, C.shape, hashlib.blake2b(key, digest_size=20).digest())
        if h in first:
            merged[first[h]] += merged[k]
        else:
            first[h] = k
            keep.append(k)
    if len(keep) == len(covs):
        return covs, weights
    return [covs[k] for k in keep], np.array([merged[k] for k in keep])


def normalize_weights(weights, K: int) -> np.ndarray:
    """Validate and normalise barycentric weights (uniform if None)."""
    if weights is None:
        return np.full(K, 1.0 / K)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (K,) or np.any(w < 0) or not np.all(np.isfinite(w)) or w.sum() <= 0:
        raise FedalignError(f"weights must be {K} nonnegative numbers with a positive sum")
    return w / w.sum()


def gaussian_barycenter(means, covs, weights=None, tol: float = 1e-10,
                        max_iter: int = 100, progress=None, backend="numpy",
                        device="cpu", merge_identical: bool = False) -> Barycenter:
    """Barycenter N(μ_b, Σ_b) of Gaussians: μ_b = Σ w_k μ_k, Σ_b = :func:`bures_barycenter`
    (``progress``, ``backend``, ``device``, ``merge_identical``: see there)."""
    means = [np.asarray(m, dtype=np.float64) for m in means]
    d = means[0].shape[0]
    for m in means:
        if m.shape != (d,):
            raise FedalignError(f"dimension mismatch: means of size {d} and {m.shape[0]}")
    w = normalize_weights(weights, len(means))
    B = bures_barycenter(covs, w, tol=tol, max_iter=max_iter, progress=progress,
                         backend=backend, device=device, merge_identical=merge_identical)
    mu = np.sum([wk * m for wk, m in zip(w, means)], axis=0)
    return Barycenter(mu, B.covariance, w, B.iterations, B.rel_change, B.residual, B.converged,
                      B.history)

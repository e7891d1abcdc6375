"""Gaussian optimal transport: Bures–Wasserstein distance, OT maps and barycenters.

All computations are float64 and use symmetric eigendecompositions with eigenvalue clipping
(:mod:`fedalign.linalg`).

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

from fedalign.errors import FedalignError
from fedalign.linalg import eigh_clipped, sqrt_and_inv_sqrt, sqrtm_psd, sym


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


def ot_map(mean_src, cov_src, mean_ref, cov_ref) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form Gaussian OT map from N(mean_src, cov_src) to N(mean_ref, cov_ref).

    Returns
    -------
    A : (d, d) symmetric positive definite,
        A = Σ_b^{1/2} (Σ_b^{1/2} Σ_k Σ_b^{1/2})^{-1/2} Σ_b^{1/2}
    b : (d,)  b = μ_b − A μ_k
    """
    cov_src = np.asarray(cov_src, float)
    cov_ref = np.asarray(cov_ref, float)
    if cov_src.shape != cov_ref.shape:
        raise FedalignError(
            f"dimension mismatch: source covariance {cov_src.shape}, reference {cov_ref.shape}"
        )
    Rb, _ = sqrt_and_inv_sqrt(cov_ref)
    w, V = eigh_clipped(Rb @ cov_src @ Rb)
    M = (V / np.sqrt(w)) @ V.T
    A = sym(Rb @ M @ Rb)
    b = np.asarray(mean_ref, float) - A @ np.asarray(mean_src, float)
    return A, b


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
        raise FedalignError(f"tau must be in [0, 1], got {tau}")
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


def _full(U):
    """Symmetric matrix from its upper triangle (BLAS ``syrk`` output)."""
    return np.triu(U) + np.triu(U, 1).T


class _RootSum:
    """T = Σ_k w_k (Lᵀ Σ_k L)^{1/2} for a lower Cholesky factor S = L Lᵀ.

    Any factor F with F Fᵀ = S gives the same maps, F^{-T}(Fᵀ Σ_k F)^{1/2} F^{-1} =
    S^{-1/2}(S^{1/2} Σ_k S^{1/2})^{1/2} S^{-1/2}, so the Cholesky factor (cheap, no
    eigendecomposition of S) replaces S^{1/2}. Each client costs two triangular products
    (``trmm``), one clipped symmetric eigendecomposition M_k = V diag(λ) Vᵀ and one ``syrk``
    w_k V diag(√λ) Vᵀ. Clients run in a thread pool, each with single-threaded BLAS
    (oversubscribed multithreaded LAPACK is slow on small machines).
    """

    def __init__(self, covs, weights, workers):
        from concurrent.futures import ThreadPoolExecutor

        import scipy.linalg.blas  # noqa: F401  (loaded first, so that the controller sees it)
        from threadpoolctl import ThreadpoolController

        self.covs = [np.asfortranarray(C) for C in covs]
        self.weights = weights
        self.n_workers = max(1, min(workers, len(covs)))
        self.pool = ThreadPoolExecutor(self.n_workers)
        self.blas = ThreadpoolController()

    def _part(self, ks, L):
        from scipy.linalg.blas import dsyrk, dtrmm

        T = np.zeros(L.shape, order="F")
        for k in ks:
            M = dtrmm(1.0, L, dtrmm(1.0, L, self.covs[k], side=1, lower=1), lower=1, trans_a=1)
            w, V = eigh_clipped(M, symmetrize=False)
            T = dsyrk(1.0, V * np.sqrt(self.weights[k] * np.sqrt(w)), beta=1.0, c=T,
                      overwrite_c=1)
        return T

    def __call__(self, L):
        L = np.asfortranarray(L)
        groups = [range(i, len(self.covs), self.n_workers) for i in range(self.n_workers)]
        with self.blas.limit(limits=1, user_api="blas"):
            parts = list(self.pool.map(lambda ks: self._part(ks, L), groups))
        return _full(sum(parts))

    def close(self):
        self.pool.shutdown()


def _congruence_inv(L, T):
    """L^{-T} T L^{-1} for lower-triangular L (two triangular solves)."""
    from scipy.linalg import solve_triangular

    Y = solve_triangular(L, T, lower=True, trans="T")
    return sym(solve_triangular(L, Y.T, lower=True, trans="T").T)


def bures_barycenter(covs, weights=None, tol: float = 1e-10, max_iter: int = 100,
                     init: np.ndarray | None = None, anderson: int = 5,
                     workers: int | None = None, reduce: bool = True) -> tuple[np.ndarray, dict]:
    """Bures–Wasserstein barycenter covariance by the Álvarez-Esteban fixed point.

    Iteration (with S = L Lᵀ, Cholesky):
        G = L^{-T} (Σ_k w_k (Lᵀ Σ_k L)^{1/2}) L^{-1}   (= Σ_k w_k A_k⁻¹, maps barycenter → clients)
        S ← G S G                                       (= S^{-1/2} T² S^{-1/2})
    accelerated by Anderson mixing (memory ``anderson``, SPD-safeguarded). Every iteration uses
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
        half the dimension (exact; see :func:`_scalar_complement`) — clients with n_k ≪ d

    Returns
    -------
    S : (d, d) barycenter covariance
    info : dict with iterations, rel_change (‖S_next − S‖_F/‖S‖_F), residual (exact, at S),
        converged, history of (rel_change, residual), reduced_dim
    """
    import os

    covs = [sym(np.asarray(C, dtype=np.float64)) for C in covs]
    K = len(covs)
    if K == 0:
        raise FedalignError("barycenter needs at least one covariance")
    d = covs[0].shape[0]
    for C in covs:
        if C.shape != (d, d):
            raise FedalignError(f"dimension mismatch: covariances {covs[0].shape} and {C.shape}")
    weights = normalize_weights(weights, K)
    if K == 1:
        return covs[0].copy(), dict(iterations=0, rel_change=0.0, residual=0.0, converged=True,
                                    history=[], reduced_dim=None)
    # a tiny ridge keeps singular inputs (constant features, n <= d) strictly positive
    scale = max(max(np.trace(C) for C in covs) / d, np.finfo(float).tiny)
    covs = [C + 1e-12 * scale * np.eye(d) for C in covs]
    workers = workers or os.cpu_count() or 1
    split = _scalar_complement(covs, workers) if reduce and init is None else None
    if split is not None:
        U, c = split
        cb = float(np.dot(weights, np.sqrt(c))) ** 2
        if U.shape[1] == 0:
            return cb * np.eye(d), dict(iterations=0, rel_change=0.0, residual=0.0,
                                        converged=True, history=[], reduced_dim=0)
        covs = [sym(U.T @ C @ U) for C in covs]
    S = sym(sum(w * C for w, C in zip(weights, covs))) if init is None else sym(np.array(init, float))
    S, info = _iterate(S, covs, weights, tol, max_iter, anderson, workers)
    info["reduced_dim"] = None if split is None else int(split[0].shape[1])
    if split is not None:  # S = U B Uᵀ + (Σ_k w_k √c_k)² (I − U Uᵀ)
        S = sym(U @ (S - cb * np.eye(U.shape[1])) @ U.T)
        S[np.diag_indices_from(S)] += cb
    return S, info


def _scalar_complement(covs, workers, rtol: float = 1e-10, max_fraction: float = 0.5):
    """Common invariant subspace outside which every Σ_k is a multiple of the identity.

    Shrunk covariances of clients with few samples (n_k ≪ d) have the form
    Σ_k = c_k I + U_k D_k U_kᵀ with rank U_k ≤ n_k. With U an orthonormal basis of
    span(U_1, …, U_K), every Σ_k maps U and U⊥ to themselves and is c_k I on U⊥, so the
    barycenter splits exactly: B = U B_U Uᵀ + (Σ_k w_k √c_k)² (I − U Uᵀ), with B_U the
    barycenter of the r × r matrices Uᵀ Σ_k U. Eigenvalues within ``rtol · λ_max`` of λ_min
    count as the scalar part.

    Returns
    -------
    (U (d, r), c (K,)) when r ≤ max_fraction · d, else None.
    """
    from concurrent.futures import ThreadPoolExecutor

    d = covs[0].shape[0]
    if d < 64:
        return None

    def scalar_part(w):
        return w <= w[0] + rtol * max(w[-1], np.finfo(float).tiny)

    # cheap screen (eigenvalues only) on one client before decomposing all of them
    if scalar_part(np.linalg.eigvalsh(covs[0])).sum() < d - max_fraction * d:
        return None
    with ThreadPoolExecutor(max(1, min(workers, len(covs)))) as pool:
        eigs = list(pool.map(lambda C: np.linalg.eigh(C), covs))
    bases, c = [], []
    for w, V in eigs:
        scalar = scalar_part(w)
        if scalar.sum() < d - max_fraction * d:
            return None
        c.append(float(np.mean(w[scalar])))
        bases.append(V[:, ~scalar])
    B = np.concatenate(bases, axis=1)
    if B.shape[1] > max_fraction * d:
        return None
    if B.shape[1] == 0:
        return np.zeros((d, 0)), np.array(c)
    Q, sv, _ = np.linalg.svd(B, full_matrices=False)
    r = int(np.sum(sv > 1e-8 * sv[0]))
    if r > max_fraction * d:
        return None
    return Q[:, :r], np.array(c)


def _iterate(S, covs, weights, tol, max_iter, anderson, workers):
    from scipy.linalg.blas import dsyrk, dtrmm
    from threadpoolctl import ThreadpoolController

    d = S.shape[0]
    I = np.eye(d)
    root_sum = _RootSum(covs, weights, workers)
    mixer, history = _Anderson(anderson), []
    rel, res, converged, it = np.inf, np.inf, False, 0
    L = _safe_cholesky(S)
    # the root sum runs clients in parallel threads with one BLAS thread each; the remaining
    # d × d kernels gain from BLAS threads only at large d
    with ThreadpoolController().limit(limits=1 if d < 1024 else None, user_api="blas"):
        try:
            for it in range(1, max_iter + 1):
                G = _congruence_inv(L, root_sum(L))
                res = float(np.linalg.norm(G - I) / np.sqrt(d))
                F = _full(dsyrk(1.0, dtrmm(1.0, L, G, side=1, lower=1)))  # G S G = (GL)(GL)ᵀ
                rel = float(np.linalg.norm(F - S) / np.linalg.norm(S))
                history.append((rel, res))
                converged = res <= tol
                if converged or it == max_iter:
                    break
                S, L = mixer.step(S, F)
        finally:
            root_sum.close()
    return S, dict(iterations=it, rel_change=rel, residual=res, converged=bool(converged),
                   history=history)


def _safe_cholesky(S):
    """Lower Cholesky factor of S, adding a growing relative ridge if S is numerically singular."""
    from scipy.linalg import LinAlgError, cholesky

    jitter = 0.0
    scale = max(np.trace(S) / S.shape[0], np.finfo(float).tiny)
    for _ in range(12):
        try:
            return cholesky(S + jitter * np.eye(S.shape[0]), lower=True)
        except LinAlgError:
            jitter = scale * (1e-14 if jitter == 0.0 else jitter / scale * 10)
    raise FedalignError("barycenter iterate lost positive definiteness (inputs too singular)")


class _Anderson:
    """Anderson (type II) mixing of a fixed-point map S ↦ F, in the Frobenius inner product.

    Keeps the last ``memory`` differences of iterates and of residuals F − S; each step solves
    the small least-squares problem min_γ ‖g − Σ γ_i ΔG_i‖ through its m × m normal equations
    and returns S + g − Σ γ_i (ΔX_i + ΔG_i).
    """

    def __init__(self, memory):
        from collections import deque

        self.dx, self.dg = deque(maxlen=memory), deque(maxlen=memory)
        self.last = None

    def step(self, S, F):
        """Next iterate and its lower Cholesky factor; plain F (memory cleared) if not SPD."""
        from scipy.linalg import LinAlgError, cholesky

        x, g = S.ravel(), (F - S).ravel()
        if self.last is not None:  # (a deque of maxlen 0 keeps nothing: plain iteration)
            self.dx.append(x - self.last[0])
            self.dg.append(g - self.last[1])
        self.last = (x, g)
        if self.dg:
            gram = np.array([[a @ b for b in self.dg] for a in self.dg])
            gamma = np.linalg.lstsq(gram, np.array([a @ g for a in self.dg]), rcond=None)[0]
            v = x + g
            for c, ddx, ddg in zip(gamma, self.dx, self.dg):
                v -= c * (ddx + ddg)
            N = sym(v.reshape(S.shape))
            try:
                return N, cholesky(N, lower=True)
            except LinAlgError:
                self.dx.clear()
                self.dg.clear()
        return F, _safe_cholesky(F)


def normalize_weights(weights, K: int) -> np.ndarray:
    """Validate and normalise barycentric weights (uniform if None)."""
    if weights is None:
        return np.full(K, 1.0 / K)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (K,) or np.any(w < 0) or not np.all(np.isfinite(w)) or w.sum() <= 0:
        raise FedalignError(f"weights must be {K} nonnegative numbers with a positive sum")
    return w / w.sum()


def gaussian_barycenter(means, covs, weights=None, tol: float = 1e-10,
                        max_iter: int = 100) -> Barycenter:
    """Barycenter N(μ_b, Σ_b) of Gaussians: μ_b = Σ w_k μ_k, Σ_b = :func:`bures_barycenter`."""
    means = [np.asarray(m, dtype=np.float64) for m in means]
    d = means[0].shape[0]
    for m in means:
        if m.shape != (d,):
            raise FedalignError(f"dimension mismatch: means of size {d} and {m.shape[0]}")
    w = normalize_weights(weights, len(means))
    S, info = bures_barycenter(covs, w, tol=tol, max_iter=max_iter)
    mu = np.sum([wk * m for wk, m in zip(w, means)], axis=0)
    return Barycenter(mu, S, w, info["iterations"], info["rel_change"], info["residual"],
                      info["converged"], info["history"])

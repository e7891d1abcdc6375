"""The speed machinery of :func:`fedalign.gaussian.bures_barycenter` (private).

The fixed point S ← G S G, G = L^{-T} (Σ_k w_k (Lᵀ Σ_k L)^{1/2}) L^{-1} with S = L Lᵀ, and what
makes it fast (``benchmarks/bench_barycenter.py``):

- :class:`_RootSum`: the K square roots with a Cholesky factor instead of S^{1/2}, clients in
  a thread pool, each with single-threaded BLAS (``trmm``, one ``eigh``, ``syrk``);
- :class:`_Anderson`: Anderson (type II) mixing of the iterates, SPD-safeguarded;
- :func:`_scalar_complement`: the exact reduction to the common subspace outside which every
  Σ_k is scalar (shrunk covariances of clients with n_k ≪ d);
- BLAS thread control: one BLAS thread per worker inside the root sum, and one for the
  remaining d × d kernels below d = 1024 (threadpoolctl).

The loop (:func:`_iterate`, :class:`_Anderson`, :func:`_safe_cholesky`) is written once over
the adapter of :mod:`fedalign.backend` (Cholesky, triangular solves, (G L)(G L)ᵀ, norms,
BLAS threads). The one kernel with two implementations is the root sum: :class:`_RootSum`
(numpy: the clients in the thread pool above, scipy BLAS) and :class:`_BatchedRootSum`
(torch: the K clients as one batched float64 ``torch.linalg.eigh`` with the same clipping,
on a CPU or a GPU), chosen by the adapter's ``batched``: one is a pool of per-client BLAS
calls, the other one batched call, and merging them would change the numpy path's
arithmetic.

:func:`_iterate` runs the loop; ``fedalign.gaussian`` holds the public functions and the
mathematics (its module docstring).
"""

from __future__ import annotations

import numpy as np

from fedalign.backend import full_symmetric, get_backend
from fedalign.errors import FedalignError
from fedalign.linalg import EIG_FLOOR, ScaledIdentityPlusLowRank, eigh_clipped, sym

_LowRank = ScaledIdentityPlusLowRank


def _weighted_sum(covs, weights):
    """Σ_k w_k Σ_k as a dense (d, d) array (factored inputs added as c I + W Wᵀ)."""
    if not any(isinstance(C, _LowRank) for C in covs):
        return sym(sum(float(w) * C for w, C in zip(weights, covs)))
    d = covs[0].shape[0]
    S = np.zeros((d, d))
    for w, C in zip(weights, covs):
        if isinstance(C, _LowRank):
            S += float(w) * (C.W @ C.W.T)
            S[np.diag_indices(d)] += float(w) * C.c
        else:
            S += float(w) * C
    return sym(S)


def _project(C, U):
    """Uᵀ Σ U (orthonormal U), factored inputs staying factored."""
    return C.project(U) if isinstance(C, _LowRank) else sym(U.T @ C @ U)


class _RootSum:
    """T = Σ_k w_k (Lᵀ Σ_k L)^{1/2} for a lower Cholesky factor S = L Lᵀ.

    Any factor F with F Fᵀ = S gives the same maps, F^{-T}(Fᵀ Σ_k F)^{1/2} F^{-1} =
    S^{-1/2}(S^{1/2} Σ_k S^{1/2})^{1/2} S^{-1/2}, so the Cholesky factor (cheap, no
    eigendecomposition of S) replaces S^{1/2}. Each client costs two triangular products
    (``trmm``), one clipped symmetric eigendecomposition M_k = V diag(λ) Vᵀ and one ``syrk``
    w_k V diag(√λ) Vᵀ. Clients run in a thread pool, each with single-threaded BLAS
    (oversubscribed multithreaded LAPACK is slow on small machines).
    """

    def __init__(self, bk, covs, weights, workers):
        from concurrent.futures import ThreadPoolExecutor

        import scipy.linalg.blas  # noqa: F401  (loaded first, so that the controller sees it)
        from threadpoolctl import ThreadpoolController

        self.covs = [C if isinstance(C, _LowRank) else np.asfortranarray(C) for C in covs]
        self.factored = any(isinstance(C, _LowRank) for C in covs)
        self.weights = weights
        self.n_workers = max(1, min(workers, len(covs)))
        self.pool = ThreadPoolExecutor(self.n_workers)
        self.blas = ThreadpoolController()

    def _part(self, ks, L, P):
        from scipy.linalg.blas import dsyrk, dtrmm

        T = np.zeros(L.shape, order="F")
        for k in ks:
            C = self.covs[k]
            if isinstance(C, _LowRank):  # Lᵀ (c I + W Wᵀ) L = c LᵀL + (LᵀW)(LᵀW)ᵀ
                Y = dtrmm(1.0, L, C.W, lower=1, trans_a=1)
                M = Y @ Y.T
                M += C.c * P
            else:
                M = dtrmm(1.0, L, dtrmm(1.0, L, C, side=1, lower=1), lower=1, trans_a=1)
            w, V = eigh_clipped(M, symmetrize=False)
            T = dsyrk(1.0, V * np.sqrt(self.weights[k] * np.sqrt(w)), beta=1.0, c=T,
                      overwrite_c=1)
        return T

    def __call__(self, L):
        L = np.asfortranarray(L)
        P = L.T @ L if self.factored else None
        groups = [range(i, len(self.covs), self.n_workers) for i in range(self.n_workers)]
        with self.blas.limit(limits=1, user_api="blas"):
            parts = list(self.pool.map(lambda ks: self._part(ks, L, P), groups))
        return full_symmetric(sum(parts))

    def close(self):
        self.pool.shutdown()


def _congruence_inv(bk, L, T):
    """L^{-T} T L^{-1} for lower-triangular L (two triangular solves on ``bk``)."""
    Y = bk.solve_lower_t(L, T)
    return sym(bk.solve_lower_t(L, Y.T).T)


class _BatchedRootSum:
    """T = Σ_k w_k (Lᵀ Σ_k L)^{1/2} on a torch backend: batched float64 eigh over the K
    clients, eigenvalues clipped as in :func:`eigh_clipped`."""

    #: factored clients decomposed per batch of this many (K·d² would not fit a device)
    BATCH = 64

    def __init__(self, bk, covs, weights, workers=None):
        self.bk, self.t = bk, bk.torch
        weights = np.asarray(weights, dtype=np.float64)
        lr = [k for k, C in enumerate(covs) if isinstance(C, _LowRank)]
        dense = [k for k, C in enumerate(covs) if not isinstance(C, _LowRank)]
        self.covs = (self.t.stack([bk.asarray(covs[k]) for k in dense]) if dense
                     else None)                                          # (K_dense, d, d)
        self.w = bk.asarray(weights[dense])                             # (K_dense,)
        self.lr = None
        if lr:  # W padded with zero columns to the largest rank: (K_lr, d, r_max)
            d, r = covs[lr[0]].shape[0], max(1, max(covs[k].rank for k in lr))
            W = np.zeros((len(lr), d, r))
            for i, k in enumerate(lr):
                W[i, :, :covs[k].rank] = covs[k].W
            self.lr = (bk.asarray(W), bk.asarray(np.array([covs[k].c for k in lr])),
                       bk.asarray(weights[lr]))

    def _roots(self, M, w):
        lam, V = self.t.linalg.eigh(M)  # reads the lower triangle, as the numpy path's eigh
        top = lam[:, -1:].clamp_min(np.finfo(np.float64).tiny)
        lam = self.t.maximum(lam, EIG_FLOOR * top)
        Vs = V * self.t.sqrt(w[:, None] * self.t.sqrt(lam))[:, None, :]
        return (Vs @ Vs.mT).sum(0)

    def __call__(self, L):
        T = 0.0
        if self.covs is not None:
            T = self._roots(L.mT @ self.covs @ L, self.w)
        if self.lr is not None:
            W, c, w = self.lr
            P = L.mT @ L
            for i in range(0, W.shape[0], self.BATCH):
                Y = L.mT @ W[i:i + self.BATCH]
                M = Y @ Y.mT + c[i:i + self.BATCH, None, None] * P
                T = T + self._roots(M, w[i:i + self.BATCH])
        return sym(T)

    def close(self):
        pass


def _scalar_complement(covs, workers, rtol: float = 1e-10, max_fraction: float = 0.5,
                       backend=None):
    """Common invariant subspace outside which every Σ_k is a multiple of the identity.

    Shrunk covariances of clients with few samples (n_k ≪ d) have the form
    Σ_k = c_k I + U_k D_k U_kᵀ with rank U_k ≤ n_k. With U an orthonormal basis of
    span(U_1, …, U_K), every Σ_k maps U and U⊥ to themselves and is c_k I on U⊥, so the
    barycenter splits exactly: B = U B_U Uᵀ + (Σ_k w_k √c_k)² (I − U Uᵀ), with B_U the
    barycenter of the r × r matrices Uᵀ Σ_k U. Eigenvalues within ``rtol · λ_max`` of λ_min
    count as the scalar part.

    Returns
    -------
    (U (d, r), c (K,)) when r ≤ max_fraction · d, else None. (numpy arrays; with a torch
    ``backend`` the eigendecompositions run there.)
    """
    xp = get_backend(backend)
    d = covs[0].shape[0]
    if d < 64:
        return None
    if all(isinstance(C, _LowRank) for C in covs):
        return _factored_complement(covs, max_fraction)
    if any(isinstance(C, _LowRank) for C in covs):
        return None  # mixed storage: solved without the reduction (exact either way)

    def scalar_part(w):
        return w <= w[0] + rtol * max(w[-1], np.finfo(float).tiny)

    # cheap screen (eigenvalues only) on one client before decomposing all of them
    if scalar_part(xp.to_numpy(xp.eigvalsh(covs[0]))).sum() < d - max_fraction * d:
        return None
    bases, c = [], []
    for w, V in xp.eigh_all(covs, workers):
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


def _factored_complement(covs, max_fraction: float, rtol: float = 1e-8):
    """:func:`_scalar_complement` of factored inputs Σ_k = c_k I + W_k W_kᵀ: U spans the
    W_k (built column block by column block, stopped as soon as it exceeds
    ``max_fraction · d``), c_k as given; no eigendecomposition."""
    d = covs[0].shape[0]
    Q = np.zeros((d, 0))
    for C in covs:
        if C.rank == 0:
            continue
        R = C.W - Q @ (Q.T @ C.W)
        R -= Q @ (Q.T @ R)  # twice is enough (Gram–Schmidt re-orthogonalisation)
        u, sv, _ = np.linalg.svd(R, full_matrices=False)
        keep = sv > rtol * max(float(np.linalg.norm(C.W, 2)), np.finfo(float).tiny)
        Q = np.concatenate([Q, u[:, keep]], axis=1)
        if Q.shape[1] > max_fraction * d:
            return None
    return Q, np.array([C.c for C in covs])


def _iterate(S, covs, weights, tol, max_iter, anderson, workers, progress=None, backend=None):
    """The fixed-point loop; ``S`` and ``covs`` are arrays of ``backend`` (numpy by default)."""
    bk = get_backend(backend)
    d = S.shape[0]
    root_sum = (_BatchedRootSum if bk.batched else _RootSum)(bk, covs, weights, workers)
    I = bk.eye(d)
    mixer, history = _Anderson(anderson, bk), []
    rel, res, converged, it = np.inf, np.inf, False, 0
    L = _safe_cholesky(S, bk)
    # numpy: the root sum runs clients in parallel threads with one BLAS thread each; the
    # remaining d × d kernels gain from BLAS threads only at large d
    with bk.blas_threads(1 if d < 1024 else None):
        try:
            for it in range(1, max_iter + 1):
                G = _congruence_inv(bk, L, root_sum(L))
                res = float(bk.norm(G - I) / np.sqrt(d))
                F = bk.gram_lower(G, L)  # G S G = (GL)(GL)ᵀ
                rel = float(bk.norm(F - S) / bk.norm(S))
                history.append((rel, res))
                if progress is not None:
                    progress(it, rel, res)
                converged = res <= tol
                if converged or it == max_iter:
                    break
                S, L = mixer.step(S, F)
        finally:
            root_sum.close()
    return S, dict(iterations=it, rel_change=rel, residual=res, converged=bool(converged),
                   history=history)


def _safe_cholesky(S, bk):
    """Lower Cholesky factor of S (on the adapter ``bk``), adding a growing relative ridge if
    S is numerically singular."""
    jitter = 0.0
    d = S.shape[0]
    scale = max(float(S.diagonal().sum()) / d, np.finfo(float).tiny)
    for _ in range(12):
        L = bk.cholesky(S + jitter * bk.eye(d))
        if L is not None:
            return L
        jitter = scale * (1e-14 if jitter == 0.0 else jitter / scale * 10)
    raise FedalignError("barycenter iterate lost positive definiteness (inputs too singular)")


class _Anderson:
    """Anderson (type II) mixing of a fixed-point map S ↦ F, in the Frobenius inner product.

    Keeps the last ``memory`` differences of iterates and of residuals F − S; each step solves
    the small least-squares problem min_γ ‖g − Σ γ_i ΔG_i‖ through its m × m normal equations
    and returns S + g − Σ γ_i (ΔX_i + ΔG_i).
    """

    def __init__(self, memory, bk):
        from collections import deque

        self.dx, self.dg = deque(maxlen=memory), deque(maxlen=memory)
        self.last = None
        self.bk = bk

    def step(self, S, F):
        """Next iterate and its lower Cholesky factor; plain F (memory cleared) if not SPD."""
        x, g = S.ravel(), (F - S).ravel()
        if self.last is not None:  # (a deque of maxlen 0 keeps nothing: plain iteration)
            self.dx.append(x - self.last[0])
            self.dg.append(g - self.last[1])
        self.last = (x, g)
        if self.dg:
            gram = np.array([[float(a @ b) for b in self.dg] for a in self.dg])
            gamma = np.linalg.lstsq(gram, np.array([float(a @ g) for a in self.dg]),
                                    rcond=None)[0]
            v = x + g
            for c, ddx, ddg in zip(gamma, self.dx, self.dg):
                v -= float(c) * (ddx + ddg)
            N = sym(v.reshape(S.shape))
            L = self.bk.cholesky(N)
            if L is not None:
                return N, L
            self.dx.clear()
            self.dg.clear()
        return F, _safe_cholesky(F, self.bk)


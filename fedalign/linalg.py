"""Symmetric matrix functions by eigendecomposition, in float64.

Matrix square roots are computed from ``numpy.linalg.eigh`` with eigenvalues clipped at a
relative floor, never with ``scipy.linalg.sqrtm`` (which is slower, may return complex
output, and is unstable for near-singular covariances).

``backend`` (default numpy; see :func:`fedalign.backend.get_backend`) runs the same functions
on torch tensors (``torch.linalg.eigh``, the same clipping), on a CPU or a GPU.

:func:`check_spd` is the numerical test (symmetric to :data:`SYMMETRY_RTOL`, positive
definite by a Cholesky factorisation) that statistics and the readers of the ``.npz`` kinds
(:mod:`fedalign.files`) apply to covariances and maps; a failure is one
:class:`~fedalign.errors.FedalignError` line.
"""

from __future__ import annotations

import numpy as np

from fedalign.backend import get_backend
from fedalign.errors import FedalignError

#: Relative eigenvalue floor: eigenvalues below ``EIG_FLOOR * max(|eig|)`` are clipped.
EIG_FLOOR = 1e-12


def sym(M: np.ndarray) -> np.ndarray:
    """Symmetric part ``(M + Mᵀ)/2``."""
    return 0.5 * (M + M.T)


def eigh_clipped(S: np.ndarray, floor: float = EIG_FLOOR,
                 symmetrize: bool = True, backend=None) -> tuple[np.ndarray, np.ndarray]:
    """Eigendecomposition of the symmetric part of ``S`` with eigenvalues clipped.

    Parameters
    ----------
    S : (d, d) array
    floor : float
        Relative floor: eigenvalues are clipped to ``>= floor * max(max_eig, tiny)``.
    symmetrize : bool
        Decompose ``(S + Sᵀ)/2`` (default); if False, only the lower triangle of ``S`` is read
        (for inputs symmetric by construction — saves a copy).
    backend : None (numpy) or a :mod:`fedalign.backend` adapter; with torch, ``S`` may be a
        tensor on the adapter's device and ``w``, ``V`` are float64 tensors there.

    Returns
    -------
    w : (d,) float64 eigenvalues, all ``> 0``
    V : (d, d) float64 orthonormal eigenvectors, ``S ≈ V diag(w) Vᵀ``
    """
    xp = get_backend(backend)
    S = xp.asarray(S, dtype=np.float64)
    w, V = xp.eigh(sym(S) if symmetrize else S)
    top = max(float(w[-1]) if w.shape[0] else 0.0, np.finfo(np.float64).tiny)
    return xp.maximum(w, floor * top), V


def _apply(w: np.ndarray, V: np.ndarray, f) -> np.ndarray:
    return sym((V * f(w)) @ V.T)


def project_psd(S: np.ndarray) -> np.ndarray:
    """Frobenius projection of the symmetric part of ``S`` (d, d) onto the PSD cone: its
    eigenvalues clipped at 0, float64."""
    w, V = np.linalg.eigh(sym(np.asarray(S, dtype=np.float64)))
    return _apply(w, V, lambda x: np.clip(x, 0.0, None))


def sqrtm_psd(S: np.ndarray, floor: float = EIG_FLOOR, backend=None) -> np.ndarray:
    """Principal square root ``S^{1/2}`` of a symmetric PSD matrix (d, d)."""
    xp = get_backend(backend)
    w, V = eigh_clipped(S, floor, backend=xp)
    return _apply(w, V, xp.sqrt)


def inv_sqrtm_psd(S: np.ndarray, floor: float = EIG_FLOOR, backend=None) -> np.ndarray:
    """Inverse square root ``S^{-1/2}`` of a symmetric PD matrix (d, d), eigenvalues clipped."""
    xp = get_backend(backend)
    w, V = eigh_clipped(S, floor, backend=xp)
    return _apply(w, V, lambda x: 1.0 / xp.sqrt(x))


def sqrt_and_inv_sqrt(S: np.ndarray, floor: float = EIG_FLOOR,
                      backend=None) -> tuple[np.ndarray, np.ndarray]:
    """``(S^{1/2}, S^{-1/2})`` from one eigendecomposition."""
    xp = get_backend(backend)
    w, V = eigh_clipped(S, floor, backend=xp)
    r = xp.sqrt(w)
    return _apply(r, V, lambda x: x), _apply(r, V, lambda x: 1.0 / x)


def is_spd(S: np.ndarray, rtol: float = 1e-10) -> bool:
    """True if ``S`` is symmetric (relative ``rtol``) with strictly positive eigenvalues."""
    S = np.asarray(S, dtype=np.float64)
    scale = max(np.abs(S).max(), np.finfo(float).tiny)
    if np.abs(S - S.T).max() > rtol * scale:
        return False
    return bool(np.linalg.eigvalsh(sym(S))[0] > 0)


#: Relative asymmetry max|M − Mᵀ| / max|M| accepted as rounding (then M is symmetrised).
SYMMETRY_RTOL = 1e-8


def check_spd(M, what: str = "matrix", rtol: float = SYMMETRY_RTOL) -> np.ndarray:
    """Symmetric positive definite, numerically: returns the symmetrised float64 matrix.

    Symmetric: max|M − Mᵀ| ≤ rtol · max|M|. Positive definite: λ_min > d · eps · tr M (the
    usual numerical-rank tolerance), tested by a Cholesky factorisation of M − tol·I.
    """
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise FedalignError(f"{what} must be a square matrix, got shape {M.shape}")
    scale = float(np.abs(M).max()) if M.size else 0.0
    asym = float(np.abs(M - M.T).max()) if M.size else 0.0
    if asym > rtol * scale:
        raise FedalignError(f"{what} is not symmetric (max |M − Mᵀ| = {asym:.3g}, "
                            f"{asym / scale:.1e} of its largest entry)")
    S = 0.5 * (M + M.T)
    d = S.shape[0]
    tol = d * np.finfo(np.float64).eps * float(np.trace(S))
    ok = scale > 0 and tol >= 0 and bool(np.all(np.diag(S) > 0))
    if ok:
        try:
            np.linalg.cholesky(S - tol * np.eye(d))
        except np.linalg.LinAlgError:
            ok = False
    if not ok:
        raise FedalignError(f"{what} is not positive definite (singular or with negative "
                            "eigenvalues)")
    return S


class ScaledIdentityPlusLowRank:
    """A symmetric PSD matrix Σ = c I + W Wᵀ (d, d) held as c and W (d, r), r ≪ d.

    The exact form of a Ledoit–Wolf covariance of a client with n < d rows,
    Σ = (1 − s) Σ̂ + s (tr Σ̂/d) I with rank Σ̂ ≤ n − 1: c = s tr Σ̂/d and W W ᵀ = (1 − s) Σ̂
    (:func:`factor_scaled_identity`). It takes d·r + 1 numbers instead of d²: a server holding
    K clients' covariances (``fedalign.gaussian.bures_barycenter``) needs K·d·r·8 bytes.

    Attributes
    ----------
    c : float ≥ 0
    W : (d, r) float64, Fortran order
    error : ‖C − (c I + W Wᵀ)‖_F of the matrix C it was factored from (0 if built directly)
    """

    __slots__ = ("c", "W", "error")

    def __init__(self, c: float, W: np.ndarray, error: float = 0.0):
        self.c = float(c)
        self.W = np.asfortranarray(W, dtype=np.float64)
        if self.W.base is not None and self.W.base.nbytes > self.W.nbytes:
            self.W = self.W.copy(order="F")  # a view would keep a larger array alive
        self.error = float(error)  # ‖C − (c I + W Wᵀ)‖_F of the matrix it was factored from

    @property
    def shape(self) -> tuple:
        return (self.W.shape[0], self.W.shape[0])

    @property
    def rank(self) -> int:
        return self.W.shape[1]

    @property
    def nbytes(self) -> int:
        return self.W.nbytes + 8

    def trace(self) -> float:
        return self.c * self.W.shape[0] + float(np.einsum("ij,ij->", self.W, self.W))

    def dense(self) -> np.ndarray:
        """Σ as a (d, d) float64 array."""
        S = self.W @ self.W.T
        S[np.diag_indices_from(S)] += self.c
        return S

    def shifted(self, ridge: float) -> "ScaledIdentityPlusLowRank":
        """Σ + ridge·I."""
        return ScaledIdentityPlusLowRank(self.c + ridge, self.W)

    def project(self, U: np.ndarray) -> "ScaledIdentityPlusLowRank":
        """Uᵀ Σ U for U (d, q) with orthonormal columns: c I_q + (UᵀW)(UᵀW)ᵀ."""
        return ScaledIdentityPlusLowRank(self.c, U.T @ self.W)

    def key(self) -> bytes:
        """Bytes identifying Σ's representation (equal inputs give equal keys)."""
        return np.float64(self.c).tobytes() + self.W.tobytes(order="F")


def factor_scaled_identity(C: np.ndarray, c: float, max_rank: int, rtol: float = 1e-13):
    """Σ = C as :class:`ScaledIdentityPlusLowRank` with the given c, when that is exact.

    C − c I is factored by a diagonally pivoted Cholesky decomposition stopped when the
    largest remaining pivot is below ``rtol · tr C`` (O(d r²), no eigendecomposition); the
    factor is kept only when it has at most ``max_rank`` columns and reproduces C,
    ‖C − (c I + W Wᵀ)‖_F ≤ rtol·‖C‖_F·√d (a wrong c or a full-rank C gives None).

    Parameters
    ----------
    C : (d, d) symmetric PSD float64
    c : the scalar part (for a Ledoit–Wolf covariance with shrinkage s: s·tr C/d)
    max_rank : most columns of W

    Returns
    -------
    :class:`ScaledIdentityPlusLowRank` or None
    """
    C = np.asarray(C, dtype=np.float64)
    d = C.shape[0]
    if not (np.isfinite(c) and c >= 0):
        return None
    tol = rtol * max(float(np.trace(C)), np.finfo(float).tiny)
    diag = C.diagonal() - c
    W = np.zeros((d, max(0, max_rank) + 1), order="F")
    r = 0
    while True:
        p = int(np.argmax(diag))
        if diag[p] <= tol:
            break
        if r == W.shape[1]:
            return None
        col = C[:, p].copy()
        col[p] -= c
        col -= W[:, :r] @ W[p, :r]
        col /= np.sqrt(diag[p])
        W[:, r] = col
        diag -= col * col
        diag[p] = 0.0
        r += 1
    if r > max_rank:
        return None
    out = ScaledIdentityPlusLowRank(c, W[:, :r].copy(order="F"))  # not a view of W's (d, max_rank)
    err = out.dense()
    err -= C
    out.error = float(np.linalg.norm(err))
    if out.error > rtol * np.sqrt(d) * max(np.linalg.norm(C), np.finfo(float).tiny):
        return None
    return out

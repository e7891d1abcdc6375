"""Symmetric matrix functions by eigendecomposition, in float64.

Matrix square roots are computed from ``numpy.linalg.eigh`` with eigenvalues clipped at a
relative floor, never with ``scipy.linalg.sqrtm`` (which is slower, may return complex
output, and is unstable for near-singular covariances).

``backend`` (default numpy; see :func:`fedalign.backend.get_backend`) runs the same functions
on torch tensors (``torch.linalg.eigh``, the same clipping), on a CPU or a GPU.
"""

from __future__ import annotations

import numpy as np

from fedalign.backend import get_backend

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

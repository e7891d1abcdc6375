"""Labeled GMM barycenter B(α; atoms) of diagonal mixtures (GMM-DaDiL).

Atoms P_a = (1/K) Σ_i N(m_ai, diag v_ai) with soft labels V_ai, a = 1..A, and weights α ∈ Δ_A.
The barycenter has K_B components with uniform weights 1/K_B and is the fixed point of

    π_a   = OT plan (cost c_ij + β_a ‖V_ai − V^B_j‖²) from atom a to the current B,
    m^B_j = Σ_a α_a K_B Σ_i π_a,ij m_ai          (barycentric projection),
    s^B_j = Σ_a α_a K_B Σ_i π_a,ij √v_ai         (standard deviations, not variances),
    V^B_j = Σ_a α_a K_B Σ_i π_a,ij V_ai,

with c_ij the diagonal W2² component cost (:mod:`fedalign.mixture_ot`) and β_a the detached
maximum of atom a's feature cost. For diagonal Gaussians the W2 barycenter of components is
exactly the average of means and of standard deviations, so this is the fixed-point
iteration of mixture-Wasserstein barycenters (Delon & Desolneux 2020) restricted to K_B
components.

The iteration runs without gradients until the relative change of (means, stds, labels) is
≤ tol (or max_iter); a final pass with the plans frozen recomputes B from the inputs so that
gradients flow to α and to the atoms (envelope theorem, as in the paper).

Initialisation is deterministic: component j starts at the α-weighted average of the atoms'
component j mod K (means and stds) with the one-hot label of class j mod C (cyclic class
pattern).

References
----------
E. F. Montesuma, F. M. N. Mboula, A. Souloumiac, "Lighter, Better, Faster Multi-Source Domain
Adaptation with Gaussian Mixture Models and Optimal Transport", ECML-PKDD 2024.
"""

from __future__ import annotations

import numpy as np

from fedalign.errors import FedalignError
from fedalign.mixture_ot import as_tensor, emd_plan, sq_dist_np


def softmax(z: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis by exp / sum (torch.softmax is slow on tiny tensors when
    its thread pool competes for cores)."""
    import torch

    e = torch.exp(z - z.detach().amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def softmax_np(z: np.ndarray) -> np.ndarray:
    """Row softmax over the last axis (numpy)."""
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _plans(means, stds, labels, mB, sB, LB, label_term: bool) -> np.ndarray:
    """OT plans (A, K, K_B) from every atom (uniform weights) to B (uniform weights); numpy."""
    A, K, _ = means.shape
    KB = mB.shape[0]
    wa, wb = np.full(K, 1.0 / K), np.full(KB, 1.0 / KB)
    plans = np.empty((A, K, KB))
    for a in range(A):
        C = sq_dist_np(means[a], mB) + sq_dist_np(stds[a], sB)
        if label_term:
            C = C + C.max() * sq_dist_np(labels[a], LB)
        plans[a] = emd_plan(wa, wb, C)
    return plans


def project_np(alpha, plans, means, stds, labels, KB):
    """B from plans: X^B = K_B Σ_a α_a π_aᵀ X_a for X = means, stds, labels (numpy)."""
    A, K, _ = plans.shape
    P = (plans * (alpha[:, None, None] * KB)).reshape(A * K, KB).T
    return tuple(P @ X.reshape(A * K, X.shape[-1]) for X in (means, stds, labels))


def _project(alpha, plans, means, stds, labels, KB):
    """The same projection in torch (differentiable in α and the atoms, plans constant)."""
    A, K, _ = plans.shape
    P = (as_tensor(plans) * (alpha[:, None, None] * KB)).reshape(A * K, KB).T
    return tuple(P @ X.reshape(A * K, X.shape[-1]) for X in (means, stds, labels))


def barycenter_plans(alpha, M, S, L, n_components: int, tol: float = 1e-6, max_iter: int = 50,
                     label_term: bool = True):
    """The fixed point in numpy (no gradients): the final plans (A, K, K_B) and a record.

    alpha (A,), M / S (A, K, d) means / standard deviations, L (A, K, C) soft labels. The
    barycenter is ``project_np(alpha, plans, M, S, L, K_B)``.
    """
    A, K, _ = M.shape
    C = L.shape[2]
    KB = int(n_components)
    idx = np.arange(KB) % K
    mB = np.einsum("a,ajd->jd", alpha, M[:, idx])
    sB = np.einsum("a,ajd->jd", alpha, S[:, idx])
    LB = np.zeros((KB, C))
    LB[np.arange(KB), np.arange(KB) % C] = 1.0
    it, rel, plans, last = 0, float("inf"), None, None
    for it in range(1, max_iter + 1):
        plans = _plans(M, S, L, mB, sB, LB, label_term)
        if last is not None and np.array_equal(plans, last):
            rel = 0.0          # same plans → same projection: the fixed point is reached
            break
        m2, s2, L2 = project_np(alpha, plans, M, S, L, KB)
        num = ((m2 - mB) ** 2).sum() + ((s2 - sB) ** 2).sum() + ((L2 - LB) ** 2).sum()
        den = (m2**2).sum() + (s2**2).sum() + (L2**2).sum()
        rel = float(np.sqrt(num / max(den, 1e-300)))
        mB, sB, LB, last = m2, s2, L2, plans
        if rel <= tol:
            plans = _plans(M, S, L, mB, sB, LB, label_term)
            break
    return plans, dict(iterations=it, rel_change=rel, converged=rel <= tol)


def _check_shapes(alpha, means, variances, labels):
    if means.ndim != 3 or variances.shape != means.shape or labels.ndim != 3 \
            or labels.shape[:2] != means.shape[:2] or alpha.shape != means.shape[:1]:
        raise FedalignError(
            f"barycenter inputs disagree: alpha {tuple(alpha.shape)}, means {tuple(means.shape)}, "
            f"variances {tuple(variances.shape)}, labels {tuple(labels.shape)}")


def labeled_barycenter(alpha, means, variances, labels, n_components: int | None = None,
                       tol: float = 1e-6, max_iter: int = 50, labels_are_logits: bool = False,
                       label_term: bool = True):
    """Labeled GMM barycenter of A atoms with weights α, differentiable in torch.

    Parameters
    ----------
    alpha : (A,) weights in the simplex (tensor or array; gradients flow)
    means, variances : (A, K, d) atom components (uniform component weights 1/K)
    labels : (A, K, C) soft labels (rows in the simplex), or logits with ``labels_are_logits``
    n_components : K_B (default K)
    tol : relative change ‖ΔB‖ / ‖B‖ at which the fixed point stops
    max_iter : maximum fixed-point iterations
    label_term : include β‖V_i − V_j‖² in the plans (SMW2 matching)

    Returns
    -------
    means (K_B, d), variances (K_B, d), labels (K_B, C) : float64 tensors (differentiable)
    info : dict with iterations, rel_change, converged, plans (A, K, K_B) numpy

    See :func:`labeled_barycenter_np` for the same barycenter without torch.
    """
    alpha, means, variances, labels = (as_tensor(x) for x in (alpha, means, variances, labels))
    _check_shapes(alpha, means, variances, labels)
    if labels_are_logits:
        labels = softmax(labels)
    KB = int(n_components or means.shape[1])
    stds = variances.sqrt()

    plans, info = barycenter_plans(alpha.detach().numpy(), means.detach().numpy(),
                                   stds.detach().numpy(), labels.detach().numpy(), KB, tol,
                                   max_iter, label_term)
    mB, sB, LB = _project(alpha, plans, means, stds, labels, KB)
    return mB, sB**2, LB, dict(info, plans=plans)


def labeled_barycenter_np(alpha, means, variances, labels, n_components: int | None = None,
                          tol: float = 1e-6, max_iter: int = 50, labels_are_logits: bool = False,
                          label_term: bool = True):
    """:func:`labeled_barycenter` in numpy (no gradients, no torch): numpy arrays out."""
    alpha, means, variances, labels = (np.asarray(x, dtype=np.float64)
                                       for x in (alpha, means, variances, labels))
    _check_shapes(alpha, means, variances, labels)
    if labels_are_logits:
        labels = softmax_np(labels)
    KB = int(n_components or means.shape[1])
    stds = np.sqrt(variances)
    plans, info = barycenter_plans(alpha, means, stds, labels, KB, tol, max_iter, label_term)
    mB, sB, LB = project_np(alpha, plans, means, stds, labels, KB)
    return mB, sB**2, LB, dict(info, plans=plans)


def barycenter_gmm(alpha, atoms, n_components: int | None = None, **kw):
    """B(α; atoms) as a numpy :class:`~fedalign.gmm.GMM` (uniform weights, soft labels).

    ``atoms`` is a :class:`~fedalign.dictionary.Atoms` (label logits are softmaxed).
    """
    from fedalign.gmm import GMM

    m, v, L, info = labeled_barycenter_np(alpha, atoms.means, atoms.variances, atoms.label_logits,
                                          n_components, labels_are_logits=True, **kw)
    KB = m.shape[0]
    return GMM(np.full(KB, 1.0 / KB), m, v, L,
               meta=dict(barycenter={k: v for k, v in info.items() if k != "plans"}))

"""Mixture-Wasserstein distances between diagonal GMMs, differentiable in torch.

Component cost (W2² between diagonal Gaussians, Bures term in closed form)

    c_ij = ‖m_i − m_j‖² + ‖√v_i − √v_j‖².

MW2² (Delon & Desolneux 2020) is the exact discrete OT between component weights with cost c:

    MW2²(P, Q) = min_{π ∈ Π(w¹, w²)} Σ_ij π_ij c_ij.

SMW2² (labeled, GMM-DaDiL) adds a label term: c_ij + β ‖V_i − V_j‖², β defaulting to the
(detached) maximum of the feature cost, so that mismatched labels cost as much as the
farthest pair of components.

The plan is solved exactly with POT's network simplex (``ot.emd``) on the detached cost; the
loss Σ π_ij c_ij is then differentiated with π held constant (envelope theorem: at the optimum
the derivative of the OT value w.r.t. the cost is the plan). Gradients flow to means,
variances and labels, not to the weights.

All inputs are torch tensors (or arrays) in float64; nothing changes torch's default dtype.

References
----------
J. Delon and A. Desolneux, "A Wasserstein-type distance in the space of Gaussian mixture
models", SIAM J. Imaging Sciences 13 (2020).
E. F. Montesuma et al., "Lighter, Better, Faster Multi-Source Domain Adaptation with Gaussian
Mixture Models and Optimal Transport", ECML-PKDD 2024.
"""

from __future__ import annotations

import sys

import numpy as np

EMD_MAX_ITER = 1_000_000


def is_tensor(x) -> bool:
    """True for a torch tensor (without importing torch when it is not loaded)."""
    return "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor)


def as_tensor(x) -> torch.Tensor:
    """float64 tensor view of x (tensors keep their autograd graph)."""
    import torch  # lazily: the numpy paths (gossip rounds, consensus) never load it

    if isinstance(x, torch.Tensor):
        return x if x.dtype == torch.float64 else x.to(torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def sq_dist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise squared Euclidean distances (K1, K2) by the matmul expansion, clipped at 0."""
    d = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return d.clamp_min(0.0)


def diag_w2_cost(m1, v1, m2, v2) -> torch.Tensor:
    """W2² between every pair of diagonal Gaussians: (K1, K2).

    c_ij = ‖m1_i − m2_j‖² + ‖√v1_i − √v2_j‖² (m, v of shape (K, d)).
    """
    m1, v1, m2, v2 = (as_tensor(x) for x in (m1, v1, m2, v2))
    return sq_dist(m1, m2) + sq_dist(v1.sqrt(), v2.sqrt())


def _normalized(w) -> np.ndarray:
    w = np.asarray(w.detach().cpu().numpy() if is_tensor(w) else w, dtype=np.float64)
    return w / w.sum()


def mixture_cost(m1, v1, m2, v2, L1=None, L2=None, beta=None) -> torch.Tensor:
    """Ground cost between components: feature W2² plus β‖L1_i − L2_j‖² when both labels given.

    β defaults to max_ij of the detached feature cost (GMM-DaDiL).
    """
    C = diag_w2_cost(m1, v1, m2, v2)
    if L1 is not None and L2 is not None:
        L1, L2 = as_tensor(L1), as_tensor(L2)
        if beta is None:
            beta = float(C.detach().max())
        C = C + beta * sq_dist(L1, L2)
    return C


def _np(x):
    if x is None:
        return None
    return x.detach().cpu().numpy().astype(np.float64, copy=False) if is_tensor(x) \
        else np.asarray(x, dtype=np.float64)


def sq_dist_np(a, b):
    """:func:`sq_dist` in numpy: (K1, K2) squared Euclidean distances, clipped at 0."""
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def mixture_cost_np(m1, v1, m2, v2, L1=None, L2=None, beta=None) -> np.ndarray:
    """:func:`mixture_cost` in numpy (same formula, no autograd)."""
    C = sq_dist_np(m1, m2) + sq_dist_np(np.sqrt(v1), np.sqrt(v2))
    if L1 is not None and L2 is not None:
        C = C + (C.max() if beta is None else float(beta)) * sq_dist_np(L1, L2)
    return C


def emd_plan(w1, w2, C) -> np.ndarray:
    """Exact OT plan (K1, K2) between weights (normalised to sum 1) for a cost (array/tensor)."""
    import ot

    Cn = C.detach().cpu().numpy() if is_tensor(C) else np.asarray(C, np.float64)
    return ot.emd(_normalized(w1), _normalized(w2), np.ascontiguousarray(Cn, dtype=np.float64),
                  numItermax=EMD_MAX_ITER)


def ot_plan(w1, m1, v1, w2, m2, v2, L1=None, L2=None, beta=None) -> np.ndarray:
    """The optimal plan (K1, K2) of :func:`mw2` (numpy float64, rows sum to w1/Σw1)."""
    C = mixture_cost_np(*(_np(x) for x in (m1, v1, m2, v2, L1, L2)), beta=beta)
    return emd_plan(w1, w2, C)


def mw2(w1, m1, v1, w2, m2, v2, L1=None, L2=None, beta=None, return_plan: bool = False):
    """MW2² (or SMW2² when both label matrices are given) between two diagonal GMMs.

    Parameters
    ----------
    w1 : (K1,) weights; m1, v1 : (K1, d) means and variances; L1 : (K1, C) labels or None
    w2, m2, v2, L2 : the same for the second mixture
    beta : label-term weight (default: detached max of the feature cost)
    return_plan : also return the plan (numpy)

    Returns
    -------
    Σ π_ij c_ij with π = argmin: a scalar float64 tensor (plan constant for autograd) when an
    input tensor requires gradients, else a numpy float64 [, plan].
    """
    args = (m1, v1, m2, v2, L1, L2)
    if any(is_tensor(x) and x.requires_grad for x in args) and sys.modules["torch"].is_grad_enabled():
        C = mixture_cost(m1, v1, m2, v2, L1, L2, beta)
        plan = emd_plan(w1, w2, C)
        loss = (as_tensor(plan) * C).sum()
    else:   # nothing to differentiate: numpy (torch is not even imported)
        C = mixture_cost_np(*(_np(x) for x in args), beta=beta)
        plan = emd_plan(w1, w2, C)
        loss = np.float64((plan * C).sum())
    return (loss, plan) if return_plan else loss


def gmm_mw2(p, q, labeled: bool | None = None, beta=None) -> float:
    """MW2² (SMW2² when both are labeled, or ``labeled=True``) between two :class:`~fedalign.gmm.GMM`."""
    use = (p.labels is not None and q.labels is not None) if labeled is None else labeled
    return float(mw2(*(_np(x) for x in (p.weights, p.means, p.variances, q.weights, q.means,
                                        q.variances)),
                     _np(p.labels) if use else None, _np(q.labels) if use else None, beta))

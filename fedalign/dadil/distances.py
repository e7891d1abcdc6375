"""Mixture-Wasserstein distances between diagonal GMMs (numpy).

Component cost (W2² between diagonal Gaussians, Bures term in closed form)

    c_ij = ‖m_i − m_j‖² + ‖√v_i − √v_j‖².

MW2² (Delon & Desolneux 2020) is the exact discrete OT between component weights with cost c:

    MW2²(P, Q) = min_{π ∈ Π(w¹, w²)} Σ_ij π_ij c_ij.

SMW2² (labeled, GMM-DaDiL) adds a label term: c_ij + β ‖V_i − V_j‖², β defaulting to the
maximum of the feature cost, so that mismatched labels cost as much as the farthest pair of
components.

The plan is solved exactly with POT's network simplex (``ot.emd``). Gradients are not taken
here: the losses of dictionary learning differentiate Σ π_ij c_ij with π frozen (envelope
theorem) in closed form (:func:`fedalign.dadil.gradients.domain_loss_and_grads`); the torch
autograd reference the tests compare against lives in ``tests/dadil_torch_reference.py``.

References
----------
J. Delon and A. Desolneux, "A Wasserstein-type distance in the space of Gaussian mixture
models", SIAM J. Imaging Sciences 13 (2020).
E. F. Montesuma et al., "Lighter, Better, Faster Multi-Source Domain Adaptation with Gaussian
Mixture Models and Optimal Transport", ECML-PKDD 2024.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import numpy as np

#: Iteration bound of POT's network simplex.
EMD_MAX_ITER = 1_000_000


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def sq_dist(a, b) -> np.ndarray:
    """Pairwise squared Euclidean distances (K1, K2) by the matmul expansion, clipped at 0."""
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def diag_w2_cost(m1, v1, m2, v2) -> np.ndarray:
    """W2² between every pair of diagonal Gaussians: (K1, K2).

    c_ij = ‖m1_i − m2_j‖² + ‖√v1_i − √v2_j‖² (m, v of shape (K, d)).
    """
    m1, v1, m2, v2 = (_f64(x) for x in (m1, v1, m2, v2))
    return sq_dist(m1, m2) + sq_dist(np.sqrt(v1), np.sqrt(v2))


def mixture_cost(m1, v1, m2, v2, L1=None, L2=None, beta=None) -> np.ndarray:
    """Ground cost between components: feature W2² plus β‖L1_i − L2_j‖² when both labels are
    given.

    β defaults to max_ij of the feature cost (GMM-DaDiL).
    """
    C = diag_w2_cost(m1, v1, m2, v2)
    if L1 is not None and L2 is not None:
        C = C + (C.max() if beta is None else float(beta)) * sq_dist(_f64(L1), _f64(L2))
    return C


@contextlib.contextmanager
def hidden_modules(names):
    """Inside the block, ``import NAME`` raises ImportError for each of ``names`` not imported
    yet (``sys.modules[NAME] = None``); afterwards they are importable again. Modules already
    imported are left alone."""
    hidden = [m for m in names if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None
    try:
        yield hidden
    finally:
        for m in hidden:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]


def _pot():
    """POT's ``ot`` module. In fedalign's CLI processes (``FEDALIGN_POT_LEAN=1``, set by
    ``fedalign.cli.main``) it is imported without its optional scikit-learn and networkx
    integrations (k-means / spectral / Louvain initialisations of POT's low-rank and quantized
    Gromov solvers, which fedalign never calls): ``import ot`` otherwise loads scikit-learn,
    scipy.stats, pandas and networkx, half a second of every DaDiL command. The network
    simplex is the same either way."""
    if "ot" not in sys.modules and os.environ.get("FEDALIGN_POT_LEAN") == "1":
        with hidden_modules(("sklearn", "networkx")):
            import ot  # noqa: F401
    import ot

    return ot


@functools.lru_cache(maxsize=1)
def _emd_plan_only() -> dict:
    """``ot.emd`` options that skip work the plan does not need: centring the dual potentials
    (``center_dual``) and asserting equal masses (``check_marginals``; both weights are
    normalised here). Together ~⅓ of ``ot.emd``'s time on DaDiL's 10-50-atom problems; the
    plan is the network simplex's either way. Options an older POT lacks are not passed."""
    import inspect

    params = inspect.signature(_pot().emd).parameters
    return {k: False for k in ("center_dual", "check_marginals") if k in params}


def emd_plan(w1, w2, C) -> np.ndarray:
    """Exact OT plan (K1, K2) between weights (normalised to sum 1) for a cost matrix."""
    ot = _pot()
    w1, w2 = _f64(w1), _f64(w2)
    return ot.emd(w1 / w1.sum(), w2 / w2.sum(), np.ascontiguousarray(C, dtype=np.float64),
                  numItermax=EMD_MAX_ITER, **_emd_plan_only())


def ot_plan(w1, m1, v1, w2, m2, v2, L1=None, L2=None, beta=None) -> np.ndarray:
    """The optimal plan (K1, K2) of :func:`mw2` (rows sum to w1/Σw1)."""
    return emd_plan(w1, w2, mixture_cost(m1, v1, m2, v2, L1, L2, beta))


def mw2(w1, m1, v1, w2, m2, v2, L1=None, L2=None, beta=None, return_plan: bool = False):
    """MW2² (or SMW2² when both label matrices are given) between two diagonal GMMs.

    Parameters
    ----------
    w1 : (K1,) weights; m1, v1 : (K1, d) means and variances; L1 : (K1, C) labels or None
    w2, m2, v2, L2 : the same for the second mixture
    beta : label-term weight (default: max of the feature cost)
    return_plan : also return the plan

    Returns
    -------
    Σ π_ij c_ij with π = argmin, a numpy float64 [, the plan (K1, K2)].
    """
    C = mixture_cost(m1, v1, m2, v2, L1, L2, beta)
    plan = emd_plan(w1, w2, C)
    loss = np.float64((plan * C).sum())
    return (loss, plan) if return_plan else loss


def gmm_mw2(p, q, labeled: bool | None = None, beta=None) -> float:
    """MW2² (SMW2² when both are labeled, or ``labeled=True``) between two
    :class:`~fedalign.gmm.GMM`."""
    use = (p.labels is not None and q.labels is not None) if labeled is None else labeled
    return float(mw2(p.weights, p.means, p.variances, q.weights, q.means, q.variances,
                     p.labels if use else None, q.labels if use else None, beta))

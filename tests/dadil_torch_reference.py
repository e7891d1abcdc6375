"""Test-only torch autograd references of the DaDiL numpy code (not part of the package).

Production computes every DaDiL gradient in closed form with numpy
(:func:`fedalign.dadil.gradients.domain_loss_and_grads`, plans frozen by the envelope theorem).
The same computations written in torch, differentiated by autograd through the frozen OT
plans, are the reference the gradient tests compare against:

- :func:`mixture_cost`, :func:`mw2` — MW2² / SMW2² (:mod:`fedalign.dadil.distances`);
- :func:`labeled_barycenter` — B(α; atoms) (:mod:`fedalign.dadil.barycenter`), the plans from
  the numpy fixed point, the projection differentiable in α and the atoms;
- :func:`domain_loss` — a domain's loss against its barycenter;
- :func:`loss_grads` — a drop-in for ``fedalign.dadil.dictionary._loss_grads`` (monkeypatched
  in by the tests) so that :func:`fedalign.dadil.dictionary.local_steps` runs on autograd
  gradients.
"""

from __future__ import annotations

import numpy as np
import torch

from fedalign.dadil.barycenter import barycenter_plans, check_shapes
from fedalign.dadil.distances import emd_plan
from fedalign.dadil.gradients import domain_loss_and_grads

PARAMS = ("means", "variances", "label_logits", "alpha")


def as_tensor(x) -> torch.Tensor:
    """float64 tensor view of x (tensors keep their autograd graph)."""
    if isinstance(x, torch.Tensor):
        return x if x.dtype == torch.float64 else x.to(torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def sq_dist(a, b):
    return ((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T).clamp_min(0.0)


def diag_w2_cost(m1, v1, m2, v2):
    m1, v1, m2, v2 = (as_tensor(x) for x in (m1, v1, m2, v2))
    return sq_dist(m1, m2) + sq_dist(v1.sqrt(), v2.sqrt())


def mixture_cost(m1, v1, m2, v2, L1=None, L2=None, beta=None):
    C = diag_w2_cost(m1, v1, m2, v2)
    if L1 is not None and L2 is not None:
        if beta is None:
            beta = float(C.detach().max())
        C = C + beta * sq_dist(as_tensor(L1), as_tensor(L2))
    return C


def mw2(w1, m1, v1, w2, m2, v2, L1=None, L2=None, beta=None, return_plan=False):
    """Σ π c with the exact plan π held constant: a differentiable scalar tensor."""
    C = mixture_cost(m1, v1, m2, v2, L1, L2, beta)
    plan = emd_plan(w1, w2, C.detach().numpy())
    loss = (as_tensor(plan) * C).sum()
    return (loss, plan) if return_plan else loss


def softmax(z):
    e = torch.exp(z - z.detach().amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def labeled_barycenter(alpha, means, variances, labels, n_components=None, tol=1e-6,
                       max_iter=50, labels_are_logits=False, label_term=True):
    """(means, variances, labels) tensors of B(α; atoms), and the numpy plans."""
    alpha, means, variances, labels = (as_tensor(x) for x in (alpha, means, variances, labels))
    check_shapes(alpha, means, variances, labels)
    if labels_are_logits:
        labels = softmax(labels)
    KB = int(n_components or means.shape[1])
    stds = variances.sqrt()
    plans, _ = barycenter_plans(alpha.detach().numpy(), means.detach().numpy(),
                                stds.detach().numpy(), labels.detach().numpy(), KB, tol,
                                max_iter, label_term)
    A, K, _ = plans.shape
    P = (as_tensor(plans) * (alpha[:, None, None] * KB)).reshape(A * K, KB).T
    mB, sB, LB = (P @ X.reshape(A * K, X.shape[-1]) for X in (means, stds, labels))
    return mB, sB**2, LB, plans


def domain_loss(alpha, means, variances, label_logits, gmm, labeled, n_components=None,
                bary_tol=1e-6, bary_max_iter=50):
    """SMW2²(gmm, B(α)) (labeled) or MW2²(gmm, B(α)) as a differentiable scalar tensor."""
    mB, vB, LB, _ = labeled_barycenter(alpha, means, variances, label_logits, n_components,
                                       bary_tol, bary_max_iter, labels_are_logits=True)
    wB = np.full(mB.shape[0], 1.0 / mB.shape[0])
    if labeled:
        return mw2(gmm.weights, gmm.means, gmm.variances, wB, mB, vB, gmm.labels, LB)
    return mw2(gmm.weights, gmm.means, gmm.variances, wB, mB, vB)


def tensors(arrays: dict) -> dict:
    return {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in arrays.items()}


def grads(loss, ts: dict) -> dict:
    names = list(ts)
    gs = torch.autograd.grad(loss, [ts[n] for n in names], allow_unused=True)
    return {n: (np.zeros(tuple(ts[n].shape)) if g is None else g.numpy().copy())
            for n, g in zip(names, gs)}


def loss_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter, want_model):
    """``fedalign.dadil.dictionary._loss_grads`` by torch autograd (the frozen quantities of the
    α rules' model, which involve no gradient, come from the closed form)."""
    t = tensors({k: p[k] for k in PARAMS})
    loss_t = domain_loss(t["alpha"], t["means"], t["variances"], t["label_logits"], gmm,
                         labeled, KB, bary_tol, bary_max_iter)
    g = grads(loss_t, t)
    model = None
    if want_model:
        _, g2, model = domain_loss_and_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter,
                                             return_model=True)
        g["stds"], g["labels"] = g2["stds"], g2["labels"]
    else:
        g["stds"] = g["variances"] * 2 * np.sqrt(p["variances"])
    return float(loss_t.detach()), g, model

"""The loss of one domain against its barycenter, and its gradients in closed form.

The loss of a domain with GMM P_ℓ = (w_i, m_i, v_i, V_i) against B(α_ℓ; atoms) is

    SMW2²(P_ℓ, B(α_ℓ))  for a labeled source,   MW2²(P_ℓ, B(α_ℓ))  for the unlabeled target

(:mod:`fedalign.dadil.distances`). Its gradients w.r.t. the atoms and α are taken with every
OT plan frozen (envelope theorem), where each step is linear or elementwise
(:func:`domain_loss_and_grads`); they equal torch autograd through the same computation
(``tests/dadil_torch_reference.py``, tested). :func:`alpha_model` is the fixed-plan quadratic
model of the loss in α that the α rules of :mod:`fedalign.dadil.optim` minimise.

References
----------
E. F. Montesuma, F. M. N. Mboula, A. Souloumiac, "Lighter, Better, Faster Multi-Source Domain
Adaptation with Gaussian Mixture Models and Optimal Transport", ECML-PKDD 2024.
"""

from __future__ import annotations

import numpy as np

from fedalign.dadil.atoms import Atoms
from fedalign.dadil.barycenter import barycenter_plans, softmax
from fedalign.dadil.distances import emd_plan, sq_dist
from fedalign.errors import FedalignError
from fedalign.gmm import GMM


def domain_loss_and_grads(p: dict, gmm: GMM, labeled: bool, n_components: int | None = None,
                          bary_tol: float = 1e-6, bary_max_iter: int = 50,
                          return_model: bool = False):
    """SMW2²(gmm, B(α)) (``labeled``) or MW2²(gmm, B(α)) and its gradients in closed form.

    With the plans frozen (envelope theorem) every step is linear or elementwise:

        loss = Σ_ij π_ij [‖m_i − mᴮ_j‖² + ‖s_i − sᴮ_j‖² + β‖V_i − Vᴮ_j‖²]
        ∂/∂mᴮ_j = 2 (π_·j mᴮ_j − Σ_i π_ij m_i)    (same for sᴮ, and β· for Vᴮ)
        Xᴮ = K_B Σ_a α_a P_aᵀ X_a  ⇒  ∂/∂X_a = K_B α_a P_a Gᴮ,
                                     ∂/∂α_a = K_B ⟨P_aᵀ X_a, Gᴮ⟩
        s = √v ⇒ ∂/∂v = ∂/∂s / (2s)
        V = softmax(z) ⇒ ∂/∂z = V ⊙ (G − Σ_c G V)

    ``p`` holds numpy ``means``, ``variances``, ``label_logits`` (A, K, ·) and ``alpha`` (A,).
    Returns (loss, grads dict with the same keys plus ``stds`` and ``labels``, ∂/∂s and ∂/∂V
    before the softmax). Equal to torch autograd through the same loss
    (``tests/dadil_torch_reference.py``, tested). With ``return_model`` a third value holds
    the frozen quantities of the fixed-plan quadratic model used by the α rules: ``Y`` (A, K_B, D) =
    K_B P_aᵀ [M_a, S_a, √β L_a], ``T`` (K_B, D) = πᵀ [m, s, √β V] of the domain's GMM,
    ``col`` (K_B,) = π's column sums and ``beta``.
    """
    M, Vr, Z, alpha = p["means"], p["variances"], p["label_logits"], p["alpha"]
    A, K, _ = M.shape
    KB = int(n_components or K)
    S = np.sqrt(Vr)
    L = softmax(Z)
    plans, _ = barycenter_plans(alpha, M, S, L, KB, bary_tol, bary_max_iter)
    PT = plans.transpose(0, 2, 1)
    PX = [np.matmul(PT, X) for X in (M, S, L)]                            # P_aᵀ X_a, (A, K_B, ·)
    mB, sB, LB = (KB * np.tensordot(alpha, P, 1) for P in PX)             # = project(...)
    gm, gs = gmm.means, np.sqrt(gmm.variances)
    C = sq_dist(gm, mB) + sq_dist(gs, sB)
    beta = 0.0
    if labeled:
        beta = float(C.max())
        C = C + beta * sq_dist(gmm.labels, LB)
    pi = emd_plan(gmm.weights, np.full(KB, 1.0 / KB), C)
    loss = float((pi * C).sum())
    col = pi.sum(0)[:, None]
    G = [2 * (col * mB - pi.T @ gm), 2 * (col * sB - pi.T @ gs)]
    G.append(2 * beta * (col * LB - pi.T @ gmm.labels) if labeled else np.zeros_like(LB))
    W = plans * (alpha[:, None, None] * KB)                               # (A, K, K_B)
    gX = [np.matmul(W, g) for g in G]                                      # ∂/∂(M, S, L)
    g_alpha = KB * sum((P * g).sum((1, 2)) for P, g in zip(PX, G))
    gL = gX[2]
    g_z = L * (gL - (gL * L).sum(-1, keepdims=True))
    grads = dict(means=gX[0], variances=gX[1] / (2 * S), label_logits=g_z, alpha=g_alpha,
                 stds=gX[1], labels=gL)
    if not return_model:
        return loss, grads
    rb = np.sqrt(beta)
    Y = KB * np.concatenate([PX[0], PX[1], rb * PX[2]], -1)
    T = np.concatenate([pi.T @ gm, pi.T @ gs, rb * (pi.T @ gmm.labels if labeled
                                                   else np.zeros_like(LB))], -1)
    return loss, grads, dict(Y=Y, T=T, col=col[:, 0], beta=beta)


def check_gmm_vs_atoms(gmm: GMM, atoms: Atoms, labeled: bool) -> None:
    """The domain's GMM must have the atoms' d (and their C for a labeled loss)."""
    if gmm.d != atoms.d:
        raise FedalignError(f"the GMM has d={gmm.d}, the atoms d={atoms.d}")
    if labeled and gmm.labels is None:
        raise FedalignError("a labeled loss needs a GMM with labels")
    if labeled and gmm.labels.shape[1] != atoms.n_classes:
        raise FedalignError(f"the GMM has {gmm.labels.shape[1]} classes, the atoms "
                            f"{atoms.n_classes}")



def alpha_model(model: dict) -> tuple[np.ndarray, np.ndarray]:
    """The fixed-plan quadratic model of the loss in α: (G (A, A), b (A,)).

    With all plans frozen Bᴮ_j(α) = Σ_a α_a Y_aj, so
    loss(α) = const + Σ_j col_j ‖Σ_a α_a Y_aj‖² − 2 Σ_j ⟨T_j, Σ_a α_a Y_aj⟩
            = const + αᵀ G α − 2 bᵀ α,
    G_ab = Σ_j col_j ⟨Y_aj, Y_bj⟩,  b_a = Σ_j ⟨T_j, Y_aj⟩;
    its gradient 2(Gα − b) is ∂loss/∂α of :func:`domain_loss_and_grads`.
    """
    Y, T, col = model["Y"], model["T"], model["col"]
    G = np.einsum("j,ajd,bjd->ab", col, Y, Y)
    b = np.einsum("jd,ajd->a", T, Y)
    return 0.5 * (G + G.T), b

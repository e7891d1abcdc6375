"""GMM dataset-dictionary learning (GMM-DaDiL): atoms, barycentric weights, local steps.

A dictionary is A labeled diagonal GMMs (atoms) with K components each: means (A, K, d),
variances (A, K, d) ≥ a floor and label logits (A, K, C) (labels = softmax of the logits).
Every domain ℓ is represented by weights α_ℓ ∈ Δ_A and its barycenter B(α_ℓ; atoms)
(:mod:`fedalign.gmm_barycenter`). The loss of a domain with GMM P_ℓ is

    SMW2²(P_ℓ, B(α_ℓ))   for a labeled source,   MW2²(P_ℓ, B(α_ℓ))   for the unlabeled target,

and centralized learning minimises MW2²(P_T, B(α_T)) + Σ_s SMW2²(P_s, B(α_s)) over atoms and
all α. :func:`local_steps` is one client's share of that loop (the decentralized rounds of
:mod:`fedalign.gossip`); gradients come from :func:`domain_loss_and_grads`, the closed form of
the envelope-theorem gradient (plans frozen), equal to torch autograd (``backend="torch"``).

How scale enters (the ``fedalign`` preset, :data:`PRESETS`)
    Frozen CNN features have per-dimension spreads of 1e-3 to 1 and many exact zeros; an
    absolute learning rate and variance floor therefore mean different things on every
    dataset (Adam lr 0.1 broke DeFed on 1280-d features; min_var 1e-6 left half of the GMM
    variances at the floor). Nothing here has an absolute scale:

    - the atoms move by projected gradient descent preconditioned by the curvature of the
      loss in the barycenter's component parameters, (2/K_B) I: a step removes a fraction
      ``lr`` · α_a of each component's residual (:func:`gd_update`), in (mean, standard
      deviation) coordinates, where the diagonal W2 cost is Euclidean;
    - α moves by a damped projected Newton step on the fixed-plan quadratic model of the loss
      (:func:`alpha_update`): Adam's per-coordinate steps are equal when all components of
      ∇α share one sign (95 % of the steps on Office-Caltech10, a common part ≈ 2700 against
      differences ≈ 30), and the simplex projection then removes them, so α never moved;
    - variances are floored at 1 % of the domain's own per-dimension data variance;
    - atoms start around the domain's own data (mean and per-dimension spread of its GMM).

    Features multiplied by s and shifted by c give atoms multiplied by s and shifted by c and
    the same α (tested). The step sizes (lr 0.2, lr_alpha 0.25, with 5 local steps) were chosen
    on the quick-start demo digits (``fedalign demo-data``: ink, neon, blocky; seed 0) among
    lr ∈ {0.2, 0.5} × lr_alpha ∈ {0.1, 0.25, 0.5}, never on a reported benchmark.

The ``reference`` preset keeps the GMM-DaDiL reference code's optimiser (``torch.optim.Adam``
with lr 0.1 on means, variances, label logits and α, α projected onto the simplex and
variances clipped at min_var 0.05 after every step, atoms started at N(0, I), variance 1).
Known differences to that code: float64 instead of float32; no ReduceLROnPlateau schedule;
Adam restarted at every call of :func:`local_steps` (one communication round), as the FedDaDiL
reference restarts its optimiser every round.

References
----------
E. F. Montesuma, F. M. N. Mboula, A. Souloumiac, "Lighter, Better, Faster Multi-Source Domain
Adaptation with Gaussian Mixture Models and Optimal Transport", ECML-PKDD 2024.
J. Duchi et al., "Efficient projections onto the l1-ball for learning in high dimensions",
ICML 2008 (simplex projection).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedalign.errors import FedalignError
from fedalign.gmm import GMM
from fedalign.gmm_barycenter import barycenter_plans, labeled_barycenter, project_np, softmax_np
from fedalign.mixture_ot import emd_plan, mw2, sq_dist_np

PARAMS = ("means", "variances", "label_logits", "alpha")
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass
class Atoms:
    """Dictionary atoms (numpy float64).

    Attributes
    ----------
    means : (A, K, d)
    variances : (A, K, d), ≥ min_var
    label_logits : (A, K, C); labels = softmax over C
    """

    means: np.ndarray
    variances: np.ndarray
    label_logits: np.ndarray

    def __post_init__(self):
        self.means = np.asarray(self.means, dtype=np.float64)
        self.variances = np.asarray(self.variances, dtype=np.float64)
        self.label_logits = np.asarray(self.label_logits, dtype=np.float64)
        if self.means.ndim != 3 or self.variances.shape != self.means.shape \
                or self.label_logits.ndim != 3 or self.label_logits.shape[:2] != self.means.shape[:2]:
            raise FedalignError(
                f"atom shapes disagree: means {self.means.shape}, variances "
                f"{self.variances.shape}, label logits {self.label_logits.shape}")

    @property
    def n_atoms(self) -> int:
        return int(self.means.shape[0])

    @property
    def n_components(self) -> int:
        return int(self.means.shape[1])

    @property
    def d(self) -> int:
        return int(self.means.shape[2])

    @property
    def n_classes(self) -> int:
        return int(self.label_logits.shape[2])

    @property
    def labels(self) -> np.ndarray:
        """Soft labels softmax(label_logits): (A, K, C)."""
        return softmax_np(self.label_logits)

    def copy(self) -> "Atoms":
        return Atoms(self.means.copy(), self.variances.copy(), self.label_logits.copy())


def init_atoms(n_atoms: int, n_components: int, d: int, n_classes: int, seed=0,
               center=None, scale=None) -> Atoms:
    """Fresh atoms, seeded: means center + scale ⊙ ε (ε ~ N(0, I)), variances scale², zero
    label logits (uniform labels).

    ``center`` / ``scale`` are scalars or (d,) arrays (default 0 and 1: means ~ N(0, I),
    variances 1). ``seed`` is anything :func:`numpy.random.default_rng` takes (an int, a
    :class:`numpy.random.SeedSequence`).
    """
    rng = np.random.default_rng(seed)
    shape = (int(n_atoms), int(n_components), int(d))
    c = np.zeros(int(d)) if center is None else np.broadcast_to(np.asarray(center, np.float64), (int(d),))
    sc = np.ones(int(d)) if scale is None else np.broadcast_to(np.asarray(scale, np.float64), (int(d),))
    return Atoms(c + sc * rng.standard_normal(shape), np.broadcast_to(sc**2, shape).copy(),
                 np.zeros((int(n_atoms), int(n_components), int(n_classes))))


def init_atoms_from_gmms(gmms, n_atoms: int, n_components: int, n_classes: int, seed: int = 0,
                         noise: float = 0.1) -> Atoms:
    """Atoms started from labeled GMMs: atom a copies the components of gmms[a mod len]
    (cycled or cut to K), plus noise·std jitter on the means; labels from their labels."""
    rng = np.random.default_rng(seed)
    M, V, L = [], [], []
    for a in range(int(n_atoms)):
        g = gmms[a % len(gmms)]
        idx = np.arange(int(n_components)) % g.K
        std = np.sqrt(g.variances[idx])
        M.append(g.means[idx] + noise * std * rng.standard_normal(std.shape))
        V.append(g.variances[idx])
        lab = g.labels[idx] if g.labels is not None else np.full((len(idx), n_classes), 1 / n_classes)
        L.append(np.log(np.clip(lab, 1e-3, None)))
    return Atoms(np.stack(M), np.stack(V), np.stack(L))


def project_simplex(v) -> np.ndarray:
    """Euclidean projection onto the probability simplex {x ≥ 0, Σ x = 1} (Duchi et al. 2008).

    Works on the last axis of an array of any shape.
    """
    v = np.asarray(v, dtype=np.float64)
    u = np.sort(v, axis=-1)[..., ::-1]
    css = np.cumsum(u, axis=-1) - 1.0
    ind = np.arange(1, v.shape[-1] + 1)
    cond = u - css / ind > 0
    rho = cond.shape[-1] - 1 - np.argmax(cond[..., ::-1], axis=-1)
    theta = np.take_along_axis(css, rho[..., None], -1) / (rho[..., None] + 1.0)
    return np.maximum(v - theta, 0.0)


# --------------------------------------------------------------------------------------------
# Adam with numpy state
# --------------------------------------------------------------------------------------------


@dataclass
class AdamState:
    """Adam moments per parameter (numpy float64) and the step count.

    ``to_arrays()`` / ``from_arrays()`` give flat ``{"adam_<param>_exp_avg": ...,
    "adam_step": ...}`` dicts suitable for an ``.npz`` file.
    """

    exp_avg: dict = field(default_factory=dict)
    exp_avg_sq: dict = field(default_factory=dict)
    step: int = 0

    def to_arrays(self, prefix: str = "adam_") -> dict:
        out = {f"{prefix}step": np.int64(self.step)}
        for name in sorted(self.exp_avg):
            out[f"{prefix}{name}_exp_avg"] = np.asarray(self.exp_avg[name], dtype=np.float64)
            out[f"{prefix}{name}_exp_avg_sq"] = np.asarray(self.exp_avg_sq[name], dtype=np.float64)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict, prefix: str = "adam_") -> "AdamState":
        st = cls(step=int(arrays.get(f"{prefix}step", 0)))
        for key, val in arrays.items():
            if key.startswith(prefix) and key.endswith("_exp_avg"):
                name = key[len(prefix):-len("_exp_avg")]
                st.exp_avg[name] = np.asarray(val, dtype=np.float64)
                st.exp_avg_sq[name] = np.asarray(arrays[f"{prefix}{name}_exp_avg_sq"],
                                                 dtype=np.float64)
        return st


def adam_update(params: dict, grads: dict, state: AdamState, lr: float) -> AdamState:
    """One Adam step in place on numpy ``params`` (torch.optim.Adam's update, no weight decay).

    m ← β1 m + (1−β1) g,  s ← β2 s + (1−β2) g²,
    p ← p − lr · (m / (1−β1^t)) / (√(s / (1−β2^t)) + ε).
    A parameter whose state has a different shape (new atoms shape) restarts its moments.
    """
    b1, b2 = ADAM_BETAS
    state.step += 1
    t = state.step
    for name, p in params.items():
        g = grads[name]
        m = state.exp_avg.get(name)
        if m is None or m.shape != p.shape:
            m, s = np.zeros_like(p), np.zeros_like(p)
        else:
            s = state.exp_avg_sq[name]
        m = b1 * m + (1 - b1) * g
        s = b2 * s + (1 - b2) * g * g
        state.exp_avg[name], state.exp_avg_sq[name] = m, s
        p -= lr * (m / (1 - b1**t)) / (np.sqrt(s / (1 - b2**t)) + ADAM_EPS)
    return state


# --------------------------------------------------------------------------------------------
# Losses and steps
# --------------------------------------------------------------------------------------------


def domain_loss(alpha: torch.Tensor, means, variances, label_logits, gmm: GMM, labeled: bool,
                n_components: int | None = None, bary_tol: float = 1e-6, bary_max_iter: int = 50):
    """SMW2²(gmm, B(α)) (labeled) or MW2²(gmm, B(α)) as a differentiable scalar tensor."""
    mB, vB, LB, info = labeled_barycenter(alpha, means, variances, label_logits, n_components,
                                          tol=bary_tol, max_iter=bary_max_iter,
                                          labels_are_logits=True)
    wB = np.full(mB.shape[0], 1.0 / mB.shape[0])
    if labeled:
        return mw2(gmm.weights, gmm.means, gmm.variances, wB, mB, vB, gmm.labels, LB), info
    return mw2(gmm.weights, gmm.means, gmm.variances, wB, mB, vB), info


def domain_loss_and_grads(p: dict, gmm: GMM, labeled: bool, n_components: int | None = None,
                          bary_tol: float = 1e-6, bary_max_iter: int = 50,
                          return_model: bool = False):
    """The loss of :func:`domain_loss` and its gradients in closed form (numpy, no autograd).

    With the plans frozen (envelope theorem) every step is linear or elementwise:

        loss = Σ_ij π_ij [‖m_i − mᴮ_j‖² + ‖s_i − sᴮ_j‖² + β‖V_i − Vᴮ_j‖²]
        ∂/∂mᴮ_j = 2 (π_·j mᴮ_j − Σ_i π_ij m_i)    (same for sᴮ, and β· for Vᴮ)
        Xᴮ = K_B Σ_a α_a P_aᵀ X_a  ⇒  ∂/∂X_a = K_B α_a P_a Gᴮ,  ∂/∂α_a = K_B ⟨P_aᵀ X_a, Gᴮ⟩
        s = √v ⇒ ∂/∂v = ∂/∂s / (2s);  V = softmax(z) ⇒ ∂/∂z = V ⊙ (G − Σ_c G V)

    ``p`` holds numpy ``means``, ``variances``, ``label_logits`` (A, K, ·) and ``alpha`` (A,).
    Returns (loss, grads dict with the same keys plus ``stds`` and ``labels``, ∂/∂s and ∂/∂V
    before the softmax). Equal to torch autograd
    through :func:`domain_loss` (tested). With ``return_model`` a third value holds the frozen
    quantities of the fixed-plan quadratic model used by the α rules: ``Y`` (A, K_B, D) =
    K_B P_aᵀ [M_a, S_a, √β L_a], ``T`` (K_B, D) = πᵀ [m, s, √β V] of the domain's GMM,
    ``col`` (K_B,) = π's column sums and ``beta``.
    """
    M, Vr, Z, alpha = p["means"], p["variances"], p["label_logits"], p["alpha"]
    A, K, _ = M.shape
    KB = int(n_components or K)
    S = np.sqrt(Vr)
    L = softmax_np(Z)
    plans, _ = barycenter_plans(alpha, M, S, L, KB, bary_tol, bary_max_iter)
    mB, sB, LB = project_np(alpha, plans, M, S, L, KB)
    gm, gs = gmm.means, np.sqrt(gmm.variances)
    C = sq_dist_np(gm, mB) + sq_dist_np(gs, sB)
    beta = 0.0
    if labeled:
        beta = float(C.max())
        C = C + beta * sq_dist_np(gmm.labels, LB)
    pi = emd_plan(gmm.weights, np.full(KB, 1.0 / KB), C)
    loss = float((pi * C).sum())
    col = pi.sum(0)[:, None]
    G = [2 * (col * mB - pi.T @ gm), 2 * (col * sB - pi.T @ gs)]
    G.append(2 * beta * (col * LB - pi.T @ gmm.labels) if labeled else np.zeros_like(LB))
    W = plans * (alpha[:, None, None] * KB)                               # (A, K, K_B)
    gX = [np.matmul(W, g) for g in G]                                      # ∂/∂(M, S, L)
    PT = plans.transpose(0, 2, 1)
    g_alpha = KB * sum((np.matmul(PT, X) * g).sum((1, 2)) for X, g in zip((M, S, L), G))
    gL = gX[2]
    g_z = L * (gL - (gL * L).sum(-1, keepdims=True))
    grads = dict(means=gX[0], variances=gX[1] / (2 * S), label_logits=g_z, alpha=g_alpha,
                 stds=gX[1], labels=gL)
    if not return_model:
        return loss, grads
    rb = np.sqrt(beta)
    Y = KB * np.concatenate([np.matmul(PT, M), np.matmul(PT, S), rb * np.matmul(PT, L)], -1)
    T = np.concatenate([pi.T @ gm, pi.T @ gs, rb * (pi.T @ gmm.labels if labeled
                                                   else np.zeros_like(LB))], -1)
    return loss, grads, dict(Y=Y, T=T, col=col[:, 0], beta=beta)


def _check_gmm_vs_atoms(gmm: GMM, atoms: Atoms, labeled: bool):
    if gmm.d != atoms.d:
        raise FedalignError(f"the GMM has d={gmm.d}, the atoms d={atoms.d}")
    if labeled and gmm.labels is None:
        raise FedalignError("a labeled loss needs a GMM with labels")
    if labeled and gmm.labels.shape[1] != atoms.n_classes:
        raise FedalignError(f"the GMM has {gmm.labels.shape[1]} classes, the atoms "
                            f"{atoms.n_classes}")


def _check_backend(backend):
    if backend not in ("numpy", "torch"):
        raise FedalignError(f"backend must be 'numpy' or 'torch', got {backend!r}")


def _tensors(arrays: dict) -> dict:
    import torch

    return {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in arrays.items()}


def _grads(loss, tensors: dict) -> dict:
    import torch

    names = list(tensors)
    gs = torch.autograd.grad(loss, [tensors[n] for n in names], allow_unused=True)
    return {n: (np.zeros(tuple(tensors[n].shape)) if g is None else g.numpy().copy())
            for n, g in zip(names, gs)}


# --------------------------------------------------------------------------------------------
# Optimisation: presets, the mass-preconditioned gradient step, Adam, the α rules
# --------------------------------------------------------------------------------------------

OPTIMIZERS = ("gd", "adam")
#: Smallest label probability kept when labels are stored as logits.
LABEL_FLOOR = 1e-12
ALPHA_RULES = ("newton", "projected", "eg")


@dataclass(frozen=True)
class Optim:
    """How one domain's local steps move the atoms and its α.

    Attributes
    ----------
    optimizer : ``"gd"`` — projected gradient descent preconditioned by the curvature of the
        loss in the barycenter's component parameters (scale-free, the default), or ``"adam"``
        — torch.optim.Adam's update with an absolute learning rate, restarted at every call
        (the FedDaDiL reference restarts its optimiser every round).
    lr : gd: fraction of the residual a step removes (see :func:`gd_update`); adam: the
        absolute step per coordinate.
    alpha_rule : ``"newton"`` (damped projected Newton step on the fixed-plan quadratic model,
        the default), ``"projected"`` (projected gradient; with Adam the reference's Adam step
        on α followed by the Euclidean projection onto the simplex) or ``"eg"`` (normalised
        exponentiated gradient).
    lr_alpha : step of the α rule (newton: damping in (0, 1]; eg: largest change of log α).
    var_floor : variance floor, a scalar or (d,) per dimension, applied after every step.
    """

    optimizer: str = "gd"
    lr: float = 0.5
    alpha_rule: str = "newton"
    lr_alpha: float = 0.5
    var_floor: object = 1e-6

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise FedalignError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, "
                                f"got {self.optimizer!r}")
        if self.alpha_rule not in ALPHA_RULES:
            raise FedalignError(f"alpha rule must be one of {', '.join(ALPHA_RULES)}, "
                                f"got {self.alpha_rule!r}")
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise FedalignError(f"learning rate must be > 0, got {self.lr}")
        if not (np.isfinite(self.lr_alpha) and self.lr_alpha > 0):
            raise FedalignError(f"alpha learning rate must be > 0, got {self.lr_alpha}")
        fl = np.asarray(self.var_floor, dtype=np.float64)
        if not np.all(np.isfinite(fl)) or np.any(fl <= 0):
            raise FedalignError("variance floor must be finite and > 0")


#: Named settings. ``fedalign`` (default): scale-free gradient steps, α by projected Newton,
#: variance floor 1 % of the client's per-dimension data variance, atoms started around the
#: client's own data. ``reference``: the GMM-DaDiL reference code's optimiser (Adam lr 0.1 on
#: every parameter, α projected onto the simplex after each Adam step, min_var 0.05), with
#: atoms started at N(0, I), variance 1.
PRESETS = {
    "fedalign": dict(optimizer="gd", lr=0.2, alpha_rule="newton", lr_alpha=0.25,
                     var_floor_rel=1e-2, min_var=None, init="data", target_atoms=False),
    "reference": dict(optimizer="adam", lr=0.1, alpha_rule="projected", lr_alpha=0.1,
                      var_floor_rel=None, min_var=0.05, init="normal", target_atoms=True),
}


def data_moments(gmm: GMM) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and variance of a diagonal mixture: (d,), (d,).

    μ = Σ_k w_k m_k,  σ² = Σ_k w_k (v_k + m_k²) − μ²  (clipped at 0).
    """
    w = gmm.weights / gmm.weights.sum()
    mu = w @ gmm.means
    var = w @ (gmm.variances + gmm.means**2) - mu**2
    return mu, np.maximum(var, 0.0)


def relative_floor(gmm: GMM, rel: float) -> np.ndarray:
    """Variance floor rel · σ²_d per dimension from the domain's own GMM (d,)
    (:func:`fedalign.gmm.floor_from_variance` of :func:`data_moments`)."""
    from fedalign.gmm import floor_from_variance

    return floor_from_variance(data_moments(gmm)[1], rel)


def gd_update(p: dict, grads: dict, KB: int, beta: float, lr: float, var_floor) -> None:
    """One mass-preconditioned gradient step on the atoms, in place.

    The loss is Σ_ij π_ij c_ij with barycenter components of mass 1/K_B, so its Hessian in a
    component's mean or standard deviation is (2/K_B) I (and 2β/K_B for labels). Scaling
    the gradient by its inverse gives, for a matched atom component,

        Δm_ai = −lr · α_a · (mᴮ_j − t_j),   t_j = K_B Σ_l π_lj m_l (its barycentric target),

    the same for the standard deviations s = √v (the W2 cost is Euclidean in (m, s)) and for
    the soft labels V (β‖·‖², Hessian 2β/K_B), which are then projected back onto the simplex
    and stored as logits log max(V, 1e-12). (A step on the logits instead is damped by the
    softmax Jacobian V(1 − V): with C = 10 classes the labels stayed within 0.05 of uniform
    after 150 steps.) The step is a fraction of the residual:
    independent of the features' scale, and with Σ_a α_a² ≤ 1 it never overshoots for lr ≤ 1.
    Standard deviations are then floored at √var_floor.
    """
    pre = 0.5 * KB * float(lr)
    p["means"] -= pre * grads["means"]
    S = np.sqrt(p["variances"]) - pre * grads["stds"]
    p["variances"] = np.maximum(S, 0.0) ** 2
    np.maximum(p["variances"], var_floor, out=p["variances"])
    if beta > 0:   # the same step on the labels V themselves, kept in the simplex
        V = project_simplex(softmax_np(p["label_logits"]) - pre / beta * grads["labels"])
        p["label_logits"] = np.log(np.maximum(V, LABEL_FLOOR))


def _qp_simplex(G: np.ndarray, b: np.ndarray, x0: np.ndarray, n_iter: int = 500,
                tol: float = 1e-12) -> np.ndarray:
    """argmin_{x ∈ Δ} xᵀ G x − 2 bᵀ x by accelerated projected gradient (FISTA), G ⪰ 0."""
    lam = float(np.linalg.eigvalsh(G)[-1]) if G.size else 0.0
    if not lam > 0:
        return x0
    step = 1.0 / (2.0 * lam)
    x, y, t = x0.copy(), x0.copy(), 1.0
    for _ in range(int(n_iter)):
        x_new = project_simplex(y - step * (2.0 * (G @ y) - 2.0 * b))
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        y = x_new + ((t - 1.0) / t_new) * (x_new - x)
        done = np.abs(x_new - x).max() <= tol
        x, t = x_new, t_new
        if done:
            break
    return x


def alpha_model(model: dict) -> tuple[np.ndarray, np.ndarray]:
    """The fixed-plan quadratic model of the loss in α: (G (A, A), b (A,)).

    With all plans frozen Bᴮ_j(α) = Σ_a α_a Y_aj, so
    loss(α) = const + Σ_j col_j ‖Σ_a α_a Y_aj‖² − 2 Σ_j ⟨T_j, Σ_a α_a Y_aj⟩
            = const + αᵀ G α − 2 bᵀ α,  G_ab = Σ_j col_j ⟨Y_aj, Y_bj⟩,  b_a = Σ_j ⟨T_j, Y_aj⟩;
    its gradient 2(Gα − b) is ∂loss/∂α of :func:`domain_loss_and_grads`.
    """
    Y, T, col = model["Y"], model["T"], model["col"]
    G = np.einsum("j,ajd,bjd->ab", col, Y, Y)
    b = np.einsum("jd,ajd->a", T, Y)
    return 0.5 * (G + G.T), b


def alpha_update(alpha: np.ndarray, g_alpha: np.ndarray, model: dict | None, rule: str,
                 lr_alpha: float) -> np.ndarray:
    """A new α ∈ Δ_A (not in place).

    ``newton``: α* = argmin_Δ of the fixed-plan model (:func:`alpha_model`), α ← α + η(α* − α);
    ``projected``: projected gradient with the model's curvature as step,
    α ← Π_Δ(α − η ∇/(2 λ_max(G)));
    ``eg``: normalised exponentiated gradient, g̃ = g − ⟨α, g⟩,
    α ← α ⊙ exp(−η g̃ / max|g̃|) / Z.
    All three are invariant to the scale of the features: the common part of ∇α (which the
    simplex constraint removes) does not produce a step, unlike per-coordinate Adam steps.
    """
    if rule not in ALPHA_RULES:
        raise FedalignError(f"alpha rule must be one of {', '.join(ALPHA_RULES)}, got {rule!r}")
    eta = float(lr_alpha)
    if rule == "eg":
        gt = g_alpha - alpha @ g_alpha
        m = np.abs(gt).max()
        if not m > 0:
            return alpha.copy()
        a = alpha * np.exp(-eta * gt / m)
        return a / a.sum()
    G, b = alpha_model(model)
    if rule == "newton":
        star = _qp_simplex(G, b, alpha)
        return project_simplex(alpha + min(eta, 1.0) * (star - alpha))
    lam = float(np.linalg.eigvalsh(G)[-1])
    if not lam > 0:
        return alpha.copy()
    return project_simplex(alpha - eta * g_alpha / (2.0 * lam))


def _loss_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter, backend, want_model):
    """(loss, grads, model) by the closed form (numpy) or torch autograd (test reference)."""
    if backend == "numpy":
        out = domain_loss_and_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter,
                                    return_model=want_model)
        return out if want_model else (*out, None)
    t = _tensors({k: p[k] for k in PARAMS})
    loss_t, _ = domain_loss(t["alpha"], t["means"], t["variances"], t["label_logits"], gmm,
                            labeled, KB, bary_tol, bary_max_iter)
    grads = _grads(loss_t, t)
    model = None
    if want_model:   # the frozen quantities come from the closed form (no gradient involved)
        _, g2, model = domain_loss_and_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter,
                                             return_model=True)
        grads["stds"], grads["labels"] = g2["stds"], g2["labels"]
    else:
        grads["stds"] = grads["variances"] * 2 * np.sqrt(p["variances"])
    return float(loss_t.detach()), grads, model


def local_steps(atoms: Atoms, alpha, gmm: GMM, n_steps: int, optim: Optim | None = None,
                labeled: bool | None = None, n_components_barycenter: int | None = None,
                bary_tol: float = 1e-6, bary_max_iter: int = 50, backend: str = "numpy",
                update_atoms: bool = True):
    """E local steps of one domain on its loss w.r.t. the atoms and its α.

    Parameters
    ----------
    atoms : current atoms (not modified)
    alpha : (A,) barycentric weights in the simplex
    gmm : the domain's GMM
    n_steps : E
    optim : :class:`Optim` (default ``Optim()``: scale-free gradient steps, α by Newton).
        Adam's moments start fresh at every call (one call = one round's local steps).
    labeled : SMW2² if True, MW2² if False (default: whether ``gmm`` has labels)
    n_components_barycenter : K_B (default: the atoms' K)
    backend : "numpy" (closed-form gradients, :func:`domain_loss_and_grads`) or "torch"
        (autograd through :func:`domain_loss`); both give the same steps
    update_atoms : False keeps the atoms fixed and moves α only

    Returns
    -------
    atoms : new :class:`Atoms`
    alpha : (A,) new weights
    record : dict with ``losses`` (E floats, the loss *before* each step), ``alpha`` (E + 1
        weight vectors), ``step_mean`` / ``step_std`` (RMS change of the atoms' means and
        standard deviations per step)
    """
    optim = Optim() if optim is None else optim
    labeled = gmm.labels is not None if labeled is None else bool(labeled)
    _check_gmm_vs_atoms(gmm, atoms, labeled)
    _check_backend(backend)
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.shape != (atoms.n_atoms,):
        raise FedalignError(f"alpha has shape {alpha.shape}, expected ({atoms.n_atoms},)")
    KB = int(n_components_barycenter or atoms.n_components)
    floor = np.asarray(optim.var_floor, dtype=np.float64)
    p = dict(means=atoms.means.copy(), variances=np.maximum(atoms.variances, floor),
             label_logits=atoms.label_logits.copy(), alpha=project_simplex(alpha))
    adam = AdamState()
    want_model = not (optim.optimizer == "adam" and optim.alpha_rule == "projected")
    rec = dict(losses=[], alpha=[p["alpha"].tolist()], step_mean=[], step_std=[])
    for _ in range(int(n_steps)):
        loss, grads, model = _loss_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter, backend,
                                         want_model)
        rec["losses"].append(loss)
        old_m, old_v = p["means"].copy(), p["variances"].copy()
        if optim.optimizer == "adam":
            names = ("means", "variances", "label_logits") if update_atoms else ()
            if optim.alpha_rule == "projected":
                names += ("alpha",)
            adam_update({k: p[k] for k in names}, grads, adam, optim.lr)
            np.maximum(p["variances"], floor, out=p["variances"])
            p["alpha"] = project_simplex(p["alpha"])
        elif update_atoms:
            gd_update(p, grads, KB, model["beta"], optim.lr, floor)
        if not (optim.optimizer == "adam" and optim.alpha_rule == "projected"):
            p["alpha"] = alpha_update(p["alpha"], grads["alpha"], model, optim.alpha_rule,
                                      optim.lr_alpha)
        rec["alpha"].append(p["alpha"].tolist())
        rec["step_mean"].append(float(np.sqrt(np.mean((p["means"] - old_m) ** 2))))
        rec["step_std"].append(float(np.sqrt(np.mean((np.sqrt(p["variances"])
                                                      - np.sqrt(old_v)) ** 2))))
    return Atoms(p["means"], p["variances"], p["label_logits"]), p["alpha"], rec


#: Step halvings of :func:`fit_alpha`'s descent safeguard.
MAX_HALVINGS = 8


def fit_alpha(atoms: Atoms, gmm: GMM, n_steps: int = 100, labeled: bool | None = None,
              alpha0=None, rule: str = "projected", lr_alpha: float | None = None,
              tol: float = 1e-9, n_components_barycenter: int | None = None):
    """Fit barycentric weights alone, the atoms fixed: argmin_{α ∈ Δ} MW2²(Q, B(α; atoms)).

    Used by the barycentric-envelope study (GMM-DaDiL, Section 5.2) and by the target's
    final weights. Each iteration recomputes the plans at the current α and takes one step of
    ``rule`` (:func:`alpha_update`; ``lr_alpha`` default 1 for projected/newton, 0.1 for eg),
    halved until the loss does not increase (the barycenter's plans, hence the loss, jump as
    α moves, so a step of the fixed-plan model can go uphill); no descending step within
    :data:`MAX_HALVINGS` halvings ends the fit as stationary.

    Returns
    -------
    alpha : (A,)
    record : dict with ``losses``, ``alphas``, ``iterations``, ``converged`` (max |Δα| ≤ tol)
    """
    labeled = gmm.labels is not None if labeled is None else bool(labeled)
    _check_gmm_vs_atoms(gmm, atoms, labeled)
    if rule not in ALPHA_RULES:
        raise FedalignError(f"alpha rule must be one of {', '.join(ALPHA_RULES)}, got {rule!r}")
    if int(n_steps) < 1:
        raise FedalignError(f"the number of steps must be ≥ 1, got {n_steps}")
    A = atoms.n_atoms
    alpha = project_simplex(np.full(A, 1.0 / A) if alpha0 is None
                            else np.asarray(alpha0, dtype=np.float64))
    eta = (0.1 if rule == "eg" else 1.0) if lr_alpha is None else float(lr_alpha)
    KB = int(n_components_barycenter or atoms.n_components)
    p = dict(means=atoms.means, variances=atoms.variances, label_logits=atoms.label_logits)

    def model_at(a):
        return domain_loss_and_grads(dict(p, alpha=a), gmm, labeled, KB, return_model=True)

    loss, grads, model = model_at(alpha)
    losses, alphas, converged, it = [loss], [alpha.tolist()], False, 0
    for it in range(1, int(n_steps) + 1):
        step = alpha_update(alpha, grads["alpha"], model, rule, eta) - alpha
        for _ in range(MAX_HALVINGS):     # the plans change with α: keep only descent steps
            out = model_at(alpha + step)
            if out[0] <= loss:
                break
            step = 0.5 * step
        else:
            converged = True              # no descent along the rule's direction: stationary
            break
        change = float(np.abs(step).max())
        alpha = project_simplex(alpha + step)
        loss, grads, model = out
        losses.append(loss)
        alphas.append(alpha.tolist())
        if change <= tol:
            converged = True
            break
    final = loss
    return alpha, dict(losses=losses, alphas=alphas, iterations=it, converged=converged,
                       loss=final)


def learn_dictionary(gmms: list, target_index: int, n_atoms: int = 3, n_iter: int = 100,
                     optim: Optim | None = None, seed: int = 0, n_components: int | None = None,
                     init: str = "data", atoms: Atoms | None = None, var_floor_rel: float | None = 1e-2,
                     bary_tol: float = 1e-6, bary_max_iter: int = 50, callback=None,
                     backend: str = "numpy"):
    """Centralized GMM-DaDiL: learn atoms and every domain's α jointly.

    Loss MW2²(P_T, B(α_T)) + Σ_{s ≠ T} SMW2²(P_s, B(α_s)). ``gd``: every iteration each
    domain computes its preconditioned step (:func:`gd_update`) and the atoms move by their
    mean (the centralized counterpart of the clients' local steps); each α_ℓ moves by its
    domain's α rule. ``adam``: one Adam step on the summed loss (the reference), α projected.

    Parameters
    ----------
    gmms : list of GMM, one per domain; sources labeled, gmms[target_index] used unlabeled
    target_index : index of the target domain
    n_atoms : A
    n_iter : iterations
    optim : :class:`Optim` (its ``var_floor`` is replaced by ``var_floor_rel`` × the pooled
        per-dimension variance when ``var_floor_rel`` is given)
    seed : atom initialisation seed
    n_components : K of the atoms and barycenters (default: the largest source K)
    init : "data" (around the pooled data, :func:`init_atoms` with center/scale), "normal"
        (N(0, I), variance 1) or "sources" (:func:`init_atoms_from_gmms`)
    atoms : start from these atoms instead
    callback : called as ``callback(iteration, loss, params, alphas)`` after every step
    backend : "numpy" (closed-form gradients) or "torch" (autograd); same steps

    Returns
    -------
    atoms : Atoms
    alphas : (n_domains, A)
    history : dict with ``loss`` (n_iter,), ``domain_losses`` (n_iter, n_domains)
    """
    optim = Optim() if optim is None else optim
    n = len(gmms)
    if not 0 <= target_index < n:
        raise FedalignError(f"target index {target_index} out of range for {n} domains")
    sources = [g for i, g in enumerate(gmms) if i != target_index]
    if not sources or any(g.labels is None for g in sources):
        raise FedalignError("every source domain needs a labeled GMM")
    C = sources[0].labels.shape[1]
    d = gmms[0].d
    K = int(n_components or max(g.K for g in sources))
    mus, vars_ = zip(*(data_moments(g) for g in gmms))
    pooled_mu = np.mean(mus, 0)
    pooled_var = np.mean(vars_, 0) + np.var(mus, 0)
    if var_floor_rel is not None:
        from fedalign.gmm import floor_from_variance

        optim = Optim(optim.optimizer, optim.lr, optim.alpha_rule, optim.lr_alpha,
                      floor_from_variance(pooled_var, var_floor_rel))
    if atoms is None:
        if init == "data":
            atoms = init_atoms(n_atoms, K, d, C, seed, center=pooled_mu, scale=np.sqrt(pooled_var))
        elif init == "normal":
            atoms = init_atoms(n_atoms, K, d, C, seed)
        elif init == "sources":
            atoms = init_atoms_from_gmms(sources, n_atoms, K, C, seed)
        else:
            raise FedalignError(f"init must be 'data', 'normal' or 'sources', got {init!r}")
    labeled = [i != target_index for i in range(n)]
    for g, lab in zip(gmms, labeled):
        _check_gmm_vs_atoms(g, atoms, lab)
    _check_backend(backend)
    floor = np.asarray(optim.var_floor, dtype=np.float64)
    p = dict(means=atoms.means.copy(), variances=np.maximum(atoms.variances, floor),
             label_logits=atoms.label_logits.copy(),
             alpha=np.full((n, atoms.n_atoms), 1.0 / atoms.n_atoms))
    adam = AdamState()
    hist_loss, hist_dom = [], []
    want_model = not (optim.optimizer == "adam" and optim.alpha_rule == "projected")
    for it in range(int(n_iter)):
        dom, steps, new_alpha = [], [], p["alpha"].copy()
        total = dict(means=0.0, variances=0.0, label_logits=0.0,
                     alpha=np.zeros_like(p["alpha"]))
        for i, (g, lab) in enumerate(zip(gmms, labeled)):
            q = dict(p, alpha=p["alpha"][i])
            loss_i, g_i, model = _loss_grads(q, g, lab, K, bary_tol, bary_max_iter, backend,
                                             want_model)
            dom.append(loss_i)
            for name in ("means", "variances", "label_logits"):   # Adam's summed gradient
                total[name] = total[name] + g_i[name]
            total["alpha"][i] = g_i["alpha"]
            if optim.optimizer == "gd":
                qi = dict(means=p["means"].copy(), variances=p["variances"].copy(),
                          label_logits=p["label_logits"].copy())
                gd_update(qi, g_i, K, model["beta"], optim.lr, floor)
                steps.append(qi)
            if not (optim.optimizer == "adam" and optim.alpha_rule == "projected"):
                new_alpha[i] = alpha_update(p["alpha"][i], g_i["alpha"], model,
                                            optim.alpha_rule, optim.lr_alpha)
        hist_loss.append(float(sum(dom)))
        hist_dom.append([float(x) for x in dom])
        if optim.optimizer == "gd":
            for name in ("means", "variances", "label_logits"):
                p[name] = np.mean([s[name] for s in steps], 0)
            p["alpha"] = new_alpha
        else:
            names = ("means", "variances", "label_logits")
            if optim.alpha_rule == "projected":
                names += ("alpha",)
            else:
                p["alpha"] = new_alpha
            adam_update({k: p[k] for k in names}, total, adam, optim.lr)
            np.maximum(p["variances"], floor, out=p["variances"])
            p["alpha"] = project_simplex(p["alpha"])
        if callback is not None:
            callback(it, hist_loss[-1], p, p["alpha"])
    atoms = Atoms(p["means"], p["variances"], p["label_logits"])
    return atoms, p["alpha"], dict(loss=hist_loss, domain_losses=hist_dom)

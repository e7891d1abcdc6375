"""GMM dataset-dictionary learning (GMM-DaDiL): atoms, barycentric weights, Adam steps.

A dictionary is A labeled diagonal GMMs (atoms) with K components each: means (A, K, d),
variances (A, K, d) ≥ min_var and label logits (A, K, C) (labels = softmax of the logits).
Every domain ℓ is represented by weights α_ℓ ∈ Δ_A and its barycenter B(α_ℓ; atoms)
(:mod:`fedalign.gmm_barycenter`). The loss of a domain with GMM P_ℓ is

    SMW2²(P_ℓ, B(α_ℓ))   for a labeled source,   MW2²(P_ℓ, B(α_ℓ))   for the unlabeled target,

and centralized learning minimises MW2²(P_T, B(α_T)) + Σ_s SMW2²(P_s, B(α_s)) over atoms and
all α. Optimisation is Adam (Kingma & Ba 2015, the torch.optim.Adam update) on every
parameter, followed after every step by the projection of α onto the simplex and the variance
floor. :func:`local_steps` is one client's share of that loop (used by the decentralized
rounds); the optimizer state is plain numpy arrays so it can live in a private state file.

Gradients come from :func:`domain_loss_and_grads`, the closed form of the envelope-theorem
gradient in numpy (plans frozen, so every map is linear or elementwise); ``backend="torch"``
runs torch autograd through :func:`domain_loss` instead and gives the same steps (tested).

Scale: Adam moves every coordinate by about lr per step, and variances are optimised
directly, so lr should be small against the features' per-dimension spread (the default 0.1
suits standardised features; 0.01 suits raw 1280-d CNN features with stds ≈ 0.15).

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


def init_atoms(n_atoms: int, n_components: int, d: int, n_classes: int, seed: int = 0) -> Atoms:
    """Fresh atoms: means ~ N(0, I), variances 1, uniform labels (zero logits); seeded."""
    rng = np.random.default_rng(seed)
    shape = (int(n_atoms), int(n_components), int(d))
    return Atoms(rng.standard_normal(shape), np.ones(shape),
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
                          bary_tol: float = 1e-6, bary_max_iter: int = 50):
    """The loss of :func:`domain_loss` and its gradients in closed form (numpy, no autograd).

    With the plans frozen (envelope theorem) every step is linear or elementwise:

        loss = Σ_ij π_ij [‖m_i − mᴮ_j‖² + ‖s_i − sᴮ_j‖² + β‖V_i − Vᴮ_j‖²]
        ∂/∂mᴮ_j = 2 (π_·j mᴮ_j − Σ_i π_ij m_i)    (same for sᴮ, and β· for Vᴮ)
        Xᴮ = K_B Σ_a α_a P_aᵀ X_a  ⇒  ∂/∂X_a = K_B α_a P_a Gᴮ,  ∂/∂α_a = K_B ⟨P_aᵀ X_a, Gᴮ⟩
        s = √v ⇒ ∂/∂v = ∂/∂s / (2s);  V = softmax(z) ⇒ ∂/∂z = V ⊙ (G − Σ_c G V)

    ``p`` holds numpy ``means``, ``variances``, ``label_logits`` (A, K, ·) and ``alpha`` (A,).
    Returns (loss, grads dict with the same keys). Equal to torch autograd through
    :func:`domain_loss` (tested); immune to thread-pool contention of tiny torch ops.
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
    if labeled:
        beta = C.max()
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
    return loss, dict(means=gX[0], variances=gX[1] / (2 * S), label_logits=g_z, alpha=g_alpha)


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


def _project_params(p: dict, min_var: float):
    np.maximum(p["variances"], min_var, out=p["variances"])
    p["alpha"][...] = project_simplex(p["alpha"])


def local_steps(atoms: Atoms, alpha, gmm: GMM, n_steps: int, lr: float = 0.1,
                optim_state: AdamState | dict | None = None, min_var: float = 1e-6,
                labeled: bool | None = None, n_components_barycenter: int | None = None,
                bary_tol: float = 1e-6, bary_max_iter: int = 50, backend: str = "numpy"):
    """E Adam steps of one domain on its loss w.r.t. the atoms and its α.

    Parameters
    ----------
    atoms : current atoms (not modified)
    alpha : (A,) barycentric weights in the simplex
    gmm : the domain's GMM
    n_steps : E
    lr : Adam learning rate
    optim_state : :class:`AdamState`, its ``to_arrays()`` dict, or None (fresh)
    min_var : variance floor applied after every step
    labeled : SMW2² if True, MW2² if False (default: whether ``gmm`` has labels)
    n_components_barycenter : K_B (default: the atoms' K)
    backend : "numpy" (closed-form gradients, :func:`domain_loss_and_grads`) or "torch"
        (autograd through :func:`domain_loss`); both give the same steps

    Returns
    -------
    atoms : new :class:`Atoms`
    alpha : (A,) new weights
    optim_state : :class:`AdamState`
    losses : list of E floats, the loss *before* each step
    """
    labeled = gmm.labels is not None if labeled is None else bool(labeled)
    _check_gmm_vs_atoms(gmm, atoms, labeled)
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.shape != (atoms.n_atoms,):
        raise FedalignError(f"alpha has shape {alpha.shape}, expected ({atoms.n_atoms},)")
    if isinstance(optim_state, dict):
        optim_state = AdamState.from_arrays(optim_state)
    state = optim_state if optim_state is not None else AdamState()
    p = dict(means=atoms.means.copy(), variances=atoms.variances.copy(),
             label_logits=atoms.label_logits.copy(), alpha=project_simplex(alpha))
    _check_backend(backend)
    losses = []
    for _ in range(int(n_steps)):
        if backend == "numpy":
            loss, grads = domain_loss_and_grads(p, gmm, labeled, n_components_barycenter,
                                                bary_tol, bary_max_iter)
        else:
            t = _tensors(p)
            loss_t, _ = domain_loss(t["alpha"], t["means"], t["variances"], t["label_logits"],
                                    gmm, labeled, n_components_barycenter, bary_tol,
                                    bary_max_iter)
            loss, grads = float(loss_t.detach()), _grads(loss_t, t)
        losses.append(loss)
        adam_update(p, grads, state, lr)
        _project_params(p, min_var)
    return Atoms(p["means"], p["variances"], p["label_logits"]), p["alpha"], state, losses


def learn_dictionary(gmms: list, target_index: int, n_atoms: int = 3, n_iter: int = 100,
                     lr: float = 0.1, seed: int = 0, n_components: int | None = None,
                     min_var: float = 1e-6, init: str = "normal", atoms: Atoms | None = None,
                     bary_tol: float = 1e-6, bary_max_iter: int = 50, callback=None,
                     backend: str = "numpy"):
    """Centralized GMM-DaDiL: learn atoms and every domain's α jointly.

    Loss MW2²(P_T, B(α_T)) + Σ_{s ≠ T} SMW2²(P_s, B(α_s)), Adam on all parameters, simplex
    projection of every α and the variance floor after every step.

    Parameters
    ----------
    gmms : list of GMM, one per domain; sources labeled, gmms[target_index] used unlabeled
    target_index : index of the target domain
    n_atoms : A
    n_iter : Adam steps
    lr : learning rate
    seed : atom initialisation seed
    n_components : K of the atoms and barycenters (default: the largest source K)
    init : "normal" (:func:`init_atoms`) or "sources" (:func:`init_atoms_from_gmms`)
    atoms : start from these atoms instead
    callback : called as ``callback(iteration, loss, params, alphas)`` after every step
    backend : "numpy" (closed-form gradients) or "torch" (autograd); same steps

    Returns
    -------
    atoms : Atoms
    alphas : (n_domains, A)
    history : dict with ``loss`` (n_iter,), ``domain_losses`` (n_iter, n_domains)
    """
    n = len(gmms)
    if not 0 <= target_index < n:
        raise FedalignError(f"target index {target_index} out of range for {n} domains")
    sources = [g for i, g in enumerate(gmms) if i != target_index]
    if not sources or any(g.labels is None for g in sources):
        raise FedalignError("every source domain needs a labeled GMM")
    C = sources[0].labels.shape[1]
    d = gmms[0].d
    K = int(n_components or max(g.K for g in sources))
    if atoms is None:
        if init == "normal":
            atoms = init_atoms(n_atoms, K, d, C, seed)
        elif init == "sources":
            atoms = init_atoms_from_gmms(sources, n_atoms, K, C, seed)
        else:
            raise FedalignError(f"init must be 'normal' or 'sources', got {init!r}")
    labeled = [i != target_index for i in range(n)]
    for g, lab in zip(gmms, labeled):
        _check_gmm_vs_atoms(g, atoms, lab)
    p = dict(means=atoms.means.copy(), variances=atoms.variances.copy(),
             label_logits=atoms.label_logits.copy(),
             alpha=np.full((n, atoms.n_atoms), 1.0 / atoms.n_atoms))
    state = AdamState()
    hist_loss, hist_dom = [], []
    _check_backend(backend)
    for it in range(int(n_iter)):
        if backend == "numpy":
            dom, grads = [], dict(means=0.0, variances=0.0, label_logits=0.0,
                                  alpha=np.zeros_like(p["alpha"]))
            for i, (g, lab) in enumerate(zip(gmms, labeled)):
                q = dict(p, alpha=p["alpha"][i])
                loss_i, g_i = domain_loss_and_grads(q, g, lab, K, bary_tol, bary_max_iter)
                dom.append(loss_i)
                for name in ("means", "variances", "label_logits"):
                    grads[name] = grads[name] + g_i[name]
                grads["alpha"][i] = g_i["alpha"]
        else:
            t = _tensors(p)
            dom_t = [domain_loss(t["alpha"][i], t["means"], t["variances"], t["label_logits"],
                                 g, lab, K, bary_tol, bary_max_iter)[0]
                     for i, (g, lab) in enumerate(zip(gmms, labeled))]
            grads = _grads(sum(dom_t), t)
            dom = [float(x.detach()) for x in dom_t]
        hist_loss.append(float(sum(dom)))
        hist_dom.append([float(x) for x in dom])
        adam_update(p, grads, state, lr)
        _project_params(p, min_var)
        if callback is not None:
            callback(it, hist_loss[-1], p, p["alpha"])
    atoms = Atoms(p["means"], p["variances"], p["label_logits"])
    return atoms, p["alpha"], dict(loss=hist_loss, domain_losses=hist_dom)

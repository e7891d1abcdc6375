"""How the atoms and α move: the presets and a client's settings (validated here, once), the
mass-preconditioned gradient step, Adam, and the α rules (projected Newton on the fixed-plan
model, projected gradient, exponentiated gradient).

A client's settings are made here (:func:`client_settings`: a preset and overrides, every
value checked), stored in its state (:mod:`fedalign.dadil.state`) and turned back into its
:class:`Optim` for a round here (:meth:`Optim.from_settings`, the one validating constructor,
which also reads a hand-edited state's settings: :func:`check_settings`).

See :mod:`fedalign.dadil.dictionary` for how scale enters the ``fedalign`` preset and where its
step sizes come from.

References
----------
D. P. Kingma, J. Ba, "Adam: a method for stochastic optimization", ICLR 2015.
A. Beck, M. Teboulle, "A fast iterative shrinkage-thresholding algorithm", SIAM J. Imaging
Sciences 2 (2009) (FISTA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedalign import defaults
from fedalign.dadil.atoms import project_simplex
from fedalign.dadil.barycenter import softmax
from fedalign.dadil.gradients import alpha_model
from fedalign.errors import FedalignError

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8

OPTIMIZERS = ("gd", "adam")
#: Smallest label probability kept when labels are stored as logits.
LABEL_FLOOR = 1e-12
ALPHA_RULES = ("newton", "projected", "eg")
#: How a client's atoms start (``init`` setting): around its own data, or N(0, I).
INITS = ("data", "normal")


def check_alpha_rule(rule: str) -> str:
    """``rule`` if it is one of :data:`ALPHA_RULES`, else the one error naming them."""
    if rule not in ALPHA_RULES:
        raise FedalignError(f"alpha rule must be one of {', '.join(ALPHA_RULES)}, got {rule!r}")
    return rule


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
        check_alpha_rule(self.alpha_rule)
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise FedalignError(f"lr must be > 0, got {self.lr}", param="lr")
        if not (np.isfinite(self.lr_alpha) and self.lr_alpha > 0):
            raise FedalignError(f"lr_alpha must be > 0, got {self.lr_alpha}", param="lr_alpha")
        fl = np.asarray(self.var_floor, dtype=np.float64)
        if not np.all(np.isfinite(fl)) or np.any(fl <= 0):
            raise FedalignError("variance floor must be finite and > 0")

    @classmethod
    def from_settings(cls, settings: dict, rounds_done: int = 0, var_floor=1e-6,
                      where: str | None = None) -> "Optim":
        """The optimiser of a client's settings (:func:`client_settings`) for its next round.

        The settings a round reads are checked here, once, for a fresh client and for a
        state read back (a hand-edited one raised KeyError/ValueError in its round):
        ``optimizer``, ``alpha_rule`` strings, ``lr``, ``lr_alpha`` numbers (present, and
        valid for :class:`Optim`); ``lr_decay`` a finite number ≥ 0 (absent: 0);
        ``target_atoms`` true/false (absent: true). ``where`` prefixes the errors.

        The atoms' step in round t (``rounds_done`` = t − 1) is lr / (1 + lr_decay·(t−1)):
        with a constant step the clients' local steps keep pulling their copies apart as fast
        as gossip averages them (the consensus plateaus); a harmonic decay lets the copies
        meet, as decentralized SGD needs a diminishing step for exact consensus (Lian et al.,
        NeurIPS 2017). States written before the setting existed read as lr_decay 0.
        """
        pre = f"{where}: " if where else ""
        for key, ok, what in (("optimizer", lambda v: isinstance(v, str), "a string"),
                              ("alpha_rule", lambda v: isinstance(v, str), "a string"),
                              ("lr", _is_number, "a number"), ("lr_alpha", _is_number, "a number")):
            if key not in settings:
                raise FedalignError(f"{pre}settings lack '{key}'")
            if not ok(settings[key]):
                raise FedalignError(f"{pre}setting '{key}' must be {what}, got "
                                    f"{settings[key]!r}")
        decay = settings.get("lr_decay", 0.0)
        if not _is_number(decay):
            raise FedalignError(f"{pre}setting 'lr_decay' must be a number, got {decay!r}")
        if not (np.isfinite(decay) and decay >= 0):
            raise FedalignError(f"{pre}lr_decay must be ≥ 0, got {decay}",
                                param=None if pre else "lr_decay")
        if not isinstance(settings.get("target_atoms", True), bool):
            raise FedalignError(f"{pre}setting 'target_atoms' must be true or false, got "
                                f"{settings['target_atoms']!r}")
        lr = float(settings["lr"]) / (1.0 + float(decay) * int(rounds_done))
        try:
            return cls(settings["optimizer"], lr, settings["alpha_rule"],
                       float(settings["lr_alpha"]), var_floor)
        except FedalignError as e:
            raise FedalignError(f"{pre}{e}", param=None if pre else e.param) from None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_settings(settings: dict, where: str | None = None) -> None:
    """Refuse settings a round cannot run with (:meth:`Optim.from_settings`'s checks; a state
    read only to evaluate its target needs none)."""
    Optim.from_settings(settings, where=where)


#: Named settings. ``fedalign`` (default): scale-free gradient steps, α by projected Newton,
#: variance floor 1 % of the client's per-dimension data variance, atoms started around the
#: client's own data. ``reference``: the GMM-DaDiL reference code's optimiser (Adam lr 0.1 on
#: every parameter, α projected onto the simplex after each Adam step, min_var 0.05), with
#: atoms started at N(0, I), variance 1.
PRESETS = defaults.DADIL_PRESETS  # (there: the CLI's help quotes them without numpy)


def client_settings(preset: str = "fedalign", **overrides) -> dict:
    """The settings of a client: a named preset (:data:`PRESETS`) with explicit values (not
    None) taking precedence, every value checked. Keys: optimizer, lr, alpha_rule, lr_alpha,
    var_floor_rel (variance floor relative to the client's per-dimension data variance) or
    min_var (absolute floor), init ("data" | "normal"), target_atoms, lr_decay (the atoms'
    step in round t is lr / (1 + lr_decay · t), see :meth:`Optim.from_settings`)."""
    if preset not in PRESETS:
        raise FedalignError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}",
                            param="preset")
    out = dict(PRESETS[preset], preset=preset)
    for k, v in overrides.items():
        if k not in out:
            raise FedalignError(f"unknown DaDiL setting {k!r}")
        if v is not None:
            out[k] = v
    if overrides.get("min_var") is not None:
        out["var_floor_rel"] = None
    elif overrides.get("var_floor_rel") is not None:
        out["min_var"] = None
    if out["init"] not in INITS:
        raise FedalignError(f"init must be 'data' or 'normal', got {out['init']!r}")
    for k in ("var_floor_rel", "min_var"):
        if out[k] is not None and not (np.isfinite(out[k]) and out[k] > 0):
            raise FedalignError(f"{k} must be > 0, got {out[k]}", param=k)
    check_settings(out)
    return out


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


def gd_update(p: dict, grads: dict, KB: int, beta: float, lr: float, var_floor) -> None:
    """One mass-preconditioned gradient step on the atoms, in place.

    The loss is Σ_ij π_ij c_ij with barycenter components of mass 1/K_B, so its Hessian in a
    component's mean or standard deviation is (2/K_B) I (and 2β/K_B for labels). Scaling
    the gradient by its inverse gives, for a matched atom component,

        Δm_ai = −lr · α_a · (mᴮ_j − t_j),   t_j = K_B Σ_l π_lj m_l  (its barycentric
                                                                  target),

    the same for the standard deviations s = √v (the W2 cost is Euclidean in (m, s)) and for
    the soft labels V (β‖·‖², Hessian 2β/K_B), which are then projected back onto the
    simplex and stored as logits log max(V, 1e-12). (A step on the logits instead is damped by the
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
        V = project_simplex(softmax(p["label_logits"]) - pre / beta * grads["labels"])
        p["label_logits"] = np.log(np.maximum(V, LABEL_FLOOR))


#: Largest number of atoms for which :func:`_qp_simplex` enumerates the simplex's faces.
EXACT_QP_MAX_ATOMS = 8


def _qp_faces(G: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Exact argmin_{x ∈ Δ} xᵀ G x − 2 bᵀ x (G ⪰ 0), by enumerating the faces of the
    simplex.

    On a face with support S the minimiser of the affine-constrained problem solves the KKT
    system [[G_SS, 1], [1ᵀ, 0]] [x_S; ν] = [b_S; 1] (least squares where G_SS is singular).
    The convex optimum lies in the relative interior of some face, where it is such a
    minimiser, so the best feasible candidate over all 2^A − 1 faces is the optimum (ties: the
    first face in order of size, then index). None when no candidate is feasible (not reached
    for G ⪰ 0: every vertex is feasible).
    """
    import itertools

    A = len(b)
    best, best_val = None, np.inf
    scale = max(float(np.abs(G).max()), float(np.abs(b).max()), 1e-300)
    Gs, bs = G / scale, b / scale
    for size in range(1, A + 1):
        for S in itertools.combinations(range(A), size):
            S = list(S)
            n = len(S)
            K = np.zeros((n + 1, n + 1))
            K[:n, :n] = Gs[np.ix_(S, S)]
            K[:n, n] = K[n, :n] = 1.0
            rhs = np.append(bs[S], 1.0)
            sol = np.linalg.lstsq(K, rhs, rcond=None)[0][:n]
            if sol.min() < -1e-12 or abs(sol.sum() - 1.0) > 1e-9:
                continue
            x = np.zeros(A)
            x[S] = np.maximum(sol, 0.0)
            x /= x.sum()
            val = float(x @ Gs @ x - 2.0 * bs @ x)
            if best is None or val < best_val - 1e-13 * max(1.0, abs(best_val)):
                best, best_val = x, val
    return best


def _qp_simplex(G: np.ndarray, b: np.ndarray, x0: np.ndarray, n_iter: int = 500,
                tol: float = 1e-12) -> np.ndarray:
    """argmin_{x ∈ Δ} xᵀ G x − 2 bᵀ x, G ⪰ 0: exact by faces (:func:`_qp_faces`) for
    A ≤ :data:`EXACT_QP_MAX_ATOMS`, else accelerated projected gradient (FISTA) from x0."""
    if 0 < len(b) <= EXACT_QP_MAX_ATOMS:
        x = _qp_faces(G, b)
        if x is not None:
            return x
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


def alpha_update(alpha: np.ndarray, g_alpha: np.ndarray, model: dict | None, rule: str,
                 lr_alpha: float) -> np.ndarray:
    """A new α ∈ Δ_A (not in place).

    ``newton``: α* = argmin_Δ of the fixed-plan model (:func:`alpha_model`),
    α ← α + η(α* − α);
    ``projected``: projected gradient with the model's curvature as step,
    α ← Π_Δ(α − η ∇/(2 λ_max(G)));
    ``eg``: normalised exponentiated gradient, g̃ = g − ⟨α, g⟩,
    α ← α ⊙ exp(−η g̃ / max|g̃|) / Z.
    All three are invariant to the scale of the features: the common part of ∇α (which the
    simplex constraint removes) does not produce a step, unlike per-coordinate Adam steps.
    """
    check_alpha_rule(rule)
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


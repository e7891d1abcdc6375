"""GMM dataset-dictionary learning (GMM-DaDiL): local steps, α alone, the centralized loop.

A dictionary is A labeled diagonal GMMs (atoms, :mod:`fedalign.dadil.atoms`); every domain ℓ
is represented by weights α_ℓ ∈ Δ_A and its barycenter B(α_ℓ; atoms)
(:mod:`fedalign.dadil.barycenter`). The loss of a domain with GMM P_ℓ is

    SMW2²(P_ℓ, B(α_ℓ))  for a labeled source,   MW2²(P_ℓ, B(α_ℓ))  for the unlabeled target,

and centralized learning minimises MW2²(P_T, B(α_T)) + Σ_s SMW2²(P_s, B(α_s)) over atoms and
all α. :func:`local_steps` is one client's share of that loop (the decentralized rounds of
:mod:`fedalign.dadil.gossip`); :func:`fit_alpha` fits α alone on fixed atoms;
:func:`learn_dictionary` is the centralized loop. Gradients come from
:func:`fedalign.dadil.gradients.domain_loss_and_grads`, the closed form of the
envelope-theorem gradient (plans frozen), equal to torch autograd (tested against
``tests/dadil_torch_reference.py``); the steps are those of :mod:`fedalign.dadil.optim`.

How scale enters (the ``fedalign`` preset, :data:`fedalign.dadil.optim.PRESETS`)
    Frozen CNN features have per-dimension spreads of 1e-3 to 1 and many exact zeros; an
    absolute learning rate and variance floor therefore mean different things on every
    dataset (Adam lr 0.1 broke DeFed on 1280-d features; min_var 1e-6 left half of the GMM
    variances at the floor). Nothing here has an absolute scale:

    - the atoms move by projected gradient descent preconditioned by the curvature of the
      loss in the barycenter's component parameters, (2/K_B) I: a step removes a fraction
      ``lr`` · α_a of each component's residual (:func:`~fedalign.dadil.optim.gd_update`),
      in (mean, standard deviation) coordinates, where the diagonal W2 cost is Euclidean;
    - α moves by a damped projected Newton step on the fixed-plan quadratic model of the loss
      (:func:`~fedalign.dadil.optim.alpha_update`): Adam's per-coordinate steps are equal when
      all components of ∇α share one sign (95 % of the steps on Office-Caltech10, a common
      part ≈ 2700 against differences ≈ 30), and the simplex projection then removes them,
      so α never moved;
    - variances are floored at 1 % of the domain's own per-dimension data variance;
    - atoms start around the domain's own data (mean and per-dimension spread of its GMM).

    Features multiplied by s and shifted by c give atoms multiplied by s and shifted by c and
    the same α (tested). The step sizes (lr 0.2, lr_alpha 0.25, with 5 local steps) were chosen
    on the quick-start demo digits (``fedalign demo-data``: ink, neon, blocky; seed 0) among
    lr ∈ {0.2, 0.5} × lr_alpha ∈ {0.1, 0.25, 0.5}, never on a reported benchmark.
    - the atoms' step decays harmonically over rounds, lr / (1 + lr_decay·(t − 1)) (a constant
      step lets local steps pull the copies apart as fast as gossip averages them: consensus
      plateaus). lr_decay = 0.02 is the smallest of {0, 0.02, 0.05, 0.1} whose worst consensus
      ratio M(50)/M(0) on the same demo set (3 targets × seeds 0, 1, 50 rounds × 3 local steps,
      ``examples/dadil/select_lr_decay.py``) is ≤ 0.3 for both strategies (0.32 → 0.19 for
      aggregation) with the paired accuracy change within one standard error (aggregation
      −3.1 ± 3.5, replacement +0.3 ± 1.2 points). The centralized learner keeps a constant step.

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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedalign import defaults
from fedalign.dadil.atoms import (Atoms, data_moments, init_atoms, init_atoms_from_gmms,
                                  project_simplex)
from fedalign.dadil.gradients import check_gmm_vs_atoms, domain_loss_and_grads
from fedalign.dadil.optim import (AdamState, Optim, adam_update, alpha_update, check_alpha_rule,
                                  gd_update)
from fedalign.errors import FedalignError
from fedalign.gmm import GMM, floor_from_variance


@dataclass(eq=False)
class LocalSteps:
    """What :func:`local_steps` returns: the moved atoms and α, and how they moved.

    ``losses``: E floats, the loss *before* each step; ``alphas``: E + 1 weight vectors (the
    start, then after every step); ``step_mean`` / ``step_std``: E RMS changes of the atoms'
    means and standard deviations.
    """

    atoms: Atoms
    alpha: np.ndarray
    losses: list
    alphas: list
    step_mean: list
    step_std: list

    @property
    def record(self) -> dict:
        """The steps as a round record keeps them (a client's history in its state file):
        ``losses``, ``alpha`` (the E + 1 vectors), ``step_mean``, ``step_std``."""
        return dict(losses=self.losses, alpha=self.alphas, step_mean=self.step_mean,
                    step_std=self.step_std)


@dataclass(eq=False)
class AlphaFit:
    """What :func:`fit_alpha` returns: α and its fit.

    ``alpha`` (A,); ``loss`` the final loss; ``losses`` / ``alphas`` the loss and α at the
    start and after every accepted step; ``iterations``; ``converged`` (max |Δα| ≤ tol, or no
    descending step left).
    """

    alpha: np.ndarray
    loss: float
    losses: list
    alphas: list
    iterations: int
    converged: bool


@dataclass(eq=False)
class LearnedDictionary:
    """What :func:`learn_dictionary` returns: the atoms, every domain's α, the loss curves.

    ``alphas`` (n_domains, A); ``losses`` (n_iter,) the summed loss of every iteration;
    ``domain_losses`` (n_iter, n_domains) per domain.
    """

    atoms: Atoms
    alphas: np.ndarray
    losses: list
    domain_losses: list

    @property
    def history(self) -> dict:
        """The loss curves as a dict: ``loss`` (n_iter,), ``domain_losses``."""
        return dict(loss=self.losses, domain_losses=self.domain_losses)


def _loss_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter, want_model):
    """(loss, grads, model or None) of one domain (:func:`domain_loss_and_grads`)."""
    out = domain_loss_and_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter,
                                return_model=want_model)
    return out if want_model else (*out, None)


def local_steps(atoms: Atoms, alpha, gmm: GMM, n_steps: int, optim: Optim | None = None, *,
                labeled: bool | None = None, n_components_barycenter: int | None = None,
                bary_tol: float = 1e-6, bary_max_iter: int = 50, update_atoms: bool = True):
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
    update_atoms : False keeps the atoms fixed and moves α only

    Returns
    -------
    :class:`LocalSteps` — ``atoms`` (new :class:`Atoms`), ``alpha`` (A,) new weights,
    ``losses`` (E floats, the loss *before* each step), ``alphas`` (E + 1 weight vectors),
    ``step_mean`` / ``step_std`` (RMS change of the atoms' means and standard deviations per
    step)
    """
    optim = Optim() if optim is None else optim
    labeled = gmm.labels is not None if labeled is None else bool(labeled)
    check_gmm_vs_atoms(gmm, atoms, labeled)
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
        loss, grads, model = _loss_grads(p, gmm, labeled, KB, bary_tol, bary_max_iter,
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
    return LocalSteps(Atoms(p["means"], p["variances"], p["label_logits"]), p["alpha"],
                      rec["losses"], rec["alpha"], rec["step_mean"], rec["step_std"])


#: Step halvings of :func:`fit_alpha`'s descent safeguard.
MAX_HALVINGS = 8


def fit_alpha(atoms: Atoms, gmm: GMM, n_steps: int = 100, *, labeled: bool | None = None,
              alpha0=None, rule: str = "projected", lr_alpha: float | None = None,
              tol: float = 1e-9, rtol: float = 0.0, n_components_barycenter: int | None = None):
    """Fit barycentric weights alone, the atoms fixed: argmin_{α ∈ Δ} MW2²(Q, B(α; atoms)).

    Used by the barycentric-envelope study (GMM-DaDiL, Section 5.2) and by the target's
    final weights. Each iteration recomputes the plans at the current α and takes one step of
    ``rule`` (:func:`alpha_update`; ``lr_alpha`` default 1 for projected/newton, 0.1 for eg),
    halved until the loss does not increase (the barycenter's plans, hence the loss, jump as
    α moves, so a step of the fixed-plan model can go uphill); no descending step within
    :data:`MAX_HALVINGS` halvings ends the fit as stationary. A step of max |Δα| ≤ ``tol`` is
    not evaluated (converged), and an accepted step that lowers the loss by at most
    ``rtol`` × loss ends the fit as converged: near a jump of the plans Newton's steps creep
    along the kink, each bought with several halvings, for relative gains of 1e-5.

    Returns
    -------
    :class:`AlphaFit` — ``alpha`` (A,), ``loss``, ``losses``, ``alphas``, ``iterations``,
    ``converged`` (max |Δα| ≤ tol, relative decrease ≤ rtol, or no descent left)
    """
    labeled = gmm.labels is not None if labeled is None else bool(labeled)
    check_gmm_vs_atoms(gmm, atoms, labeled)
    check_alpha_rule(rule)
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
        if float(np.abs(step).max()) <= tol:
            converged = True              # the rule stays put: nothing left to evaluate
            break
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
        gain = loss - out[0]
        loss, grads, model = out
        losses.append(loss)
        alphas.append(alpha.tolist())
        if change <= tol or gain <= rtol * abs(loss):
            converged = True
            break
    return AlphaFit(alpha, loss, losses, alphas, it, converged)


def learn_dictionary(gmms: list, target_index: int, *, n_atoms: int = defaults.N_ATOMS,
                     n_iter: int = 100, optim: Optim | None = None, seed: int = 0,
                     n_components: int | None = None,
                     init: str = "data", atoms: Atoms | None = None,
                     var_floor_rel: float | None = 1e-2, bary_tol: float = 1e-6,
                     bary_max_iter: int = 50, callback=None):
    """Centralized GMM-DaDiL: learn atoms and every domain's α jointly.

    Loss MW2²(P_T, B(α_T)) + Σ_{s ≠ T} SMW2²(P_s, B(α_s)). ``gd``: every iteration each
    domain computes its preconditioned step (:func:`~fedalign.dadil.optim.gd_update`) and the
    atoms move by their mean (the centralized counterpart of the clients' local steps); each
    α_ℓ moves by its domain's α rule. ``adam``: one Adam step on the summed loss (the
    reference), α projected.

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

    Returns
    -------
    :class:`LearnedDictionary` — ``atoms``, ``alphas`` (n_domains, A), ``losses`` (n_iter,),
    ``domain_losses`` (n_iter, n_domains)
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
        optim = dataclasses.replace(optim, var_floor=floor_from_variance(pooled_var, var_floor_rel))
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
        check_gmm_vs_atoms(g, atoms, lab)
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
            loss_i, g_i, model = _loss_grads(q, g, lab, K, bary_tol, bary_max_iter, want_model)
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
    return LearnedDictionary(atoms, p["alpha"], hist_loss, hist_dom)

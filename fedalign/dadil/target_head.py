"""The target's head on its own rows: pseudo-labels from B(α_T), an LDA from class statistics.

The ``linear`` and ``map`` heads (:mod:`fedalign.dadil.classifiers`) classify with the
target's barycenter B(α_T; atoms) alone, a diagonal GMM, and are capped by how well a diagonal
GMM describes the target. The ``lda`` head keeps what the dictionary knows — which of the
target's clusters carries which label — and learns the decision boundary from real rows:

1. **Pseudo-labels.** The target labels its own unlabeled adaptation rows x_i with the MAP
   rule of B(α_T): ŷ_i = argmax_c Σ_k P(k | x_i) V_kc (:func:`fedalign.gmm.map_predict`).
2. **Class statistics.** Every labeled source k sends FedCGS's aggregates of its rows (class
   counts N_{k,c}, class sums, Σx, Σxxᵀ: :func:`fedalign.heads.fedcgs.client_update`); the
   target computes the same of its pseudo-labeled rows and keeps them.
3. **The head.** The LDA of the summed statistics
   (:func:`fedalign.heads.fedcgs.server_aggregate` with ``covariance="within"``): μ_c, the
   pooled within-class covariance S_w, Σ = (1 − r) S_w + r T, W = M Σ⁻¹,
   b_c = −½ μ_cᵀ Σ⁻¹ μ_c + log(N_c/N). T is (tr S_w/d) I (``identity``) or the scaled
   diagonal of the total covariance (``diagonal``: the identity rule on standardised
   features, see :func:`fedalign.heads.fedcgs.shrink`). ``cem_iter`` > 0 then refines the
   target's pseudo-labels by classification EM
   (:func:`fedalign.dadil.classification_em.cem_lda`: the LDA relabels the target's rows and
   is refitted until the labels stop changing, at most ``cem_iter`` times). The default,
   :data:`fedalign.defaults.CEM_ITER` = 0, is the one pass: the refinement met its criterion
   on the tuning set of stop 39 (below; ``examples/dadil/tune_lda_head.py``) and lost on the
   reported Amazon review and Digits missing-class targets (that module's docstring).
4. **Shrinkage by a rule on the sources alone** (:func:`choose_shrinkage`): (r, T) from
   :data:`SHRINKAGE_GRID` by leave-one-source-domain-out — for every source i the head built
   from the other sources' statistics is scored on source i's rows (a domain the head has not
   seen, as the target is); the best mean accuracy wins, ties to the first in the grid (the
   smallest ridge, identity before diagonal). The target's labels are never used. With a
   single source: :data:`DEFAULT_SHRINKAGE`.

5. **Which head, by a rule on the sources alone** (:func:`choose_head`, the ``auto`` head of
   :mod:`fedalign.dadil.classifiers`): ``lda`` or the sampled ``linear`` head of B(α_T).
   Every source i plays the target: its rows are split in two halves A and B (seeded), and a
   labeled GMM G_i^A is fitted on half A alone, with the fit options of source i's own GMM
   (its ``meta``); ``linear`` is the logistic regression on samples of G_i^A, ``lda`` the LDA
   of the other sources' statistics and of half A pseudo-labeled by G_i^A's MAP rule (the
   chosen shrinkage; one pass, no classification EM: see below); both are scored on half
   B, which neither has seen. The head with the higher mean accuracy over sources wins
   (ties: ``lda``). It asks of a federation what the oracle rows of
   ``examples/dadil/RESULTS.md`` show with target labels (a labeled GMM fitted on one part,
   scored on another) — whether a good GMM is better used through its samples or through
   pseudo-labels of real rows — without any target label. Each source fits G_i^A
   locally, needs the others' FedCGS aggregates (already sent) and returns two accuracies.

   The rule's first form used source i's GMM of *all* its rows, half B included:
   the ``linear`` head was scored on rows its GMM had been fitted on (in-sample), and it
   picked ``linear`` wherever a GMM can memorise its rows — on Digits (d = 1,280, 100 rows per
   class) its in-sample score was 0.77–0.87 against 0.54–0.70 out of sample, and it chose
   ``linear`` where ``lda`` is 5–6 points better on the target.

   **Two stand-ins, averaged** (``bracket``, stop 39). G_i^A is a better GMM than B(α_T): it
   is fitted on the domain's own labeled rows, while B(α_T) reconstructs the target from
   atoms shared with other domains and takes its labels from them. So the rule overrated
   ``linear`` where the reconstruction is poor (Digits mnist: ``linear`` on 8 of 9
   missing-class jobs, 7.3 points below ``lda``). The second stand-in keeps G_i^A's
   components and relabels each by the LDA of the *other* sources' statistics at its mean —
   the half's own geometry, labels from elsewhere, as B(α_T) has them — and both heads are
   scored with it the same way. Each head's score is the mean of its two scores (the first
   stand-in overrates a GMM's samples, the second underrates them). Chosen on a tuning set the
   tables do not report (missing-class jobs of Digits mnist and Office-Caltech10 amazon and
   caltech10, seeds 0–2; ``examples/dadil/tune_head_rule.py``), against a criterion fixed
   before (mean gain ≥ 0.5 points, no target worse by more than 0.5): mnist 72.1 → 77.4,
   amazon 94.7 → 94.7, caltech10 91.0 → 91.1. It costs one more sampled head and LDA per
   source, no GMM fit.

   **The rule scores the one-pass ``lda`` head**, also when the head used is refined by
   classification EM (``cem_iter`` > 0, step 3). Refining the stand-ins' pseudo-labels too was
   tried on the same tuning set (stop 40): a stand-in's MAP labels come from a GMM of the source's own labeled
   rows, which the LDA of the other sources can only move away from, so the rule then
   underrated ``lda`` and picked ``linear`` on 7 more of the 12 mnist jobs (0–45 % removed;
   ``auto`` 79.9 → 74.8 with the refined head used).

No raw row leaves a client: sources send aggregates (the FedCGS message, d² + C·d + C + d
numbers) and, for the rule, one accuracy per grid point and source (the candidate heads are
built by the target from the others' aggregates and sent to source i to score); the target's
rows and pseudo-labels stay on the target. In one process (:func:`fit_target_head`) all of
this is computed from the sources' rows directly, with identical results. Classification EM
runs on the target, with the aggregates it already has; nothing more is sent.

The grid (ridge 0.01 … 0.6 half a decade apart, two targets) was fixed before any accuracy
was looked at; the choice inside it is the rule's. The design of the head (pseudo-labels by
B(α_T)'s posterior, an LDA of pooled class statistics) was developed on the project's
benchmarks: ``examples/dadil/RESULTS.md`` says so and reports the alternatives tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedalign.dadil.classification_em import cem_lda, lda_from_statistics, one_pass_lda
from fedalign.defaults import CEM_ITER
from fedalign.errors import FedalignError
from fedalign.heads.fedcgs import class_statistics  # noqa: F401 (FedCGS's message, re-exported)

#: The shrinkage candidates (ridge r, shrinkage target) of :func:`choose_shrinkage`, in order.
SHRINKAGE_GRID = tuple((r, t) for t in ("identity", "diagonal")
                       for r in (0.01, 0.03, 0.1, 0.3, 0.6))
#: The shrinkage with a single source (nothing to hold out): FedCGS's within-class rule at 0.1.
DEFAULT_SHRINKAGE = (0.1, "identity")


@dataclass
class TargetHead:
    """The ``lda`` head of a target and how it was made.

    Attributes
    ----------
    head : :class:`fedalign.heads.LinearHead` (``predict(X)``, X (n, d))
    ridge, shrink_to : the shrinkage used
    record : dict — ``shrinkage_rule`` (``leave-one-source-domain-out`` or ``default``),
        ``grid`` and ``scores`` (mean held-out source accuracy per grid point),
        ``pseudo_label_counts`` (C,), ``n_target_rows``, ``n_source_rows``
    """

    head: object
    ridge: float
    shrink_to: str
    record: dict = field(default_factory=dict)

    def predict(self, X) -> np.ndarray:
        return self.head.predict(np.asarray(X, np.float64))


def _path_heads(messages: list, n_classes: int, grid) -> list:
    """The heads of every grid point from one eigendecomposition per shrinkage target.

    The same heads as :func:`lda_from_statistics` for each (r, T) (to round-off): Σ = (1 − r) S
    + r T is diagonalised once per T in the coordinates where T ∝ I.
    """
    from fedalign.heads import fedcgs

    Nc, Mc, mu, S = fedcgs.global_statistics(messages)
    v = np.diag(S).copy()
    Sw = fedcgs.within(S, Nc, Mc, mu)
    heads = {}
    for target in dict.fromkeys(t for _, t in grid):
        if target == "identity":
            s = np.ones_like(v)
        else:
            s = np.sqrt(np.maximum(v, 1e-12 * max(float(v.max()), 1e-300)))
        R = Sw / np.outer(s, s)
        lam, V = np.linalg.eigh(0.5 * (R + R.T))
        lam = np.maximum(lam, 0.0)
        c = float(np.trace(R)) / R.shape[0]
        Ms = (Mc / s) @ V                                          # class means, rotated
        for r, t in grid:
            if t != target:
                continue
            w = (1.0 - r) * lam + r * c
            w = np.maximum(w, 1e-12 * max(float(w.max()), 1e-300))
            heads[(r, t)] = fedcgs.head_of(Nc, Mc, ((Ms / w) @ V.T) / s)
    return [heads[g] for g in grid]


def choose_shrinkage(sources: list, n_classes: int, grid=SHRINKAGE_GRID, messages=None) -> tuple:
    """(ridge, shrink_to) by leave-one-source-domain-out on the labeled sources (module docstring).

    Parameters
    ----------
    sources : list of (X_i (n_i, d), y_i (n_i,)) labeled source domains
    grid : candidates, in tie-breaking order
    messages : the sources' :func:`class_statistics`, if already computed

    Returns
    -------
    ((ridge, shrink_to), record dict: rule, grid, scores)
    """
    grid = [(float(r), str(t)) for r, t in grid]
    if len(sources) < 2:
        return DEFAULT_SHRINKAGE, dict(shrinkage_rule="default (one source)", grid=grid,
                                       scores=[])
    msgs = messages or [class_statistics(X, y, n_classes) for X, y in sources]
    scores = np.zeros(len(grid))
    for i, (Xi, yi) in enumerate(sources):
        heads = _path_heads([m for j, m in enumerate(msgs) if j != i], n_classes, grid)
        scores += [h.accuracy(np.asarray(Xi, np.float64), np.asarray(yi)) for h in heads]
    scores /= len(sources)
    best = grid[int(np.argmax(scores))]
    return best, dict(shrinkage_rule="leave-one-source-domain-out", grid=grid,
                      scores=[float(s) for s in scores])


@dataclass
class TargetRows:
    """What the ``lda`` head needs besides B(α_T): the target's adaptation rows, the labeled
    sources' class statistics and the shrinkage the rule chose on them — computed once per
    target, for every barycenter.

    Attributes
    ----------
    X : (n, d) the target's unlabeled adaptation rows
    messages : the sources' :func:`class_statistics`, one per source
    n_classes : C
    shrinkage : (ridge, shrink_to); record : the rule's record (:func:`choose_shrinkage`)
    choice : the head :func:`choose_head` chose (``lda`` or ``linear``), once it has run
    cem_iter : most relabelings of the pseudo-labels by classification EM
        (:func:`fedalign.dadil.classification_em.cem_lda`; 0: the one-pass head)
    """

    X: np.ndarray
    messages: list
    n_classes: int
    shrinkage: tuple
    record: dict = field(default_factory=dict)
    choice: str | None = None
    cem_iter: int = CEM_ITER

    def head(self, gmm) -> TargetHead:
        """The ``lda`` head of barycenter ``gmm`` (module docstring): pseudo-labels of the rows
        by ``gmm``'s MAP rule, the LDA of the sources' and these rows' class statistics."""
        from fedalign.gmm import map_predict

        if gmm.labels is None:
            raise FedalignError("the target's barycenter has no labels: cannot pseudo-label")
        if gmm.d != self.X.shape[1]:
            raise FedalignError(f"the barycenter has d={gmm.d}, the target's adaptation rows "
                                f"have d={self.X.shape[1]}")
        ridge, shrink_to = float(self.shrinkage[0]), str(self.shrinkage[1])
        y_hat = map_predict(gmm, self.X)
        cem = cem_lda(self.messages, self.X, y_hat, self.n_classes, ridge, shrink_to,
                      max_iter=self.cem_iter)
        head = cem.head
        record = dict(self.record,
                      pseudo_label_counts=np.bincount(y_hat, minlength=self.n_classes).tolist(),
                      classification_em=dict(cem.record(), max_iter=int(self.cem_iter),
                                             label_counts=np.bincount(
                                                 cem.labels, minlength=self.n_classes).tolist()),
                      n_target_rows=int(len(self.X)),
                      n_source_rows=int(sum(m["class_counts"].sum() for m in self.messages)),
                      ridge=ridge, shrink_to=shrink_to)
        return TargetHead(head, ridge, shrink_to, record)


def relabeled(g, messages: list, ridge: float, shrink_to: str):
    """``g`` (labeled or not) with each component labeled by the LDA of ``messages`` (other
    domains' class statistics) at the component's mean: the second stand-in of
    :func:`choose_head`."""
    from fedalign.gmm import GMM

    C = len(messages[0]["class_counts"])
    y = lda_from_statistics(messages, C, ridge, shrink_to).predict(g.means)
    return GMM(g.weights, g.means, g.variances, np.eye(C)[y], list(g.class_names),
               meta=dict(g.meta, labels="transferred"))


def stand_in_scores(g, messages, X_a, X_b, y_b, C, ridge, shrink_to, n_per_class,
                    seed) -> tuple:
    """(lda, linear) accuracies on half B of a stand-in ``g`` of B(α_T): ``lda`` = the LDA of
    ``messages`` and half A pseudo-labeled by g's MAP rule, one pass (module docstring: the
    rule scores the one-pass head); ``linear`` = logistic regression on samples of g."""
    from fedalign.gmm import map_predict
    from fedalign.gmm_head import train_head_from_gmm

    owners = np.unique(g.labels.argmax(1))
    if len(owners) < 2:     # transferred labels of one class: its samples train no classifier
        linear = float(np.mean(y_b == owners[0]))
    else:
        head = train_head_from_gmm(g, n_per_class=int(n_per_class), seed=int(seed))
        linear = float(np.mean(head.predict(X_b) == y_b))
    lda = one_pass_lda(messages, X_a, map_predict(g, X_a), C, ridge, shrink_to).accuracy(X_b, y_b)
    return float(lda), linear


def rule_halves(n: int, seed: int, i: int) -> tuple:
    """Source i's halves (A, B) of its n rows in :func:`choose_head` (seeded by ``seed``, i)."""
    perm = np.random.default_rng([int(seed), int(i), 29]).permutation(int(n))
    return perm[: n // 2], perm[n // 2:]


def choose_head(rows: TargetRows, source_gmms: list, sources: list, *, n_per_class: int = 500,
                seed: int = 0) -> str:
    """``lda`` or ``linear`` by leave-one-source-domain-out (module docstring, step 5).

    Parameters
    ----------
    rows : the target's :class:`TargetRows` (its sources' messages, in ``sources``' order,
        and its shrinkage); ``rows.choice`` and ``rows.record["head_rule"]`` are set
    source_gmms : the sources' labeled GMMs, fitted on ``sources`` (same coordinates): their
        fit options (``meta``) are those of the half-A GMMs the rule fits
        (:func:`fedalign.gmm.refit_gmm`)
    sources : list of (X_i (n_i, d), y_i (n_i,)) labeled source domains; a source whose
        half A holds fewer than 2 classes abstains (``abstained`` in the record); none left:
        ``lda`` (the tie)
    n_per_class, seed : the linear head's samples; ``seed`` also splits each source's rows

    Returns
    -------
    the chosen head's name
    """
    from fedalign.gmm import refit_gmm

    if len(source_gmms) != len(sources) or len(sources) != len(rows.messages):
        raise FedalignError(f"the head rule needs one labeled GMM per source: "
                            f"{len(source_gmms)} GMMs, {len(sources)} sources")
    ridge, shrink_to = float(rows.shrinkage[0]), str(rows.shrinkage[1])
    lda, lin, skipped = [], [], []
    stand_ins = {k: dict(lda=[], linear=[]) for k in ("own labels", "transferred")}
    for i, (g, (X, y)) in enumerate(zip(source_gmms, sources)):
        if g.labels is None or g.d != rows.X.shape[1]:
            raise FedalignError(f"source GMM {i} of the head rule is unlabeled or has d={g.d}, "
                                f"the features have d={rows.X.shape[1]}")
        X, y = np.asarray(X, np.float64), np.asarray(y)
        a, b = rule_halves(len(y), seed, i)
        if len(np.unique(y[a])) < 2:    # too few rows to play the target: it abstains
            skipped.append(i)
            continue
        g_a = refit_gmm(g, X[a], y[a], n_classes=rows.n_classes)   # B: out of sample for both
        others = [m for j, m in enumerate(rows.messages) if j != i]
        own, moved = (stand_in_scores(g_s, others, X[a], X[b], y[b], rows.n_classes, ridge,
                                      shrink_to, n_per_class, seed)
                      for g_s in (g_a, relabeled(g_a, others, ridge, shrink_to)))
        for name, (ld, li) in (("own labels", own), ("transferred", moved)):
            stand_ins[name]["lda"].append(ld)
            stand_ins[name]["linear"].append(li)
        lda.append(0.5 * (own[0] + moved[0]))
        lin.append(0.5 * (own[1] + moved[1]))
    rows.choice = "lda" if not lda or np.mean(lda) >= np.mean(lin) else "linear"
    rows.record["head_rule"] = dict(
        rule="leave-one-source-domain-out: each source's labeled GMM refitted on half A as the "
             "pseudo-target's barycenter, with its own labels and with labels transferred from "
             "the other sources' LDA; half A pseudo-labeled by it (one pass), both heads scored "
             "on half B; "
             "each head's score the mean over the two stand-ins",
        lda=lda, linear=lin, choice=rows.choice,
        stand_ins=stand_ins)
    if skipped:   # a source whose half A holds fewer than 2 classes (none left: the tie, lda)
        rows.record["head_rule"]["abstained"] = skipped
    return rows.choice


def target_rows(X_adapt, sources: list, n_classes: int, *, shrinkage=None,
                grid=SHRINKAGE_GRID, d: int | None = None, cem_iter: int = CEM_ITER) -> TargetRows:
    """:class:`TargetRows`, the shrinkage chosen by :func:`choose_shrinkage` unless given;
    ``cem_iter``: the head's classification EM (0: one pass).

    Every input must have ``d`` features (default: the adaptation rows'), every source label
    must be < ``n_classes``; one error otherwise.
    """
    if X_adapt is None or not sources:
        raise FedalignError("the lda head needs the target's adaptation rows and the labeled "
                            "sources")
    X = np.asarray(X_adapt, np.float64)
    d = X.shape[-1] if d is None else int(d)
    if X.ndim != 2 or len(X) == 0 or X.shape[1] != d:
        raise FedalignError(f"the target's adaptation rows have shape {X.shape}, the other "
                            f"features have d={d}")
    for i, (Xs, ys) in enumerate(sources):
        if np.asarray(Xs).shape[1] != d:
            raise FedalignError(f"source {i} of the lda head has d={np.asarray(Xs).shape[1]}, "
                                f"the other features have d={d}")
        if len(ys) and int(np.max(ys)) >= n_classes:
            raise FedalignError(f"source {i} of the lda head: label {int(np.max(ys))} out of "
                                f"range for C={n_classes}")
    msgs = [class_statistics(Xs, ys, n_classes) for Xs, ys in sources]
    if shrinkage is None:
        shrinkage, record = choose_shrinkage(sources, n_classes, grid, messages=msgs)
    else:
        record = dict(shrinkage_rule="given", grid=[], scores=[])
    if int(cem_iter) < 0:
        raise FedalignError(f"cem_iter must be >= 0, got {cem_iter}")
    return TargetRows(X, msgs, int(n_classes), tuple(shrinkage), record, cem_iter=int(cem_iter))


def fit_target_head(gmm, X_adapt, sources: list, n_classes: int, *, shrinkage=None,
                    grid=SHRINKAGE_GRID, cem_iter: int = CEM_ITER) -> TargetHead:
    """The target's ``lda`` head of one barycenter: ``target_rows(...).head(gmm)``.

    Parameters
    ----------
    gmm : the target's labeled barycenter B(α_T; atoms) (:class:`fedalign.gmm.GMM`)
    X_adapt : (n, d) the target's unlabeled adaptation rows (never its test rows)
    sources : list of (X_i (n_i, d), y_i (n_i,)) labeled source domains, in the coordinates
        the dictionary was learned in
    n_classes : C
    shrinkage : (ridge, shrink_to), or None: :func:`choose_shrinkage` on the sources
    grid : the candidates of the rule
    cem_iter : most relabelings by classification EM (0: the one-pass head)

    Returns
    -------
    :class:`TargetHead`
    """
    if gmm.labels is None:
        raise FedalignError("the target's barycenter has no labels: cannot pseudo-label")
    return target_rows(X_adapt, sources, n_classes, shrinkage=shrinkage, grid=grid,
                       d=gmm.d, cem_iter=cem_iter).head(gmm)

"""The classifiers a DaDiL evaluation compares: heads on labeled GMMs, and the baselines.

- :func:`gmm_classifier`: a head on any labeled GMM — ``linear``, a logistic-regression head
  trained on ``n_per_class`` samples per class of the GMM, or ``map``, the MAP rule
  argmax_c Σ_k P(k | x) V_kc (:data:`CLASSIFIERS`);
- :func:`target_classifier`: the DeFed target client's barycenter B(α_T; atoms)
  (:func:`fedalign.dadil.state.client_barycenter`) → head;
- :func:`oracle_classifier`: the ceiling, the target's GMM fitted *with* its labels → head;
- :func:`centralized_barycenter` / :func:`centralized_classifier`: GMM-DaDiL learned in one
  process (:func:`fedalign.dadil.dictionary.learn_dictionary`) → head;
- :func:`source_only_classifier`: standardised logistic regression on the pooled labeled
  source features, its C chosen by leave-one-source-domain-out cross-validation on the sources
  (the target is never looked at), with its own head :data:`SOURCE_ONLY_HEAD`.

:func:`accuracy` (:func:`fedalign.metrics.accuracy`, the package's one) scores any of them.
Every evaluation of :mod:`fedalign.dadil.evaluation` builds its rows from these functions.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedalign.dadil.barycenter import atoms_barycenter
from fedalign.dadil.dictionary import learn_dictionary
from fedalign.dadil.state import client_barycenter
from fedalign.errors import FedalignError
from fedalign.metrics import accuracy  # noqa: F401  (re-exported: the package's one accuracy)


#: Heads of every GMM-based row: linear (head on labeled GMM samples) and MAP.
CLASSIFIERS = ("linear", "map")
#: The head on the target's own rows (:mod:`fedalign.dadil.target_head`): pseudo-labels by the
#: GMM's MAP rule, an LDA of the sources' and the target's class statistics.
ROWS_HEAD = "lda"
#: ``lda`` or ``linear``, chosen per target by a rule on the sources
#: (:func:`fedalign.dadil.target_head.choose_head`).
AUTO_HEAD = "auto"
#: Every head a GMM-based row can have.
HEADS = CLASSIFIERS + (ROWS_HEAD, AUTO_HEAD)
#: The head of the source-only row: logistic regression on real source features.
SOURCE_ONLY_HEAD = "logreg"
SOURCE_ONLY, ORACLE, CENTRALIZED = "source-only", "oracle", "centralized"
#: Longer names of the baseline rows, for tables.
METHOD_LABELS = {SOURCE_ONLY: "source-only (C by CV on sources)",
                 ORACLE: "oracle (labeled target GMM)",
                 CENTRALIZED: "centralized GMM-DaDiL"}
#: The C grid of the source-only baseline (see :func:`source_only_classifier`).
SOURCE_ONLY_CS = tuple(float(c) for c in 10.0 ** np.arange(-4.0, 2.01, 0.5))


# --------------------------------------------------------------------------------------------
# Accuracy and heads
# --------------------------------------------------------------------------------------------


def check_classifier(classifier: str) -> str:
    """``classifier`` must be one of :data:`HEADS`."""
    if classifier not in HEADS:
        raise FedalignError(f"classifier must be one of {', '.join(HEADS)}, "
                            f"got {classifier!r}")
    return classifier


def parse_classifiers(values) -> tuple:
    """``["linear,map"]``, ``["linear", "map"]`` or ``None`` (both) → a tuple of unique heads."""
    out = []
    for v in values or [",".join(CLASSIFIERS)]:
        for tok in filter(None, (t.strip() for t in str(v).split(","))):
            if check_classifier(tok) not in out:
                out.append(tok)
    if not out:
        raise FedalignError(f"give at least one classifier ({', '.join(CLASSIFIERS)})")
    return tuple(out)


def gmm_classifier(gmm, classifier: str = "linear", n_per_class: int = 500, seed: int = 0,
                   rows=None):
    """A predict function X (n, d) → (n,) from a labeled GMM.

    ``linear``: logistic-regression head (standardised, C = 1) trained on ``n_per_class``
    labeled samples per class drawn with ``seed`` (:func:`fedalign.gmm_head.train_head_from_gmm`);
    ``map``: the MAP rule argmax_c Σ_k P(k | x) V_kc (:func:`fedalign.gmm.map_predict`),
    which does not depend on the seed; ``lda``: the head on the target's own rows
    (``rows``, a :class:`fedalign.dadil.target_head.TargetRows`), which does not depend on
    the seed either; ``auto``: whichever of ``lda`` and ``linear`` ``rows.choice`` names.
    """
    from fedalign.gmm import map_predict
    from fedalign.gmm_head import train_head_from_gmm

    check_classifier(classifier)
    if gmm.labels is None:
        raise FedalignError("the GMM has no labels: cannot build a classifier from it")
    if classifier == AUTO_HEAD:
        if rows is None or rows.choice is None:
            raise FedalignError("the auto head needs the target's adaptation rows, the labeled "
                                "sources and their GMMs")
        classifier = rows.choice
    if classifier == ROWS_HEAD:
        if rows is None:
            raise FedalignError("the lda head needs the target's adaptation rows and the "
                                "labeled sources")
        return rows.head(gmm).predict
    if classifier == "map":
        return lambda X: map_predict(gmm, np.asarray(X, np.float64))
    head = train_head_from_gmm(gmm, n_per_class=int(n_per_class), seed=int(seed))
    return lambda X: head.predict(np.asarray(X, np.float64))


def target_classifier(state, classifier: str = "linear", n_per_class: int = 500, seed: int = 0):
    """The target client's classifier: its labeled barycenter
    (:func:`fedalign.dadil.state.client_barycenter`, B(α_T; atoms)) → head
    (:func:`gmm_classifier`)."""
    return gmm_classifier(client_barycenter(state), classifier, n_per_class, seed)


def oracle_classifier(target_gmm_labeled, classifier: str = "linear", n_per_class: int = 500,
                      seed: int = 0):
    """The ceiling: the target's GMM fitted *with* its adaptation-split labels → the same head
    as DaDiL (:func:`gmm_classifier`). What a GMM-based method could reach with target labels."""
    if target_gmm_labeled.labels is None:
        raise FedalignError("the oracle needs the target's GMM fitted with labels "
                            "(fit-gmm on the labeled adaptation split)")
    return gmm_classifier(target_gmm_labeled, classifier, n_per_class, seed)


def centralized_barycenter(gmms: list, target_index: int, seed: int = 0, **dictionary_kwargs):
    """Centralized GMM-DaDiL: :func:`fedalign.dadil.dictionary.learn_dictionary` on all GMMs in
    one process, then the target's labeled barycenter B(α_T; atoms).

    Parameters
    ----------
    gmms : list of GMM (sources labeled, ``gmms[target_index]`` used unlabeled)
    seed : seed of the dictionary learning (its atom initialisation)
    dictionary_kwargs : passed to ``learn_dictionary`` unchanged (n_atoms, n_iter, lr, …)

    Returns
    -------
    (GMM B(α_T; atoms) with K components, the loss curves of ``learn_dictionary``:
    :attr:`~fedalign.dadil.dictionary.LearnedDictionary.history`)
    """
    learned = learn_dictionary(gmms, target_index, seed=int(seed), **dictionary_kwargs)
    return (atoms_barycenter(learned.atoms, np.asarray(learned.alphas[target_index], np.float64)),
            learned.history)


def centralized_classifier(gmms: list, target_index: int, classifier: str = "linear",
                           n_per_class: int = 500, seed: int = 0, **dictionary_kwargs):
    """Baseline: centralized GMM-DaDiL (:func:`centralized_barycenter`) → the same head as DeFed.

    Returns
    -------
    (predict, history of ``learn_dictionary``)
    """
    B, hist = centralized_barycenter(gmms, target_index, seed=seed, **dictionary_kwargs)
    return gmm_classifier(B, classifier, n_per_class, seed), hist


# --------------------------------------------------------------------------------------------
# Source-only, regularisation chosen on the sources
# --------------------------------------------------------------------------------------------


def _labeled(sources) -> list:
    """[(X float64 (n_i, d), y int64 (n_i,))] of the labeled rows of every source domain."""
    out = []
    for i, (X, y) in enumerate(sources):
        X, y = np.asarray(X, np.float64), np.asarray(y).astype(np.int64)
        if X.ndim != 2 or y.shape != (X.shape[0],):
            raise FedalignError(f"source {i}: features {X.shape} and labels {y.shape} disagree")
        keep = y >= 0
        if not np.any(keep):
            raise FedalignError(f"source {i} has no labeled rows")
        out.append((X[keep], y[keep]))
    if not out:
        raise FedalignError("the source-only baseline needs at least one labeled source")
    if len({X.shape[1] for X, _ in out}) > 1:
        raise FedalignError("source domains have different dimensions: "
                            + ", ".join(str(X.shape[1]) for X, _ in out))
    return out


def _cv_folds(sources: list, cv: str, seed: int) -> tuple[str, list]:
    """(name, [(train X, train y, held-out X, held-out y)]) of the cross-validation."""
    if cv not in ("lodo", "kfold"):
        raise FedalignError(f"cv must be 'lodo' or 'kfold', got {cv!r}")
    if cv == "lodo" and len(sources) > 1:
        folds = []
        for i in range(len(sources)):
            rest = [s for j, s in enumerate(sources) if j != i]
            folds.append((np.concatenate([X for X, _ in rest]),
                          np.concatenate([y for _, y in rest]), *sources[i]))
        return "leave-one-source-domain-out", folds
    from sklearn.model_selection import StratifiedKFold

    X = np.concatenate([X for X, _ in sources])
    y = np.concatenate([y for _, y in sources])
    n_splits = int(min(5, np.bincount(y).max()))
    if n_splits < 2:
        raise FedalignError("too few labeled source rows to cross-validate C")
    with warnings.catch_warnings():  # classes with fewer than 5 rows: sklearn warns, still splits
        warnings.simplefilter("ignore", UserWarning)
        splits = list(StratifiedKFold(n_splits, shuffle=True, random_state=int(seed)).split(X, y))
    return f"stratified {n_splits}-fold", [(X[a], y[a], X[b], y[b]) for a, b in splits]


def _path_scores(Xtr, ytr, Xva, yva, Cs, max_iter: int) -> tuple[list, list]:
    """Held-out accuracy of the standardised logistic regression for every C (ascending),
    lbfgs warm-started along the path; also the Cs whose fit hit ``max_iter``."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    if len(np.unique(ytr)) < 2:
        raise FedalignError("a cross-validation training fold has a single class: "
                            "cannot choose C (give more source domains or rows)")
    sc = StandardScaler().fit(Xtr)
    Ztr, Zva = sc.transform(Xtr), sc.transform(Xva)
    clf = LogisticRegression(C=Cs[0], max_iter=int(max_iter), warm_start=True)
    scores, stalled = [], []
    for c in Cs:
        clf.set_params(C=c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(Ztr, ytr)
        if np.max(clf.n_iter_) >= int(max_iter):
            stalled.append(c)
        scores.append(float(np.mean(clf.predict(Zva) == yva)))
    return scores, stalled


def source_only_classifier(sources, *, seed: int = 0, Cs=SOURCE_ONLY_CS, cv: str = "lodo",
                           max_iter: int = 1000):
    """Baseline: standardised logistic regression on the pooled labeled sources, its C chosen
    by cross-validation on the sources only.

    Cross-validation (``cv="lodo"``): for every source domain i, train on all the other
    sources and score on source i; the score of C is the mean of these held-out accuracies
    (every source domain counts once). The held-out domain plays the part of an unseen domain,
    which is what the target is, so C is chosen for robustness to a domain shift rather than
    for in-domain fit. With a single source (or ``cv="kfold"``): stratified 5-fold CV on the
    pooled rows, shuffled with ``seed``. The best mean score wins; ties go to the smallest C
    (the stronger regularisation). The classifier is then refitted on all sources.

    The grid :data:`SOURCE_ONLY_CS` = 10^{−4}, 10^{−3.5}, …, 10^{2} (13 values, half a decade
    apart) was fixed a priori, without looking at any data: on standardised features scikit-
    learn's objective C Σ_i loss_i + ½‖w‖² goes from nearly the nearest-class-mean rule
    (C = 10^{−4} with ~10³ rows) to practically unregularised (C = 10², where frozen 1280-d
    features of a few thousand rows are separable); half-decade steps are finer than scikit-
    learn's ``LogisticRegressionCV`` default (10 values over 8 decades).

    Fits: lbfgs, warm-started along the C path (ascending), ``max_iter`` iterations at most;
    one process (threads: the caller's BLAS limit, e.g. :func:`fedalign.threads.limit_threads`).
    Deterministic given the sources (and ``seed`` with k-fold CV).

    Parameters
    ----------
    sources : list of (X (n_i, d), y (n_i,)) per source domain; rows with y = −1 are dropped
    seed : shuffles the k-fold splits (unused with leave-one-domain-out)
    Cs : candidate C values (one value: no cross-validation)

    Returns
    -------
    predict : callable X (n, d) → (n,)
    record : dict — ``C`` (chosen), ``Cs``, ``cv`` (the scheme), ``scores`` (mean held-out
        accuracy per C), ``fold_scores`` (per fold, per C), ``not_converged`` (Cs whose fit hit
        ``max_iter`` in some fold)
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    src = _labeled(sources)
    Cs = sorted(float(c) for c in np.atleast_1d(Cs))
    if not Cs or not all(np.isfinite(c) and c > 0 for c in Cs):
        raise FedalignError(f"source-only C values must be > 0, got {Cs}")
    record = dict(Cs=Cs, cv="none", scores=[], fold_scores=[], not_converged=[])
    if len(Cs) == 1:
        best = Cs[0]
    else:
        record["cv"], folds = _cv_folds(src, cv, seed)
        stalled = set()
        for Xtr, ytr, Xva, yva in folds:
            s, st = _path_scores(Xtr, ytr, Xva, yva, Cs, max_iter)
            record["fold_scores"].append(s)
            stalled.update(st)
        record["scores"] = [float(v) for v in np.mean(record["fold_scores"], axis=0)]
        record["not_converged"] = sorted(stalled)
        best = Cs[int(np.argmax(record["scores"]))]  # first maximum: the smallest C
    record["C"] = best
    X = np.concatenate([X for X, _ in src])
    y = np.concatenate([y for _, y in src])
    if len(np.unique(y)) < 2:
        raise FedalignError("the labeled sources hold a single class: cannot train a classifier")
    from sklearn.exceptions import ConvergenceWarning

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=best, max_iter=int(max_iter)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    return (lambda Z: clf.predict(np.asarray(Z, np.float64))), record

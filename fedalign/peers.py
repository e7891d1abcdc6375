"""Domain-adaptation peers: the shallow DA methods a DA table sets next to DeFed-GMM-DaDiL.

For one target domain T, given the labeled source domains [(X_i, y_i)], T's adaptation rows
X_a (always seen **unlabeled**) and T's labeled test rows (X_t, y_t), every peer row is an
adaptation (X_i, X_a, X_t) → (Z_i, Z_a, Z_t) followed by the one head ``logreg``: a
standardised logistic regression ``LogisticRegression(C, max_iter=1000)`` with the C that
:func:`fedalign.dadil.classifiers.source_only_classifier` chose on the sources (the target is
never looked at), trained on the pooled adapted sources (Z_i, y_i) and scored on the adapted
test rows Z_t (:func:`fedalign.metrics.accuracy`). The standardisation is skada's pipeline's,
``make_da_pipeline(adapter, StandardScaler(), LogisticRegression(C))``: the scaler is fitted
on the adapted sources *and* the adapted adaptation rows Z_a (unlabeled). Fitted on the
sources alone (source-only's rule), a word that is rare in the sources and common in the
target blows up on the target's rows: LinearOTMapping fell to chance on Amazon review's dvd.

Rows (:data:`PEER_ROWS`), every hyperparameter fixed a priori, none tuned on a target:

- ``coral`` — skada's ``CORALAdapter(reg="auto")`` (Sun, Feng & Saenko, *Correlation
  Alignment for Unsupervised Domain Adaptation*, 2017): the pooled sources centred, whitened
  by Σ_s^{−1/2} and coloured by Σ_a^{1/2} (skada's default covariance: Ledoit–Wolf on the
  standardised columns, scaled back); the target's rows centred on the mean of X_a;
- ``sa`` — skada's ``SubspaceAlignmentAdapter`` (Fernando et al., *Unsupervised Visual
  Domain Adaptation Using Subspace Alignment*, ICCV 2013): sources projected on their PCA
  basis P_s and aligned by M = P_s P_aᵀ, target rows projected on P_a; ``n_components`` =
  min(d, n_s, n_a) — skada's default keeps every component, capped here so that both PCAs
  exist when a domain has fewer rows than dimensions — and ``random_state=0``;
- ``linear-ot`` — skada's ``LinearOTMappingAdapter(reg=1.0, bias=True)`` (Flamary, Lounici
  & Ferrari, *Concentration bounds for linear Monge mapping estimation and optimal transport
  domain adaptation*, 2019), the ``reg`` of skada's ``LinearOTMapping`` pipeline: the pooled
  sources moved by the Gaussian Monge map x ↦ A (x − μ_s) + μ_a fitted on Σ_s + I and
  Σ_a + I; target rows unchanged;
- ``slot-align-tau1`` and ``slot-align`` — SLOT-Align used as DA: every domain, the target
  included (its X_a), summarised by n, μ and the Ledoit–Wolf covariance
  (:func:`fedalign.stats.shrunk_covariance`), their Bures–Wasserstein barycenter with
  sample weights (:func:`fedalign.align.make_reference`, tolerance :data:`BARYCENTER_TOL`)
  and each domain's map to it (:func:`fedalign.align.client_maps`) along the geodesic
  T_τ(z) = ((1 − τ) I + τ A) z + τ b (:func:`fedalign.gaussian.interpolate_map`) at τ = 1
  and at the default τ (:data:`fedalign.defaults.TAU`); the head on the mapped sources, the test rows mapped with
  the target's own map;
- ``slot-to-target`` — SLOT toward the target: the reference is the target's own Gaussian
  N(μ_a, Σ_a) (Ledoit–Wolf), each source mapped onto it at τ = 1 by the Gaussian OT map
  A_i = Σ_a^{1/2} (Σ_a^{1/2} Σ_i Σ_a^{1/2})^{−1/2} Σ_a^{1/2}, b_i = μ_a − A_i μ_i
  (:func:`fedalign.gaussian.ot_maps` through :func:`fedalign.align.client_maps`); test rows
  unchanged. A federated LinearOTMapping that needs one exchange (the target sends n, μ_a,
  Σ_a) and no regularisation constant;
- ``ceiling`` — the head trained on the target's *labeled* adaptation rows (only when their
  labels are given): what a target-trained classifier reaches.

Every row is deterministic (its seeds only repeat it, as for source-only). A row that fails
on a target (a covariance that is not positive definite, too few rows, skada raising) is kept
as failed: NaN accuracy and the record ``{"failed": reason}``; the other rows go on.

skada is optional (the ``da`` extra, ``pip install 'fedalign[da]'``): importing this module
does not import it; asking for a skada row without it raises :class:`FedalignError`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from fedalign import defaults
from fedalign.errors import FedalignError

#: Barycenter tolerance (``barycenter``'s: 1e-10; Office webcam s0: 7 iterations, not 11, 6.5e-8 off)
BARYCENTER_TOL = 1e-6
#: Every peer row, in table order.
PEER_ROWS = ("coral", "sa", "linear-ot", "slot-align-tau1", "slot-align", "slot-to-target",
             "ceiling")
#: The rows computed by skada (the ``da`` extra).
SKADA_ROWS = ("coral", "sa", "linear-ot")
#: The one head of every peer row (source-only's: :data:`SOURCE_ONLY_HEAD`).
PEER_HEAD = "logreg"
#: Longer names of the rows, for tables.
PEER_LABELS = {
    "coral": "CORAL (skada, reg auto)",
    "sa": "SubspaceAlignment (skada)",
    "linear-ot": "LinearOTMapping (skada, reg 1)",
    "slot-align-tau1": "SLOT-Align as DA, τ=1",
    "slot-align": f"SLOT-Align as DA, τ={defaults.TAU:g}",
    "slot-to-target": "SLOT toward the target's Gaussian, τ=1",
    "ceiling": "ceiling: trained on the target's labeled adaptation rows",
}
#: Iterations of the head's lbfgs (as source-only); what to install for the skada rows; the
#: target's skada domain id (skada: sources positive, targets negative).
MAX_ITER, DA_EXTRA, _TARGET = 1000, "pip install 'fedalign[da]'", -1


@dataclass
class PeerResult:
    """The peer rows of one target domain.

    Attributes
    ----------
    seeds : list of int (every row is deterministic: its accuracy repeated per seed)
    n_test : labeled test rows scored
    C : the head's regularisation (source-only's choice)
    accuracy : {row: {"logreg": [accuracy per seed]}}, NaN for a failed row
    records : {row: settings} (the hyperparameters, the head's C and convergence), or
        {row: {"failed": reason}}
    """

    seeds: list
    n_test: int
    C: float
    accuracy: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)

    def failed(self) -> dict:
        """{row: reason} of the rows that failed."""
        return {r: rec["failed"] for r, rec in self.records.items() if "failed" in rec}

    def to_json(self) -> dict:
        """JSON-ready dict (NaN accuracies as null, so ``allow_nan=False`` writers accept it)."""
        acc = {r: {h: [None if math.isnan(a) else a for a in v] for h, v in heads.items()}
               for r, heads in self.accuracy.items()}
        return dict(seeds=list(self.seeds), n_test=self.n_test, C=self.C, accuracy=acc,
                    records=self.records)


def check_rows(rows) -> tuple:
    """``rows`` (names of :data:`PEER_ROWS`) as a tuple, unique, in the order given; a skada
    row needs skada installed (else :class:`FedalignError` naming the ``da`` extra)."""
    rows = tuple(dict.fromkeys(str(r) for r in rows))
    unknown = [r for r in rows if r not in PEER_ROWS]
    if unknown:
        raise FedalignError(f"unknown peer row {unknown[0]!r} (rows: {', '.join(PEER_ROWS)})")
    if not rows:
        raise FedalignError(f"give at least one peer row ({', '.join(PEER_ROWS)})")
    if any(r in SKADA_ROWS for r in rows):
        import importlib.util

        if importlib.util.find_spec("skada") is None:   # found, not imported (it loads torch)
            raise FedalignError(f"the peer rows {', '.join(SKADA_ROWS)} need skada, which is "
                                f"not installed: {DA_EXTRA}")
    return rows


def _rows_stats(X, where: str):
    """n, mean and Ledoit–Wolf covariance of the rows X (n, d) (:mod:`fedalign.stats`)."""
    from fedalign.stats import gaussian_stats

    return gaussian_stats(np.asarray(X, np.float64), "auto", where)


def _mapped(X, amap, tau: float) -> np.ndarray:
    """T_τ(X) in float64 (:func:`fedalign.gaussian.interpolate_map`)."""
    from fedalign.gaussian import interpolate_map

    At, bt = interpolate_map(amap.A, amap.b, tau)
    return np.asarray(X, np.float64) @ At.T + bt


def _skada_adapted(adapter, sources, X_adapt, X_test) -> tuple:
    """Fit a skada adapter on the sources (ids 1…K) and the target's adaptation rows (id −1,
    labels masked), then transform the sources, the adaptation rows and the test rows, as
    skada's pipelines do (``allow_source`` for the sources, the target's id for its rows)."""
    Xs = np.concatenate([X for X, _ in sources])
    sd_s = np.concatenate([np.full(len(X), i + 1) for i, (X, _) in enumerate(sources)])
    X = np.concatenate([Xs, X_adapt])
    sd = np.concatenate([sd_s, np.full(len(X_adapt), _TARGET)])
    y = np.concatenate([np.concatenate([y for _, y in sources]), np.full(len(X_adapt), -1)])
    adapter.fit(X, y, sample_domain=sd)
    Zs = adapter.transform(Xs, sample_domain=sd_s, allow_source=True)
    Za, Zt = (adapter.transform(Z, sample_domain=np.full(len(Z), _TARGET))
              for Z in (X_adapt, X_test))
    return [np.asarray(Zs, np.float64)], np.asarray(Za, np.float64), np.asarray(Zt, np.float64)


class _Adapt:
    """The adaptations of one target, sharing the SLOT-Align maps between the two τ rows."""

    def __init__(self, sources, X_adapt, X_test, y_adapt=None):
        self.sources, self.X_adapt, self.X_test, self.y_adapt = sources, X_adapt, X_test, y_adapt
        self._slot = self._stats = None

    def __call__(self, row: str) -> tuple:
        """(Z_train (N, d'), y_train (N,), Z_adapt (n_a, d'), Z_test (n_t, d'), settings,
        what Z_train is)."""
        if row == "ceiling":
            if self.y_adapt is None:
                raise FedalignError("the ceiling needs labels of the target's adaptation rows")
            keep = self.y_adapt >= 0
            return (self.X_adapt[keep], self.y_adapt[keep], self.X_adapt, self.X_test,
                    dict(method="trained on the target's labeled adaptation rows",
                         n=int(keep.sum())), "the target's labeled adaptation rows")
        Zs, Za, Zt, settings = getattr(self, "_" + row.replace("-", "_"))()
        return (_finite(np.concatenate(Zs), "source features"),
                np.concatenate([y for _, y in self.sources]),
                _finite(Za, "adaptation features"), _finite(Zt, "test features"), settings,
                "the labeled sources")

    def _coral(self):
        from skada import CORALAdapter

        return (*_skada_adapted(CORALAdapter(reg="auto"), self.sources, self.X_adapt,
                                self.X_test), dict(method="skada.CORALAdapter", reg="auto"))

    def _sa(self):
        from skada import SubspaceAlignmentAdapter

        k = int(min(self.X_test.shape[1], sum(len(X) for X, _ in self.sources),
                    len(self.X_adapt)))
        return (*_skada_adapted(SubspaceAlignmentAdapter(n_components=k, random_state=0),
                                self.sources, self.X_adapt, self.X_test),
                dict(method="skada.SubspaceAlignmentAdapter", n_components=k,
                     n_components_rule="min(d, source rows, target adaptation rows)",
                     random_state=0))

    def _linear_ot(self):
        from skada import LinearOTMappingAdapter

        return (*_skada_adapted(LinearOTMappingAdapter(reg=1.0, bias=True), self.sources,
                                self.X_adapt, self.X_test),
                dict(method="skada.LinearOTMappingAdapter", reg=1.0, bias=True))

    def _domain_stats(self) -> list:
        """Every source's stats, then the target's (its adaptation rows)."""
        if self._stats is None:
            stats = [_rows_stats(X, f"source {i}") for i, (X, _) in enumerate(self.sources)]
            self._stats = stats + [_rows_stats(self.X_adapt, "the target's adaptation rows")]
        return self._stats

    def _slot_maps(self):
        """The barycenter of every domain's stats and each domain's map to it (τ = 1)."""
        if self._slot is None:
            from fedalign.align import client_maps, make_reference

            stats = self._domain_stats()
            ref = make_reference(stats, weights="samples", tol=BARYCENTER_TOL)
            self._slot = (client_maps(stats, ref), ref)
        return self._slot

    def _slot_align(self, tau: float = defaults.TAU):
        maps, ref = self._slot_maps()
        Zs = [_mapped(X, m, tau) for (X, _), m in zip(self.sources, maps)]
        return Zs, _mapped(self.X_adapt, maps[-1], tau), _mapped(self.X_test, maps[-1], tau), dict(
            method="SLOT-Align as DA (every domain to the Bures barycenter)", tau=float(tau),
            weights="samples", shrinkage="ledoit-wolf",
            barycenter=ref.meta.get("convergence"))

    def _slot_align_tau1(self):
        return self._slot_align(1.0)

    def _slot_to_target(self):
        from fedalign.align import Reference, client_maps

        *stats, t = self._domain_stats()
        ref = Reference(t.mean, t.covariance, np.ones(1), np.array([t.n]),
                        dict(reference="the target's Gaussian"))
        Zs = [_mapped(X, m, 1.0) for (X, _), m in zip(self.sources, client_maps(stats, ref))]
        return Zs, self.X_adapt, self.X_test, dict(
            method="sources mapped onto the target's Gaussian", tau=1.0,
            shrinkage="ledoit-wolf", target_shrinkage=float(t.shrinkage))


def _head(C: float, X, y, Z_adapt, what: str):
    """The ``logreg`` head, as ``make_da_pipeline(adapter, StandardScaler(),
    LogisticRegression(C))`` fits it: the scaler on the adapted training rows X and the adapted
    target rows Z_adapt (unlabeled), the regression on X, labeled ``y`` (``what``). Returns
    (predict, whether lbfgs converged within :data:`MAX_ITER` iterations)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(np.unique(y)) < 2:
        raise FedalignError(f"{what} hold a single class: no classifier to train")
    sc = StandardScaler().fit(np.concatenate([X, Z_adapt]))
    lr = LogisticRegression(C=float(C), max_iter=MAX_ITER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        lr.fit(sc.transform(X), y)
    return make_pipeline(sc, lr).predict, bool(np.max(lr.n_iter_) < MAX_ITER)


def _finite(Z, what: str) -> np.ndarray:
    Z = np.asarray(Z, np.float64)
    if not np.all(np.isfinite(Z)):
        raise FedalignError(f"the adapted {what} are not finite")
    return Z


def _reason(e: Exception) -> str:
    """One line: the exception's message (its type when it is not a FedalignError)."""
    msg = (str(e).strip().splitlines() or [""])[0][:300]
    return msg if isinstance(e, FedalignError) else f"{type(e).__name__}: {msg}"


def adapt_features(row: str, sources, X_adapt, X_test, y_adapt=None) -> tuple:
    """One peer row's training and test features (what :func:`evaluate_peers` trains and
    scores its head on).

    Parameters
    ----------
    row : one of :data:`PEER_ROWS`
    sources : list of (X_i (n_i, d), y_i (n_i,)) labeled source domains (y = −1 rows dropped)
    X_adapt : (n_a, d) the target's adaptation rows (seen unlabeled)
    X_test : (n_t, d) the target's test rows
    y_adapt : (n_a,) labels of X_adapt (−1 = none), used only by ``ceiling``

    Returns
    -------
    (Z_train (N, d'), y_train (N,), Z_adapt (n_a, d'), Z_test (n_t, d'), settings dict);
    d' = d except ``sa``
    """
    from fedalign.dadil.classifiers import _labeled

    check_rows([row])
    ya = None if y_adapt is None else np.asarray(y_adapt).astype(np.int64)
    return _Adapt(_labeled(sources), np.asarray(X_adapt, np.float64),
                  np.asarray(X_test, np.float64), ya)(row)[:5]


def _check_target(d: int, X_adapt, X_test, y_test, y_adapt) -> tuple:
    """The target's rows as float64, its labeled test rows, and y_adapt (None: no label)."""
    X_adapt, X_test = np.asarray(X_adapt, np.float64), np.asarray(X_test, np.float64)
    y_test = np.asarray(y_test).astype(np.int64)
    for what, X in (("the target's adaptation rows", X_adapt), ("the target's test rows", X_test)):
        if X.ndim != 2 or X.shape[1] != d:
            raise FedalignError(f"{what} have shape {X.shape}, the sources have d={d}")
    if y_test.shape != (len(X_test),):
        raise FedalignError(f"test features {X_test.shape} and labels {y_test.shape} disagree")
    if not np.any(y_test >= 0):
        raise FedalignError("the target's test rows have no labels")
    if y_adapt is not None:
        y_adapt = np.asarray(y_adapt).astype(np.int64)
        if y_adapt.shape != (len(X_adapt),):
            raise FedalignError(f"adaptation features {X_adapt.shape} and labels "
                                f"{y_adapt.shape} disagree")
    has_labels = y_adapt is not None and np.any(y_adapt >= 0)
    return X_adapt, X_test[y_test >= 0], y_test[y_test >= 0], y_adapt if has_labels else None


def evaluate_peers(sources, X_adapt, X_test, y_test, *, C=None, seeds=(0,), y_adapt=None,
                   rows=PEER_ROWS, progress=None) -> PeerResult:
    """Score the peer rows on one target's labeled test rows.

    Parameters
    ----------
    sources : list of (X_i (n_i, d), y_i (n_i,)) labeled source domains
    X_adapt : (n_a, d) the target's adaptation rows, used unlabeled by every adapting row
    X_test : (n_t, d), y_test : (n_t,) the target's test rows (y = −1 rows not scored)
    C : the head's C — the record ``C`` of :func:`fedalign.dadil.classifiers.
        source_only_classifier` on the same sources; None: that rule is run here
    seeds : the rows are deterministic: one accuracy per seed, repeated
    y_adapt : (n_a,) labels of X_adapt (−1 = none); the ``ceiling`` row is computed only
        when some are given (never used by the other rows)
    rows : names of :data:`PEER_ROWS`
    progress : optional callable(k), advanced once per row

    Returns
    -------
    :class:`PeerResult`; a row that fails has NaN accuracy and the record
    ``{"failed": reason}`` (with ``warnings``, the warnings a row raised, if any), and the
    other rows go on
    """
    from fedalign.dadil.classifiers import _labeled, source_only_classifier
    from fedalign.metrics import accuracy

    rows = check_rows(rows)
    src = _labeled(sources)
    X_adapt, X_test, y_test, y_adapt = _check_target(src[0][0].shape[1], X_adapt, X_test,
                                                     y_test, y_adapt)
    rows = tuple(r for r in rows if r != "ceiling" or y_adapt is not None)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise FedalignError("give at least one seed")
    C = float(source_only_classifier(src)[1]["C"] if C is None else C)
    if not (math.isfinite(C) and C > 0):
        raise FedalignError(f"the head's C must be > 0, got {C}")
    res = PeerResult(seeds, int(len(y_test)), C)
    adapt = _Adapt(src, X_adapt, X_test, y_adapt)
    for row in rows:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                Ztr, ytr, Za, Zt, settings, what = adapt(row)
                predict, converged = _head(C, Ztr, ytr, Za, what)
                acc = accuracy(predict, Zt, y_test)
                res.records[row] = dict(settings, head=PEER_HEAD, C=C, converged=converged)
            except Exception as e:  # a peer that fails on this target is reported, not hidden
                acc = float("nan")
                res.records[row] = dict(failed=_reason(e))
        if caught:  # kept in the record, not printed: numpy / scikit-learn warnings of the row
            res.records[row]["warnings"] = sorted({f"{w.category.__name__}: {w.message}"
                                                   for w in caught})
        res.accuracy[row] = {PEER_HEAD: [float(acc)] * len(seeds)}
        if progress is not None:
            progress(1)
    return res


def add_peer_rows(result, peer_result: PeerResult):
    """Merge the peer rows into a :class:`fedalign.dadil.evaluation.TargetResult` (in place;
    returned).

    A successful row joins ``result.accuracy`` ({row: {"logreg": [per seed]}}) and
    ``result.records``. A failed row joins ``result.records`` only, as ``{"failed": reason}``:
    its NaN accuracy stays out of ``accuracy`` and so out of the summary, which the JSON
    report (``allow_nan=False``) and ``fedalign report`` require to be numbers.
    """
    if list(result.seeds) != list(peer_result.seeds):
        raise FedalignError(f"peer rows for seeds {peer_result.seeds}, the target's result "
                            f"has seeds {list(result.seeds)}")
    if int(result.n_test) != int(peer_result.n_test):
        raise FedalignError(f"peer rows scored on {peer_result.n_test} test rows, the target's "
                            f"result on {result.n_test}")
    taken = [r for r in peer_result.records if r in result.accuracy or r in result.records]
    if taken:
        raise FedalignError(f"peer row {taken[0]!r} is already a row of the target's result")
    for row, rec in peer_result.records.items():
        if "failed" not in rec:
            result.accuracy[row] = {h: list(a) for h, a in peer_result.accuracy[row].items()}
        result.records[row] = dict(rec)
    return result


def evaluate_peers_files(test, sources, target_adapt, *, C=None, seeds=(0,), rows=PEER_ROWS,
                         progress=None) -> PeerResult:
    """:func:`evaluate_peers` from files (what ``fedalign dadil-evaluate --peers`` calls).

    Parameters
    ----------
    test : the target's test split (.h5, labeled)
    sources : labeled source feature files (.h5), one per source domain
    target_adapt : the target's adaptation rows (.h5); its labels, where present, are used by
        the ``ceiling`` row only
    C, seeds, rows, progress : as :func:`evaluate_peers`
    """
    from fedalign.files import read_features

    rows = check_rows(rows)
    X, y, _ = read_features(test)
    Xa, ya, _ = read_features(target_adapt)
    srcs = [read_features(p)[:2] for p in sources]
    for p, (Xs, ys) in zip([target_adapt, *sources], [(Xa, ya), *srcs]):
        if Xs.shape[1] != X.shape[1]:
            raise FedalignError(f"{p}: d={Xs.shape[1]}, the test file has d={X.shape[1]}")
        if p != target_adapt and not np.any(ys >= 0):
            raise FedalignError(f"{p}: source file has no labeled rows")
    return evaluate_peers(srcs, Xa, X, y, C=C, seeds=seeds, y_adapt=ya, rows=rows,
                          progress=progress)

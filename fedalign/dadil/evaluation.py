"""Evaluation of DeFed-GMM-DaDiL on a target domain, next to honest baselines.

One target domain T, its held-out labeled test split (never used for adaptation), and
whatever of the following is given:

- **source-only**: standardised logistic regression on the pooled labeled source features,
  its regularisation C chosen by leave-one-source-domain-out cross-validation on the sources
  (:func:`~fedalign.dadil.classifiers.source_only_classifier`) — the target is never looked at;
- **oracle**: the ceiling: T's GMM fitted *with* the labels of its adaptation split
  (:func:`~fedalign.dadil.classifiers.oracle_classifier`);
- **centralized**: GMM-DaDiL learned in one process from the source GMMs and T's unlabeled
  GMM (:func:`~fedalign.dadil.classifiers.centralized_barycenter`);
- **DeFed rows**: the target client's state after the gossip rounds
  (:func:`~fedalign.dadil.classifiers.target_classifier`).

Every GMM-based row is reported with both heads
(:data:`~fedalign.dadil.classifiers.CLASSIFIERS`): ``linear`` — a logistic-regression head
trained on ``n_per_class`` samples per class of the labeled GMM — and ``map`` — the MAP rule
argmax_c Σ_k P(k | x) V_kc. Source-only has its own head
(:data:`~fedalign.dadil.classifiers.SOURCE_ONLY_HEAD`).

:func:`evaluate_target` is the one evaluation path: ``fedalign evaluate -m dadil``
(:func:`evaluate_dadil`), ``fedalign dadil-evaluate`` (:func:`evaluate_target_files`,
:func:`target_report`) and ``examples/dadil/run_lodo.py`` call it.
"""


from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign import defaults
from fedalign.dadil.classifiers import (AUTO_HEAD, CENTRALIZED, CLASSIFIERS, HEADS, ORACLE,
                                        ROWS_HEAD, SOURCE_ONLY, SOURCE_ONLY_CS, SOURCE_ONLY_HEAD, _labeled,
                                        accuracy, centralized_barycenter, gmm_classifier,
                                        parse_classifiers, source_only_classifier)
from fedalign.dadil.state import client_barycenter, load_state
from fedalign.errors import FedalignError
from fedalign.results import MethodResult, mean_std
from fedalign.threads import limit_threads


@dataclass
class TargetResult:
    """Accuracies on one target domain.

    Attributes
    ----------
    domain : str
    n_classes : C
    n_test : labeled test rows scored
    seeds : list of int
    accuracy : {method: {head: [accuracy per seed]}}; methods in the order evaluated
        (source-only, oracle, centralized, then the states by name); heads ``linear``/``map``
        for GMM-based rows, :data:`SOURCE_ONLY_HEAD` for source-only
    records : {method: dict} — source-only: its cross-validation record
        (:func:`source_only_classifier`); centralized: first/last loss per seed; states:
        client, round, α
    """

    domain: str
    n_classes: int
    n_test: int
    seeds: list
    accuracy: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)

    def rows(self) -> list:
        """[(method, head, [accuracy per seed])] in table order."""
        return [(m, h, accs) for m, heads in self.accuracy.items() for h, accs in heads.items()]

    def summary(self) -> dict:
        """{method: {head: {mean, std}}} over seeds (population std, ddof = 0)."""
        return {m: {h: mean_std(a) for h, a in heads.items()} for m, heads in self.accuracy.items()}

    def to_json(self) -> dict:
        """JSON-ready dict.

        ``accuracy`` (nested, per seed) and ``records`` as above; ``rows``: [method, head,
        label] in table order (JSON reports sort their keys); ``summary``: {label: {mean, std}}
        with one flat label per row (:func:`row_label`), what ``fedalign report`` reads.
        """
        summ = self.summary()
        return dict(domain=self.domain, n_classes=self.n_classes, n_test=self.n_test,
                    seeds=list(self.seeds),
                    rows=[[m, h, row_label(m, h)] for m, h, _ in self.rows()],
                    accuracy=self.accuracy, records=self.records,
                    summary={row_label(m, h): summ[m][h] for m, h, _ in self.rows()})


def row_label(method: str, head: str) -> str:
    """One flat name per (method, head) row: ``"aggregation (linear)"``."""
    return f"{method} ({head})"


def _n_classes(n_classes, y, states: dict, gmms: list) -> int:
    """C: given (from the test file), else the states', else the GMMs', else max label + 1;
    every input must agree with it."""
    cands = [("the test file", n_classes)] if n_classes is not None else []
    cands += [(f"state {name!r} (client {st.client})", st.shape[3]) for name, st in states.items()]
    cands += [(w, g.n_classes) for w, g in gmms if g is not None and g.n_classes is not None]
    if not cands:
        cands = [("the test labels", int(np.max(y)) + 1)]
    where0, C = cands[0]
    for where, c in cands[1:]:
        if int(c) != int(C):
            raise FedalignError(f"{where} has C={c} classes, {where0} has C={C}")
    if np.max(y) >= C:
        raise FedalignError(f"test label {int(np.max(y))} out of range for C={C} classes")
    return int(C)


def _check_dims(d: int, states: dict, gmms: list, sources: list) -> None:
    for name, st in states.items():
        if st.shape[2] != d:
            raise FedalignError(f"state {name!r} (client {st.client}) has d={st.shape[2]}, "
                                f"the test features have d={d}")
    for where, g in gmms:
        if g is not None and g.d != d:
            raise FedalignError(f"{where} has d={g.d}, the test features have d={d}")
    for i, (X, _) in enumerate(sources):
        if np.asarray(X).shape[1] != d:
            raise FedalignError(f"source {i} has d={np.asarray(X).shape[1]}, the test features "
                                f"have d={d}")


def evaluate_target(X, y, *, n_classes: int | None = None, domain: str = "target", seeds=(0,),
                    classifiers=None, sources=None, states=None, source_gmms=None,
                    target_gmm=None, oracle_gmm=None, n_per_class: int = 500,
                    source_only_Cs=SOURCE_ONLY_CS, source_only_cv: str = "lodo",
                    dictionary_kwargs: dict | None = None, progress=None, target_adapt=None,
                    head_sources=None, shrinkage=None,
                    head_source_gmms=None, source_only=None,
                    cem_iter: int = defaults.CEM_ITER) -> TargetResult:
    """Score every available method on one target domain's labeled test split.

    Methods (each only when its inputs are given), in this order:

    - ``source-only`` (``sources``): :func:`source_only_classifier`, C chosen by CV on the
      sources; fitted once when the CV does not depend on the seed (leave-one-domain-out), its
      accuracy repeated for every seed;
    - ``oracle`` (``oracle_gmm``): :func:`oracle_classifier`;
    - ``centralized`` (``source_gmms`` and ``target_gmm``): :func:`centralized_barycenter`
      with ``seed=s`` and ``dictionary_kwargs``, learned once per seed for all heads;
    - one row per entry of ``states`` (DeFed): :func:`target_classifier`.

    The seed s of a GMM-based row seeds the linear head's samples (and the centralized
    dictionary); the MAP head does not depend on it.

    Parameters
    ----------
    X : (n, d) test features; y : (n,) labels, −1 = unlabeled (ignored; none labeled: error)
    n_classes : C of the test file (its class names); None: taken from the states / GMMs.
        Every state, GMM and label must agree with C, every input must have dimension d.
    domain : the target's name (for the result)
    seeds : seeds, one accuracy per seed
    classifiers : heads of the GMM-based rows (:data:`HEADS`); None: linear, map (+ lda
        with ``target_adapt``)
    sources : list of (X_i (n_i, d), y_i (n_i,)) labeled source features, one per domain
    states : {row name: :class:`fedalign.dadil.state.ClientState`} of the target client
    source_gmms : list of labeled source GMMs; target_gmm : the target's unlabeled GMM
    oracle_gmm : the target's GMM fitted with its adaptation-split labels
    n_per_class : samples per class of the linear head
    source_only_Cs, source_only_cv : grid and scheme of :func:`source_only_classifier`
    source_only : (predict, record) of :func:`source_only_classifier` already fitted on
        ``sources`` with that grid and scheme (another seed's split of the same target needs
        the same model: ``examples/dadil/run_lodo.py`` fits it once per target and worker);
        used for every seed instead of a fit; only where the fit does not depend on the seed
        (leave-one-domain-out with ≥ 2 sources, or one C)
    dictionary_kwargs : keyword arguments of :func:`fedalign.dadil.dictionary.learn_dictionary`
    progress : optional callable(k), advanced once per (method, seed)
    target_adapt, head_sources, shrinkage : the ``lda`` head's (m, d) unlabeled target rows,
        labeled sources in the dictionary's coordinates (None: ``sources``) and (ridge,
        shrink_to) (None: the rule): :func:`fedalign.dadil.target_head.target_rows`
    cem_iter : relabelings of the ``lda`` head's pseudo-labels by classification EM (0, the
        default: one pass; :mod:`fedalign.dadil.classification_em`)
    head_source_gmms : the labeled GMMs of ``head_sources`` (same order and coordinates): the
        ``auto`` head's rule (:func:`fedalign.dadil.target_head.choose_head`), added to the
        default heads when given

    Returns
    -------
    :class:`TargetResult`
    """
    X = np.asarray(X)
    y = np.asarray(y).astype(np.int64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise FedalignError(f"test features {X.shape} and labels {y.shape} disagree")
    keep = y >= 0
    if not np.any(keep):
        raise FedalignError(f"target {domain}: the test split has no labeled rows")
    X, y = X[keep], y[keep]
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise FedalignError("give at least one seed")
    if classifiers is None:
        classifiers = CLASSIFIERS + ((ROWS_HEAD,) if target_adapt is not None else ()) + \
            ((AUTO_HEAD,) if target_adapt is not None and head_source_gmms else ())
    classifiers = parse_classifiers(list(classifiers))
    states, source_gmms = dict(states or {}), list(source_gmms or [])
    sources = _labeled(sources) if sources else []
    head_sources = _labeled(head_sources) if head_sources else sources
    C = _check_inputs(X, y, n_classes, sources, states, source_gmms, target_gmm, oracle_gmm)
    res = TargetResult(str(domain), C, int(len(y)), seeds)
    tick = progress or (lambda k: None)
    rows = _target_rows(X, C, classifiers, target_adapt, head_sources, shrinkage, res,
                        head_source_gmms, n_per_class, cem_iter)
    if sources:
        _source_only_row(res, X, y, sources, source_only_Cs, source_only_cv, tick, source_only)
    gmm_row = dict(res=res, X=X, y=y, classifiers=classifiers, n_per_class=n_per_class, tick=tick,
                   rows=rows)
    if oracle_gmm is not None:
        _gmm_row(ORACLE, lambda s: oracle_gmm, **gmm_row)
    if source_gmms:
        kw = dict(dictionary_kwargs or {})
        losses = {}

        def central(s):
            B, hist = centralized_barycenter(source_gmms + [target_gmm], len(source_gmms),
                                             seed=s, **kw)
            loss = list(hist.get("loss", [])) if isinstance(hist, dict) else []
            losses[str(s)] = dict(loss_first=loss[0] if loss else None,
                                  loss_last=loss[-1] if loss else None)
            return B

        _gmm_row(CENTRALIZED, central, **gmm_row)
        res.records[CENTRALIZED] = dict(dictionary_kwargs=kw, losses=losses)
    for name, st in states.items():
        B = client_barycenter(st)  # one barycenter, every seed and head
        _gmm_row(name, lambda s, B=B: B, **gmm_row)
        res.records[name] = dict(client=st.client, round=int(st.round),
                                 alpha=[float(a) for a in st.alpha])
    return res


def _target_rows(X, C, classifiers, target_adapt, head_sources, shrinkage, res,
                 head_source_gmms=None, n_per_class=500, cem_iter=defaults.CEM_ITER):
    """The ``lda`` / ``auto`` heads' :class:`~fedalign.dadil.target_head.TargetRows` (its
    shrinkage and head chosen once, recorded under ``res.records["lda head"]``), or None
    without those heads."""
    from fedalign.dadil.target_head import choose_head, target_rows

    if ROWS_HEAD not in classifiers and AUTO_HEAD not in classifiers:
        return None
    if AUTO_HEAD in classifiers and not head_source_gmms:
        raise FedalignError("the auto head needs the labeled sources' GMMs (its rule)")
    rows = target_rows(target_adapt, head_sources, C, shrinkage=shrinkage, d=X.shape[1],
                       cem_iter=cem_iter)
    if AUTO_HEAD in classifiers:
        choose_head(rows, list(head_source_gmms), head_sources, n_per_class=n_per_class,
                    seed=res.seeds[0])
    res.records[ROWS_HEAD + " head"] = dict(rows.record, ridge=rows.shrinkage[0],
                                            shrink_to=rows.shrinkage[1], n_target_rows=len(rows.X))
    return rows


def _check_inputs(X, y, n_classes, sources, states, source_gmms, target_gmm, oracle_gmm) -> int:
    """Every check of :func:`evaluate_target` before any work; returns C."""
    if not (sources or states or source_gmms or target_gmm is not None or oracle_gmm is not None):
        raise FedalignError("nothing to evaluate: give states, sources, source and target GMMs "
                            "or an oracle GMM")
    if (target_gmm is None) != (not source_gmms):
        raise FedalignError("the centralized baseline needs both the source GMMs and the "
                            "target's unlabeled GMM")
    for i, g in enumerate(source_gmms):
        if g.labels is None:
            raise FedalignError(f"source GMM {i} is unlabeled: the centralized baseline needs "
                                "labeled source GMMs")
    if oracle_gmm is not None and oracle_gmm.labels is None:
        raise FedalignError("the oracle needs the target's GMM fitted with labels "
                            "(fit-gmm on the labeled adaptation split)")
    taken = [n for n in states if n in (SOURCE_ONLY, ORACLE, CENTRALIZED)]
    if taken:
        raise FedalignError(f"state row name {taken[0]!r} is a baseline's name: choose another")
    gmms = [(f"source GMM {i}", g) for i, g in enumerate(source_gmms)] + \
        [("the target GMM", target_gmm), ("the oracle GMM", oracle_gmm)]
    C = _n_classes(n_classes, y, states, gmms)
    _check_dims(X.shape[1], states, gmms, sources)
    for i, (_, ys) in enumerate(sources):
        if np.max(ys) >= C:
            raise FedalignError(f"source {i}: label {int(np.max(ys))} out of range for C={C}")
    return C


def _source_only_row(res, X, y, sources, Cs, cv, tick, given=None) -> None:
    """The source-only row: one fit (or ``given``'s) when the CV does not depend on the seed,
    else one per seed."""
    seed_free = seed_free_source_only(len(sources), Cs, cv)
    if given is not None and not seed_free:
        raise FedalignError("a fitted source-only classifier can be reused only where its fit "
                            "does not depend on the seed (leave-one-domain-out with ≥ 2 sources, "
                            "or one C)")
    fitted, accs = ({0: tuple(given)} if given is not None else {}), []
    for s in res.seeds:
        key = 0 if seed_free else s
        if key not in fitted:
            fitted[key] = source_only_classifier(sources, seed=key, Cs=Cs, cv=cv)
        accs.append(accuracy(fitted[key][0], X, y))
        tick(1)
    res.accuracy[SOURCE_ONLY] = {SOURCE_ONLY_HEAD: accs}
    rec = dict(next(iter(fitted.values()))[1])
    if len(fitted) > 1:  # k-fold CV: the folds (so C) depend on the seed
        rec["C_per_seed"] = [fitted[s][1]["C"] for s in res.seeds]
    res.records[SOURCE_ONLY] = rec


def seed_free_source_only(n_sources: int, Cs=SOURCE_ONLY_CS, cv: str = "lodo") -> bool:
    """Whether :func:`source_only_classifier`'s fit is the same for every seed: leave-one-
    domain-out CV with ≥ 2 sources, or a single C (no CV)."""
    return (cv == "lodo" and n_sources > 1) or len(np.atleast_1d(Cs)) == 1


def _gmm_row(method, gmm_for_seed, res, X, y, classifiers, n_per_class, tick, rows=None) -> None:
    """One GMM-based method, every head: ``gmm_for_seed(s)`` → labeled GMM → head (seed s);
    heads that do not depend on the seed (map, lda) are fitted once per GMM; ``auto`` reuses
    the head it resolved to."""
    acc = {h: [] for h in classifiers}
    done = {}
    for s in res.seeds:
        g = gmm_for_seed(s)
        for h in classifiers:
            eff = rows.choice if h == AUTO_HEAD and rows is not None else h
            key = (eff, s) if eff == "linear" else eff
            if key not in done or done[key][0] is not g:  # same GMM (and seed): reuse
                done[key] = (g, accuracy(_classifier(g, eff, n_per_class, s, rows, res, method),
                                         X, y))
            acc[h].append(done[key][1])
        tick(1)
    res.accuracy[method] = acc


def _classifier(g, head, n_per_class, seed, rows, res, method):
    """:func:`gmm_classifier`; the ``lda`` head's classification-EM record is kept under
    ``res.records["lda head"]["classification_em"][method]``."""
    if head != ROWS_HEAD or rows is None:
        return gmm_classifier(g, head, n_per_class, seed, rows=rows)
    th = rows.head(g)
    res.records[ROWS_HEAD + " head"].setdefault("classification_em", {})[method] = \
        th.record["classification_em"]
    return th.predict


def read_test_split(path) -> tuple:
    """Read a target's test split: (X (n, d), y (n,), C or None (no class names), domain).

    Refuses a file without labeled rows.
    """
    from fedalign.files import read_features

    path = Path(path)
    X, y, info = read_features(path)
    if not np.any(y >= 0):
        raise FedalignError(f"{path}: the test file has no labeled rows")
    names = list(info["class_names"])
    domain = str(info["provenance"].get("domain") or path.name.split(".")[0])
    return X, y, (len(names) or None), domain


def evaluate_target_files(test, *, states=None, sources=(), source_gmms=(), target_gmm=None,
                          oracle_gmm=None, target_adapt=None, head_sources=(), head_gmms=(),
                          **kwargs) -> TargetResult:
    """:func:`evaluate_target` from files (what ``fedalign dadil-evaluate`` calls).

    Parameters
    ----------
    test : the target's test split (.h5)
    states : {row name: state file}
    sources : labeled source feature files (.h5), one per source domain
    source_gmms, target_gmm, oracle_gmm : GMM files (.npz)
    target_adapt : the target's adaptation rows (.h5, read unlabeled): the ``lda`` head
    head_sources : labeled source files of the ``lda`` head (default: ``sources``)
    head_gmms : the labeled GMM files of ``head_sources`` (same order): the ``auto`` head's
        rule (:func:`fedalign.dadil.target_head.choose_head`); read only with ``target_adapt``
    kwargs : the remaining arguments of :func:`evaluate_target` (seeds, classifiers, …)
    """
    from fedalign.files import read_features
    from fedalign.gmm import load_gmm

    X, y, C, domain = read_test_split(test)
    srcs = _read_sources(sources, X.shape[1])
    if (head_sources or head_gmms) and target_adapt is None:
        raise FedalignError("the lda head's sources and the auto head's GMMs are read only with "
                            "the target's adaptation rows")
    if target_adapt is not None:
        hsrcs = _read_sources(head_sources, X.shape[1])
        Xa, _, _ = read_features(target_adapt)
        if Xa.shape[1] != X.shape[1]:
            raise FedalignError(f"{target_adapt}: d={Xa.shape[1]}, the test file has "
                                f"d={X.shape[1]}")
        kwargs.update(target_adapt=Xa, head_sources=hsrcs or None)
    sts = {}
    for name, p in (states or {}).items():
        st = load_state(p)
        _check_state(st, p, X.shape[1], C, test)
        sts[name] = st
    gmms = {}
    for p in list(source_gmms) + list(head_gmms) + [q for q in (target_gmm, oracle_gmm)
                                                    if q is not None]:
        g = load_gmm(p)
        if g.d != X.shape[1]:
            raise FedalignError(f"{p}: d={g.d}, the test file has d={X.shape[1]}")
        if C is not None and g.n_classes is not None and g.n_classes != C:
            raise FedalignError(f"{p}: {g.n_classes} classes, the test file has C={C}")
        gmms[str(p)] = g
    if head_gmms:   # the auto head's rule: one labeled GMM per head source
        kwargs.update(head_source_gmms=[gmms[str(p)] for p in head_gmms])
    kwargs.setdefault("domain", domain)
    return evaluate_target(
        X, y, n_classes=C, sources=srcs, states=sts,
        source_gmms=[gmms[str(p)] for p in source_gmms],
        target_gmm=None if target_gmm is None else gmms[str(target_gmm)],
        oracle_gmm=None if oracle_gmm is None else gmms[str(oracle_gmm)], **kwargs)


def _read_sources(paths, d: int) -> list:
    """[(X, y)] of labeled source files, each of dimension d."""
    from fedalign.files import read_features

    out = []
    for p in paths or ():
        Xs, ys, _ = read_features(p)
        if not np.any(ys >= 0):
            raise FedalignError(f"{p}: source file has no labeled rows")
        if Xs.shape[1] != d:
            raise FedalignError(f"{p}: d={Xs.shape[1]}, the test file has d={d}")
        out.append((Xs, ys))
    return out


def _check_state(st, path, d: int, C: int | None, test) -> None:
    """A state must have the test file's dimension and class count (one line otherwise)."""
    _, _, sd, sC = st.shape
    if sd != d:
        raise FedalignError(f"{path}: the state of {st.client} has d={sd}, {test} has d={d}")
    if C is not None and sC != C:
        raise FedalignError(f"{path}: the state of {st.client} has C={sC} classes, "
                            f"{test} has C={C}")


def state_for_domain(states: dict, domain: str, n_tests: int):
    """The state of the client named like the test domain (or the only state, one test)."""
    if domain in states:
        return states[domain]
    if len(states) == 1 and n_tests == 1:
        return next(iter(states.values()))
    raise FedalignError(f"no DaDiL state of client {domain!r} among the inputs "
                        f"({', '.join(sorted(states)) or 'none'})")


DADIL_PARAMS = ("classifier", "n_per_class", "threads", "target_adapt", "sources", "source_gmms")


def evaluate_dadil(inputs, tests, class_names, seeds, params):
    """``fedalign evaluate --method dadil``: score target clients' DeFed-GMM-DaDiL classifiers
    through :func:`evaluate_target`.

    Parameters
    ----------
    inputs : state files; a test domain uses the state of the client with its
        name (or the only state when there is one state and one test domain)
    tests : list of :class:`fedalign.evaluate.TestDomain`
    class_names : C = len(class_names); every state must have C classes and the test's d
    seeds : the sampling seeds of the linear head
    params : ``classifier=linear|map|lda|auto`` (default linear), ``n_per_class=N`` (500),
        ``threads=N`` (1); ``lda`` and ``auto`` (one test domain) also need
        ``target_adapt=FILE`` (the target's adaptation rows) and ``sources=FILE,FILE,…``
        (labeled source features in the dictionary's coordinates); ``auto`` also
        ``source_gmms=FILE,FILE,…`` (the sources' labeled GMMs, in the order of ``sources``)

    Returns
    -------
    :class:`fedalign.results.MethodResult`
    """
    params = dict(params or {})
    unknown = set(params) - set(DADIL_PARAMS)
    if unknown:
        raise FedalignError(f"unknown dadil option {sorted(unknown)[0]!r} "
                            f"({', '.join(DADIL_PARAMS)})")
    clf = str(params.get("classifier", "linear"))
    if clf not in HEADS:
        raise FedalignError(f"dadil.classifier must be one of {', '.join(HEADS)}, got {clf!r}")
    rows_kw = _lda_inputs(clf, params, tests)
    try:
        npc = int(params.get("n_per_class", 500))
        threads = int(params.get("threads", 1))
    except ValueError:
        raise FedalignError("dadil.n_per_class and dadil.threads must be integers") from None
    limit_threads(threads)
    if not inputs:
        raise FedalignError("the dadil method needs the target client's state file(s) as inputs")
    states, paths = {}, {}
    for p in inputs:
        st = load_state(p)
        states[st.client], paths[st.client] = st, p
    C = len(class_names)
    per_domain = {}
    for t in tests:
        st = state_for_domain(states, t.domain, len(tests))
        _check_state(st, paths[st.client], t.X.shape[1], C, t.path)
        r = evaluate_target(t.X, t.y, n_classes=C, domain=t.domain, seeds=seeds,
                            classifiers=(clf,), states={"dadil": st}, n_per_class=npc,
                            **rows_kw)
        per_domain[t.domain] = r.accuracy["dadil"][clf]
    per_seed = [{dom: accs[i] for dom, accs in per_domain.items()} for i in range(len(seeds))]
    return MethodResult("dadil", [int(s) for s in seeds], per_seed,
                        dict(classifier=clf, n_per_class=npc))



def _lda_inputs(clf: str, params: dict, tests) -> dict:
    """evaluate_target's target_adapt / head_sources (/ head_source_gmms) for
    ``dadil.classifier=lda`` or ``auto``."""
    from fedalign.files import read_features
    from fedalign.gmm import load_gmm

    if clf not in (ROWS_HEAD, AUTO_HEAD):
        if {"target_adapt", "sources", "source_gmms"} & set(params):
            raise FedalignError("dadil.target_adapt, dadil.sources and dadil.source_gmms are "
                                "read only with dadil.classifier=lda or auto")
        return {}
    if clf == ROWS_HEAD and "source_gmms" in params:
        raise FedalignError("dadil.source_gmms is read only with dadil.classifier=auto")
    need = ("target_adapt", "sources") + (("source_gmms",) if clf == AUTO_HEAD else ())
    if len(tests) != 1 or any(k not in params for k in need):
        raise FedalignError(f"dadil.classifier={clf} needs one test domain, "
                            "dadil.target_adapt=FILE and dadil.sources=FILE,FILE,…"
                            + (" and dadil.source_gmms=FILE,FILE,…" if clf == AUTO_HEAD else ""))
    d = tests[0].X.shape[1]
    Xa, _, _ = read_features(params["target_adapt"])
    kw = dict(target_adapt=Xa, head_sources=_read_sources(
        [q for q in str(params["sources"]).split(",") if q], d))
    if clf == AUTO_HEAD:
        kw["head_source_gmms"] = [load_gmm(q) for q in str(params["source_gmms"]).split(",") if q]
    return kw


def target_report(result: TargetResult, test, states: dict | None = None,
                  classifiers=CLASSIFIERS) -> dict:
    """The JSON report of ``fedalign dadil-evaluate``: the result (:meth:`TargetResult.to_json`)
    with the test file, its SHA-256, the heads and the state files of the DeFed rows."""
    from fedalign.files import sha256_file

    return dict(producer="fedalign dadil-evaluate", test=str(test), test_sha256=sha256_file(test),
                classifiers=list(classifiers),
                states={n: str(p) for n, p in (states or {}).items()}, **result.to_json())

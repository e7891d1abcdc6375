"""scikit-learn / skada estimators over the library: :class:`SLOTAlign` and :class:`GMMDaDiLClassifier`.

The convention is skada's: one array ``X`` (n, d) holds every domain's rows and
``sample_domain`` (n,) says whose each row is — a positive id for a source domain, a negative
id for a target domain; unlabeled rows have ``y == -1``. Both estimators are thin: the
statistics, barycenters, maps, GMMs, dictionaries and heads are those of the command line
(:mod:`fedalign.stats`, :mod:`fedalign.align`, :mod:`fedalign.gaussian`, :mod:`fedalign.gmm`,
:mod:`fedalign.dadil`), so an estimator and the CLI given the same rows give the same numbers.

- :class:`SLOTAlign` (a transformer): every domain's mean μ_k and Ledoit–Wolf covariance Σ_k,
  their Bures–Wasserstein barycenter N(μ_b, Σ_b) — or a reference received from a server
  (``reference=``) — and each domain's geodesic map T_τ(z) = (1 − τ) z + τ (A_k z + b_k).
- :class:`GMMDaDiLClassifier`: labeled diagonal GMMs of the sources, an unlabeled GMM of the
  target, centralized GMM-DaDiL (:func:`fedalign.dadil.dictionary.learn_dictionary`) and a
  head on the target's labeled barycenter B(α_T; atoms) (:mod:`fedalign.dadil.classifiers`).

Bad input raises :class:`ValueError` (scikit-learn's convention; the library's
:class:`~fedalign.errors.FedalignError` message is kept). Importing this module imports
scikit-learn, never torch; ``fedalign.SLOTAlign`` / ``fedalign.GMMDaDiLClassifier`` import it
lazily.

References
----------
M. Agueh and G. Carlier, "Barycenters in the Wasserstein space", SIAM J. Math. Anal. (2011)
(the barycenter; SLOT-Align's protocol: :mod:`fedalign.align`).
E. F. Montesuma, F. M. N. Mboula, A. Souloumiac, "Lighter, Better, Faster Multi-Source Domain
Adaptation with Gaussian Mixture Models and Optimal Transport", ECML-PKDD 2024.
T. Gnassounou et al., "skada: scikit-learn domain adaptation" (the ``sample_domain`` API).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, TransformerMixin
from sklearn.utils.validation import check_array, check_is_fitted

from fedalign import defaults
from fedalign.errors import FedalignError

__all__ = ["SLOTAlign", "GMMDaDiLClassifier"]


@contextmanager
def _value_errors():
    """The library's :class:`FedalignError` as scikit-learn's :class:`ValueError`."""
    try:
        yield
    except FedalignError as e:
        raise ValueError(str(e)) from e


def _check_domains(X, sample_domain, *, required: bool = True):
    """(X float64 (n, d), sample_domain (n,)) checked; None stays None when not required."""
    X = check_array(X, dtype=np.float64)
    if sample_domain is None:
        if required:
            raise ValueError("sample_domain is required: one domain id per row of X "
                             "(positive: a source domain, negative: a target domain)")
        return X, None
    sd = np.asarray(sample_domain)
    if sd.ndim == 0:
        sd = np.full(len(X), sd)
    if sd.shape != (len(X),):
        raise ValueError(f"sample_domain has shape {sd.shape}, expected ({len(X)},)")
    return X, sd


class SLOTAlign(TransformerMixin, BaseEstimator):
    """SLOT-Align as a transformer: each domain moved along the W2 geodesic to a reference.

    ``fit`` summarises every domain k of ``sample_domain`` (sources and targets alike: in
    SLOT-Align every client sends its statistics) by n_k, μ_k and
    Σ_k = (1 − s) Σ̂_k + s (tr Σ̂_k / d) I (:func:`fedalign.stats.gaussian_stats`; s by
    Ledoit–Wolf unless ``shrinkage`` says otherwise), builds the reference — the
    Bures–Wasserstein barycenter (:func:`fedalign.align.make_reference`, the fixed point of
    :func:`fedalign.gaussian.bures_barycenter`) or the given ``reference`` — and each domain's
    OT map (:func:`fedalign.align.client_maps`, the reference's root once)

        A_k = Σ_b^{1/2} (Σ_b^{1/2} Σ_k Σ_b^{1/2})^{-1/2} Σ_b^{1/2},   b_k = μ_b − A_k μ_k.

    ``transform`` applies T_τ(z) = ((1 − τ) I + τ A_k) z + τ b_k to the rows of domain k
    (:func:`fedalign.gaussian.interpolate_map`, the map of ``fedalign align``), in float64.

    skada's ``MultiLinearMongeAlignmentAdapter`` builds its barycenter from the source domains
    only, with uniform weights and the empirical covariance; with every domain a source,
    ``weights="uniform"``, ``shrinkage="none"`` and τ = 1 the two agree to 1e-6
    (``tests/test_estimators.py``).

    Parameters
    ----------
    tau : float in [0, 1], geodesic time (τ = 1: the full OT map)
    shrinkage : "auto" (Ledoit–Wolf), "none" (empirical 1/n covariance) or s in [0, 1]
    weights : "samples" (w_k = n_k / N) or "uniform" barycentric weights
    reference : None (the barycenter of the fitted domains), a reference file written by
        ``fedalign barycenter``, or a :class:`fedalign.align.Reference`: the maps then go to it
    tol, max_iter : stopping rule of the barycenter's fixed point

    Attributes
    ----------
    domains_ : (K,) the domain ids seen by ``fit``, sorted
    stats_ : list of K :class:`fedalign.stats.GaussianStats` (n, mean (d,), covariance (d, d))
    shrinkage_ : (K,) the shrinkage s of every domain
    reference_ : :class:`fedalign.align.Reference` (mean (d,), covariance (d, d), meta)
    maps_ : {domain id: :class:`fedalign.align.AffineMap`} (A (d, d), b (d,), τ = 1)
    n_features_in_ : d

    Examples
    --------
    >>> Xt = SLOTAlign(tau=1.0).fit_transform(X, sample_domain=sample_domain)  # doctest: +SKIP
    """

    def __init__(self, tau=defaults.TAU, shrinkage="auto", weights="samples", reference=None,
                 tol=1e-10, max_iter=100):
        self.tau = tau
        self.shrinkage = shrinkage
        self.weights = weights
        self.reference = reference
        self.tol = tol
        self.max_iter = max_iter

    def fit(self, X, y=None, *, sample_domain=None):
        """Statistics of every domain, the reference and every domain's map.

        Parameters
        ----------
        X : (n, d) features of every domain; y : ignored (SLOT-Align uses no labels)
        sample_domain : (n,) domain id of every row

        Returns
        -------
        self
        """
        from fedalign.align import Reference, client_maps, load_reference, make_reference
        from fedalign.gaussian import check_tau
        from fedalign.stats import gaussian_stats

        X, sd = _check_domains(X, sample_domain)
        with _value_errors():
            check_tau(self.tau)
            domains = np.unique(sd)
            stats = [gaussian_stats(X[sd == dom], self.shrinkage, f"domain {dom}")
                     for dom in domains]
            if self.reference is None:
                ref = make_reference(stats, weights=self.weights, tol=self.tol,
                                     max_iter=self.max_iter)
            elif isinstance(self.reference, Reference):
                ref = self.reference
            else:
                ref = load_reference(self.reference)
            self.maps_ = dict(zip((dom.item() for dom in domains),
                                  client_maps(stats, ref, domains=[str(dom) for dom in domains])))
        self.domains_ = domains
        self.stats_ = stats
        self.shrinkage_ = np.array([st.shrinkage for st in stats])
        self.reference_ = ref
        self.n_features_in_ = X.shape[1]
        return self

    def transform(self, X, *, sample_domain=None):
        """T_τ of each row's domain: (n, d) float64.

        Raises ValueError for a domain ``fit`` has not seen (its map needs its statistics).
        """
        from fedalign.gaussian import check_tau, interpolate_map

        check_is_fitted(self, "maps_")
        X, sd = _check_domains(X, sample_domain)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, SLOTAlign was fitted with "
                             f"{self.n_features_in_}")
        unknown = sorted(set(np.unique(sd).tolist()) - set(self.maps_))
        if unknown:
            raise ValueError(f"domain(s) {unknown} were not seen by fit: no map for them "
                             f"(fitted domains: {sorted(self.maps_)})")
        with _value_errors():
            tau = check_tau(self.tau)
        out = np.empty_like(X)
        for dom in np.unique(sd):
            sel = sd == dom
            amap = self.maps_[dom.item()]
            At, bt = interpolate_map(amap.A, amap.b, tau)
            out[sel] = X[sel] @ At.T + bt
        return out

    def fit_transform(self, X, y=None, *, sample_domain=None):
        """:meth:`fit` then :meth:`transform` of the same rows."""
        return self.fit(X, y, sample_domain=sample_domain).transform(X, sample_domain=sample_domain)


class GMMDaDiLClassifier(ClassifierMixin, BaseEstimator):
    """Centralized GMM-DaDiL: a classifier for an unlabeled target from labeled sources.

    ``fit`` fits a labeled diagonal GMM with ``components_per_class`` components per class to
    every source domain and an unlabeled one with C·k components to the target
    (:func:`fedalign.gmm.fit_gmm`), learns ``n_atoms`` atoms and every domain's weights α by
    minimising MW2²(P_T, B(α_T)) + Σ_s SMW2²(P_s, B(α_s))
    (:func:`fedalign.dadil.classifiers.centralized_barycenter`), and trains the head on the
    target's labeled barycenter B(α_T; atoms): ``auto`` (default) picks ``lda`` or ``linear``
    by a rule on the sources alone (:func:`fedalign.dadil.target_head.choose_head`); ``lda``, the target's own rows
    pseudo-labeled by B(α_T)'s MAP rule (refined by classification EM if ``cem_iter`` > 0,
    :mod:`fedalign.dadil.classification_em`) and an LDA of their and the sources' class
    statistics, its shrinkage chosen by leave-one-source-domain-out
    (:mod:`fedalign.dadil.target_head`);
    ``linear``, logistic regression on ``n_per_class`` samples per class
    (:func:`fedalign.gmm_head.train_head_from_gmm`); or ``map``, argmax_c Σ_k P(k | x) V_kc
    (:func:`fedalign.gmm.map_predict`) — the heads of
    :func:`fedalign.dadil.classifiers.gmm_classifier` and of ``fedalign dadil-evaluate``.

    Parameters
    ----------
    components_per_class : k of the source GMMs (the target's has C·k components)
    n_atoms : A, atoms of the dictionary
    n_iter : iterations of the centralized learner
    classifier : "auto" (default: ``lda`` or ``linear``, chosen on the sources by
        :func:`fedalign.dadil.target_head.choose_head`), "lda", "linear" or "map"
    n_per_class : samples per class of the linear head
    cem_iter : relabelings of the ``lda`` head's pseudo-labels by classification EM (0, the
        default: the one-pass head)
    class_weights : "balanced" or "prior" class masses of the source GMMs
    var_floor_rel : GMM variance floor per dimension, as a fraction of its variance
    seed : seed of the GMM fits, the atoms and the head's samples (same seed → same model)
    align_to_target : True (the ``fedalign`` default): before anything is fitted, every
        source's rows are mapped onto the target's Gaussian at τ = 1, completed by the classes
        the target seems to lack (:func:`fedalign.label_shift.onto_target`: what
        ``examples/dadil/run_lodo.py`` and the CLI recipe ``stats --per-class`` →
        ``target-reference`` → ``align --tau 1`` do); False: the sources as they are (the
        published GMM-DaDiL)

    Attributes
    ----------
    classes_ : (C,) the source labels (``y`` values other than −1), sorted
    label_shift_ : the label-shift EM's record (priors, absent classes) when
        ``align_to_target``, else None
    source_domains_ : (S,) source domain ids; target_domain_ : the target's id
    gmms_ : list of S + 1 :class:`fedalign.gmm.GMM` (the sources, then the target)
    barycenter_ : :class:`fedalign.gmm.GMM`, B(α_T; atoms), labels (K, C)
    history_ : the learner's loss curves (``loss`` (n_iter,), ``domain_losses``)
    head_kind_ : the head used ("auto" resolved to "lda" or "linear")
    n_features_in_ : d
    """

    def __init__(self, components_per_class=5, n_atoms=defaults.N_ATOMS, n_iter=100,
                 classifier="auto", n_per_class=500, class_weights="balanced",
                 var_floor_rel=0.01, seed=0, align_to_target=True,
                 cem_iter=defaults.CEM_ITER):
        self.components_per_class = components_per_class
        self.n_atoms = n_atoms
        self.n_iter = n_iter
        self.classifier = classifier
        self.n_per_class = n_per_class
        self.class_weights = class_weights
        self.var_floor_rel = var_floor_rel
        self.seed = seed
        self.align_to_target = align_to_target
        self.cem_iter = cem_iter

    def fit(self, X, y, *, sample_domain=None):
        """Learn the dictionary from labeled sources and one unlabeled target.

        Parameters
        ----------
        X : (n, d) features of every domain
        y : (n,) labels of the source rows; −1 for unlabeled rows (the target's labels,
            whatever they are, are never read)
        sample_domain : (n,) positive ids for source domains, one negative id for the target;
            None: rows with y == −1 are the target (domain −1), the others one source (1)

        Returns
        -------
        self
        """
        from fedalign.dadil.classifiers import centralized_barycenter, check_classifier
        from fedalign.gmm import fit_gmm
        from fedalign.gmm_head import train_head_from_gmm

        X, sd = _check_domains(X, sample_domain, required=False)
        y = np.asarray(y)
        if y.shape != (len(X),):
            raise ValueError(f"y has shape {y.shape}, expected ({len(X)},)")
        unlabeled = (y == -1) if y.dtype.kind in "iuf" else np.zeros(len(y), bool)
        if sd is None:
            sd = np.where(unlabeled, -1, 1)
        targets = np.unique(sd[sd < 0])
        sources = np.unique(sd[sd > 0])
        if len(targets) != 1 or not len(sources):
            raise ValueError("GMM-DaDiL needs exactly one target domain (a negative "
                             f"sample_domain) and at least one source; got targets "
                             f"{targets.tolist()} and sources {sources.tolist()}")
        labeled = (sd > 0) & ~unlabeled
        classes = np.unique(y[labeled])
        if len(classes) < 2:
            raise ValueError(f"the sources' labels cover {len(classes)} class(es): a "
                             "classifier needs at least 2")
        with _value_errors():
            check_classifier(self.classifier)
            C = len(classes)
            opts = dict(components_per_class=int(self.components_per_class), n_classes=C,
                        class_weights=self.class_weights, seed=int(self.seed),
                        var_floor_rel=self.var_floor_rel)
            encoded = []
            for dom in sources:
                rows = sd == dom
                enc = np.full(int(rows.sum()), -1, dtype=np.int64)
                enc[labeled[rows]] = np.searchsorted(classes, y[rows][labeled[rows]])
                encoded.append(enc)
            self.label_shift_ = None
            if self.align_to_target:   # SLOT toward the target first (fedalign.label_shift)
                from fedalign.label_shift import onto_target

                mapped, self.label_shift_ = onto_target(
                    [(X[sd == dom], enc) for dom, enc in zip(sources, encoded)],
                    X[sd == targets[0]], C)
                X = X.copy()
                for dom, Xm in zip(sources, mapped):
                    X[sd == dom] = Xm
            gmms, labeled_sources = [], []
            for dom, enc in zip(sources, encoded):
                rows = sd == dom
                gmms.append(fit_gmm(X[rows], enc, **opts))
                labeled_sources.append((X[rows][enc >= 0], enc[enc >= 0]))
            gmms.append(fit_gmm(X[sd == targets[0]], None, **opts))
            B, history = centralized_barycenter(gmms, len(sources), seed=int(self.seed),
                                                n_atoms=int(self.n_atoms), n_iter=int(self.n_iter))
            head, kind = None, self.classifier
            if kind in ("lda", "auto"):
                from fedalign.dadil.target_head import choose_head, target_rows

                rows = target_rows(X[sd == targets[0]], labeled_sources, C, d=B.d,
                                   cem_iter=int(self.cem_iter))
                if kind == "auto":
                    kind = choose_head(rows, gmms[:-1], labeled_sources,
                                       n_per_class=int(self.n_per_class), seed=int(self.seed))
                if kind == "lda":
                    head = rows.head(B)
            if kind == "linear":
                head = train_head_from_gmm(B, n_per_class=int(self.n_per_class),
                                           seed=int(self.seed))
        self.classes_ = classes
        self.source_domains_ = sources
        self.target_domain_ = targets[0].item()
        self.gmms_ = gmms
        self.barycenter_ = B
        self.history_ = history
        self.head_ = head
        self.head_kind_ = kind
        self.n_features_in_ = X.shape[1]
        return self

    def _features(self, X):
        check_is_fitted(self, "barycenter_")
        X = check_array(X, dtype=np.float64)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the classifier was fitted with "
                             f"{self.n_features_in_}")
        return X

    def predict_proba(self, X, *, sample_domain=None):
        """Class probabilities (n, C), columns in the order of ``classes_``.

        ``map``: the barycenter's posteriors Σ_k P(k | x) V_kc; ``linear``: the head's (a class
        absent from the barycenter's samples gets 0); ``lda``: the LDA's posteriors. ``sample_domain`` is accepted and ignored.
        """
        from fedalign.gmm import predict_proba

        X = self._features(X)
        if self.head_ is None:
            return predict_proba(self.barycenter_, X)
        if self.head_kind_ == "lda":   # the LDA's class posteriors, softmax of its scores
            from scipy.special import softmax

            return softmax(self.head_.head.scores(X), axis=1)
        P = np.zeros((len(X), len(self.classes_)))
        P[:, self.head_.classes_] = self.head_.predict_proba(X)
        return P

    def predict(self, X, *, sample_domain=None):
        """Labels (n,) of target rows, values of ``classes_``; ``sample_domain`` is ignored."""
        from fedalign.gmm import map_predict

        X = self._features(X)
        idx = map_predict(self.barycenter_, X) if self.head_ is None else self.head_.predict(X)
        return self.classes_[np.asarray(idx, dtype=np.int64)]

    def score(self, X, y, sample_weight=None, *, sample_domain=None):
        """Accuracy of :meth:`predict` on (X, y); ``sample_domain`` is ignored."""
        return super().score(X, y, sample_weight=sample_weight)

"""Labeled diagonal Gaussian mixtures: fitting, files, sampling and the MAP rule.

A labeled diagonal GMM (GMM-DaDiL, Montesuma et al. 2024) is

    P = Σ_k w_k N(m_k, diag v_k),   with a soft label V_k ∈ Δ_C per component,

stored as weights (K,), means (K, d), variances (K, d) and labels (K, C) (absent for
unlabeled data). All arrays are float64.

Fitting (:func:`fit_gmm`)
    labeled:   per class c, a diagonal GMM with min(k, n_c) components (scikit-learn EM,
               k-means init); components concatenated with one-hot labels. Class masses are
               1/C' over the C' present classes ("balanced") or n_c / n ("prior").
    unlabeled: one diagonal GMM with min(C·k, n) components, no labels.

Classification
    MAP:       ŷ(x) = argmax_c Σ_k P(k | x) V_kc, P(k | x) ∝ w_k N(x; m_k, diag v_k) (log-domain).
    Sampling:  draw x = m_k + √v_k ⊙ ε, y = argmax_c V_kc (:func:`sample_gmm`); the linear head
               trained on class-balanced samples is :mod:`fedalign.gmm_head`'s.

References
----------
E. F. Montesuma, F. M. N. Mboula, A. Souloumiac, "Lighter, Better, Faster Multi-Source Domain
Adaptation with Gaussian Mixture Models and Optimal Transport", ECML-PKDD 2024.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from fedalign.errors import FedalignError, spell

CLASS_WEIGHTS = ("balanced", "prior")


@dataclass
class GMM:
    """A diagonal Gaussian mixture with optional soft labels.

    Attributes
    ----------
    weights : (K,) float64, sums to 1
    means : (K, d) float64
    variances : (K, d) float64, > 0
    labels : (K, C) float64 rows in the simplex, or None (unlabeled)
    class_names : list of str (length C, may be empty)
    meta : dict, fit record (convergence per class, options); not part of the model
    """

    weights: np.ndarray
    means: np.ndarray
    variances: np.ndarray
    labels: np.ndarray | None = None
    class_names: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.weights = np.asarray(self.weights, dtype=np.float64)
        self.means = np.asarray(self.means, dtype=np.float64)
        self.variances = np.asarray(self.variances, dtype=np.float64)
        if self.labels is not None:
            self.labels = np.asarray(self.labels, dtype=np.float64)
        self.class_names = [str(c) for c in self.class_names]
        check_gmm(self)

    @property
    def K(self) -> int:
        return int(self.weights.shape[0])

    @property
    def d(self) -> int:
        return int(self.means.shape[1])

    @property
    def n_classes(self) -> int | None:
        """C from the labels, else from the class names, else None."""
        if self.labels is not None:
            return int(self.labels.shape[1])
        return len(self.class_names) or None

    @property
    def labeled(self) -> bool:
        return self.labels is not None


def check_gmm(g: GMM) -> None:
    """Raise :class:`FedalignError` on inconsistent shapes, negative weights or variances."""
    w, m, v = g.weights, g.means, g.variances
    if w.ndim != 1 or m.ndim != 2 or v.shape != m.shape or m.shape[0] != w.shape[0]:
        raise FedalignError(f"GMM shapes disagree: weights {w.shape}, means {m.shape}, "
                            f"variances {v.shape}")
    if w.shape[0] == 0:
        raise FedalignError("GMM has no components")
    if g.labels is not None and (g.labels.ndim != 2 or g.labels.shape[0] != w.shape[0]):
        raise FedalignError(f"GMM labels have shape {g.labels.shape}, expected ({w.shape[0]}, C)")
    for name, a in (("weights", w), ("means", m), ("variances", v), ("labels", g.labels)):
        if a is not None and not np.all(np.isfinite(a)):
            raise FedalignError(f"GMM {name} contain NaN or Inf")
    if np.any(w < 0) or not np.isclose(w.sum(), 1.0, rtol=1e-6):
        raise FedalignError(f"GMM weights must be ≥ 0 and sum to 1 (sum {w.sum():.6g})")
    if np.any(v <= 0):
        raise FedalignError("GMM variances must be > 0")
    if g.labels is not None and g.labels.size and (
            g.labels.min() < -LABEL_ATOL or not np.allclose(g.labels.sum(1), 1.0, rtol=0,
                                                           atol=LABEL_ATOL * g.labels.shape[1])):
        raise FedalignError("GMM labels must be rows of class probabilities (≥ 0, summing to 1)")


#: Slack of the label rows' check (soft labels are renormalised in float64).
LABEL_ATOL = 1e-6


def check_n_classes(C, what: str = "number of classes", param: str | None = "n_classes") -> int:
    """C of a GMM, given or recorded: an integer in [1, :data:`fedalign.files.MAX_CLASSES`]
    (beyond it, a mistake: every class costs a label column in every component and atom)."""
    from fedalign.files import MAX_CLASSES

    if isinstance(C, bool) or not isinstance(C, (int, np.integer)) or not 1 <= C <= MAX_CLASSES:
        raise FedalignError(f"{what} must be an integer in [1, {MAX_CLASSES:,}], got {C!r}",
                            param=param)
    return int(C)


# --------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------


def _fit_diag(X, k, floor, seed, max_iter, tol, reg):
    """One scikit-learn diagonal GMM (EM regularisation ``reg``), variances floored per
    dimension at ``floor`` (d,). Returns (weights, means, variances, record)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    k = int(min(k, len(X)))
    if len(X) == 1:  # a class seen once: one component at the sample, variance at the floor
        rec = dict(components=1, n=1, iterations=0, converged=True, lower_bound=None,
                   note="single sample")
        return np.ones(1), X.astype(np.float64).copy(), floor[None, :].copy(), rec
    gm = GaussianMixture(n_components=k, covariance_type="diag", reg_covar=float(reg),
                         max_iter=max_iter, tol=tol, random_state=seed, init_params="kmeans")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm.fit(X)
    var = np.maximum(gm.covariances_.astype(np.float64), floor)
    rec = dict(components=k, n=int(len(X)), iterations=int(gm.n_iter_),
               converged=bool(gm.converged_), lower_bound=float(gm.lower_bound_))
    return gm.weights_.astype(np.float64), gm.means_.astype(np.float64), var, rec


#: Default variance floor of :func:`fit_gmm`, relative to the data's per-dimension variance.
VAR_FLOOR_REL = 1e-2


def variance_floor(X, rel: float = VAR_FLOOR_REL) -> np.ndarray:
    """Per-dimension variance floor rel · Var(X_d): (d,). Dimensions without spread get
    rel × 1e-6 × the mean variance (or 1e-12), so the floor is always > 0.

    Frozen CNN features are often exactly 0 for a whole class in many dimensions; EM then
    gives those components variances at any absolute floor (1e-6 left 41–63 % of the
    Office-Caltech10 variances there) and the MAP rule becomes a hard, brittle match. A floor
    of 1 % of each dimension's variance (a tenth of its standard deviation) is a rule that does
    not depend on the features' scale.
    """
    return floor_from_variance(np.var(np.asarray(X, dtype=np.float64), axis=0), rel)


def floor_from_variance(var, rel: float = VAR_FLOOR_REL) -> np.ndarray:
    """rel · max(σ²_d, tiny) per dimension (d,), tiny = max(1e-6 × mean σ², 1e-12): the one
    rule behind every relative variance floor (GMM fits, atoms, centralized DaDiL)."""
    var = np.asarray(var, dtype=np.float64)
    tiny = max(1e-6 * float(var.mean()) if var.size else 0.0, 1e-12)
    return float(rel) * np.maximum(var, tiny)


def fit_gmm(X, y=None, components_per_class: int = 5, n_classes: int | None = None, *,
            class_weights: str = "balanced", min_var: float | None = None, seed: int = 0,
            max_iter: int = 100, tol: float = 1e-3, class_names=None,
            var_floor_rel: float | None = VAR_FLOOR_REL) -> GMM:
    """Fit a (labeled) diagonal GMM to features.

    Parameters
    ----------
    X : (n, d) features (converted to float64)
    y : (n,) int labels in [0, C), -1 = unlabeled; None or all -1 → unlabeled fit
    components_per_class : k; a class with n_c < k samples gets n_c components
    n_classes : C (default: len(class_names), else max(y) + 1)
    class_weights : "balanced" (each present class mass 1/C') or "prior" (n_c / n)
    min_var : absolute variance floor (also scikit-learn's ``reg_covar``); when None (the
        default) the floor is ``var_floor_rel`` × each dimension's variance over all rows of X
        (:func:`variance_floor`) and EM regularises with 1e-3 of its mean
    var_floor_rel : relative floor (used when ``min_var`` is None)
    seed, max_iter, tol : EM controls (scikit-learn ``random_state``, ``max_iter``, ``tol``)
    class_names : optional list of C names stored with the model

    Returns
    -------
    GMM with K = Σ_c min(k, n_c) components (labeled, one-hot labels (K, C)) or
    min(C·k, n) components (unlabeled, labels None). ``meta["fit"]`` records the EM
    convergence of every sub-fit.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or len(X) == 0:
        raise FedalignError(f"features must be a non-empty 2-D array, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise FedalignError("features contain NaN or Inf")
    if int(components_per_class) < 1:
        raise FedalignError(f"components per class must be ≥ 1, got {components_per_class}",
                            param="components_per_class")
    if class_weights not in CLASS_WEIGHTS:
        raise FedalignError(f"class weights must be one of {CLASS_WEIGHTS}, got {class_weights!r}",
                            param="class_weights")
    if min_var is None:
        if var_floor_rel is None or not (np.isfinite(var_floor_rel) and var_floor_rel > 0):
            raise FedalignError(f"var_floor_rel must be > 0, got {var_floor_rel}",
                                param="var_floor_rel")
        floor = variance_floor(X, var_floor_rel)
        reg = 1e-3 * float(floor.mean())
    elif not (np.isfinite(min_var) and min_var > 0):
        raise FedalignError(f"min_var must be > 0, got {min_var}", param="min_var")
    else:
        floor, reg = np.full(X.shape[1], float(min_var)), float(min_var)
    names = [str(c) for c in (class_names or [])]
    k = int(components_per_class)
    labeled = y is not None and np.any(np.asarray(y) >= 0)
    if y is not None:
        y = np.asarray(y).astype(np.int64)
        if y.shape != (len(X),):
            raise FedalignError(f"labels have shape {y.shape}, expected ({len(X)},)")
    C = n_classes if n_classes is not None else (len(names) or (int(y.max()) + 1 if labeled else None))
    if C is None:
        raise FedalignError(f"unlabeled data: give the number of classes ({spell('n_classes')})")
    C = check_n_classes(C)
    if names and len(names) != C:
        names = []
    options = dict(components_per_class=k, n_classes=C, class_weights=class_weights,
                   min_var=None if min_var is None else float(min_var),
                   var_floor_rel=None if min_var is not None else float(var_floor_rel),
                   seed=int(seed), max_iter=int(max_iter), tol=float(tol))
    if not labeled:
        w, m, v, rec = _fit_diag(X, C * k, floor, seed, max_iter, tol, reg)
        return GMM(w, m, v, None, names, meta=dict(options, labeled=False, fit=[rec]))

    y_l = y[y >= 0]
    if y_l.max() >= C:
        raise FedalignError(f"label {int(y_l.max())} out of range for {C} classes")
    X_l = X[y >= 0]
    counts = np.bincount(y_l, minlength=C)
    present = np.flatnonzero(counts)
    Ws, Ms, Vs, Ls, recs = [], [], [], [], []
    for c in present:
        w, m, v, rec = _fit_diag(X_l[y_l == c], k, floor, seed, max_iter, tol, reg)
        mass = 1.0 / len(present) if class_weights == "balanced" else counts[c] / counts.sum()
        Ws.append(w * mass)
        Ms.append(m)
        Vs.append(v)
        L = np.zeros((len(w), C))
        L[:, c] = 1.0
        Ls.append(L)
        recs.append(dict(rec, cls=int(c)))
    W = np.concatenate(Ws)
    return GMM(W / W.sum(), np.concatenate(Ms), np.concatenate(Vs), np.concatenate(Ls), names,
               meta=dict(options, labeled=True, class_counts=counts.tolist(), fit=recs))


#: The keyword arguments of :func:`fit_gmm` that it records in a GMM's ``meta``.
FIT_OPTIONS = ("components_per_class", "n_classes", "class_weights", "min_var", "var_floor_rel",
               "seed", "max_iter", "tol")


def refit_gmm(gmm: GMM, X, y=None, **overrides) -> GMM:
    """:func:`fit_gmm` on other rows with the options ``gmm`` was fitted with.

    Parameters
    ----------
    gmm : a GMM whose ``meta`` holds :func:`fit_gmm`'s options (:data:`FIT_OPTIONS`; an option
        it lacks takes ``fit_gmm``'s default)
    X : (m, d) rows; y : (m,) labels or None, as in :func:`fit_gmm`
    overrides : options given here win over the recorded ones

    Returns
    -------
    GMM fitted on (X, y)
    """
    opts = {k: gmm.meta[k] for k in FIT_OPTIONS if k in (gmm.meta or {})}
    return fit_gmm(X, y, **{**opts, **overrides})


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def save_gmm(path, gmm: GMM, meta: dict | None = None):
    """Write a ``gmm`` file (:mod:`fedalign.files`); ``meta`` is merged over ``gmm.meta``."""
    from fedalign.files import write_npz

    arrays = dict(weights=gmm.weights, means=gmm.means, variances=gmm.variances)
    if gmm.labels is not None:
        arrays["labels"] = gmm.labels
    if gmm.class_names and (gmm.n_classes is None or len(gmm.class_names) == gmm.n_classes):
        arrays["class_names"] = np.array(gmm.class_names, dtype=str)
    return write_npz(path, "gmm", arrays, {**gmm.meta, **(meta or {})})


def fit_gmm_file(features, output, components_per_class: int = 5, *, unlabeled: bool = False,
                 n_classes: int | None = None, producer: str = "fedalign fit-gmm", source=None,
                 **fit_options) -> GMM:
    """``fedalign fit-gmm``: the :class:`GMM` of a features file (rows (n, d), labels, class
    names), written to ``output`` (joining an open :func:`fedalign.files.atomic_outputs`).

    ``components_per_class``, ``n_classes``, ``fit_options``: :func:`fit_gmm`'s; ``unlabeled``
    ignores the labels; ``producer`` and ``source`` (the path to record when ``features`` is a
    transaction's temporary of it) go into the meta with the features' SHA-256. A labeled fit
    of a file with no label, no class name and no ``n_classes`` is refused. Returns the GMM.
    """
    from fedalign.files import read_features, sha256_file

    X, y, info = read_features(features)
    names = info["class_names"]
    if unlabeled:
        y = None
    elif n_classes is None and not names and not (y >= 0).any():
        raise FedalignError(f"{source or features}: no labels and no class names: give "
                            "--n-classes")
    g = fit_gmm(X, y, components_per_class, n_classes=n_classes, class_names=names,
                **fit_options)
    save_gmm(output, g, dict(producer=producer, source=str(source or features),
                             source_sha256=sha256_file(features)))
    return g


def load_gmm(path) -> GMM:
    """Read and validate a ``gmm`` file."""
    from fedalign.files import read_npz

    a, meta = read_npz(path, "gmm")
    if meta.get("n_classes") is not None:
        check_n_classes(meta["n_classes"], f"{path}: metadata 'n_classes'", param=None)
    names = [str(s) for s in a.get("class_names", [])]
    try:
        return GMM(a["weights"], a["means"], a["variances"], a.get("labels"), names, meta=meta)
    except FedalignError as e:
        raise FedalignError(f"{path}: {e}") from None


# --------------------------------------------------------------------------------------------
# Sampling, likelihood, MAP
# --------------------------------------------------------------------------------------------


def sample_gmm(gmm: GMM, n: int, rng=None) -> tuple[np.ndarray, np.ndarray]:
    """Draw n samples: k ~ w, x = m_k + √v_k ⊙ ε, y = argmax_c V_kc (−1 if unlabeled).

    Returns X (n, d) float64 and y (n,) int64.
    """
    rng = np.random.default_rng(rng)
    k = rng.choice(gmm.K, size=int(n), p=gmm.weights / gmm.weights.sum())
    X = gmm.means[k] + np.sqrt(gmm.variances[k]) * rng.standard_normal((int(n), gmm.d))
    y = gmm.labels.argmax(1)[k] if gmm.labels is not None else np.full(int(n), -1)
    return X, y.astype(np.int64)


def component_log_prob(gmm: GMM, X) -> np.ndarray:
    """log w_k + log N(x; m_k, diag v_k) for every row and component: (n, K)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != gmm.d:
        raise FedalignError(f"features have shape {X.shape}, the GMM has d={gmm.d}")
    prec = 1.0 / gmm.variances                                        # (K, d)
    # Σ_j (x_j − m_j)² / v_j expanded: x² · p − 2 x · (m p) + Σ m² p
    maha = (X**2) @ prec.T - 2.0 * X @ (gmm.means * prec).T + np.sum(gmm.means**2 * prec, 1)
    log_det = np.sum(np.log(gmm.variances), 1)
    with np.errstate(divide="ignore"):
        log_w = np.log(gmm.weights)
    return log_w - 0.5 * (gmm.d * np.log(2 * np.pi) + log_det + np.maximum(maha, 0.0))


def score_samples(gmm: GMM, X) -> np.ndarray:
    """Per-sample log-likelihood log Σ_k w_k N(x; m_k, diag v_k): (n,)."""
    from scipy.special import logsumexp

    return logsumexp(component_log_prob(gmm, X), axis=1)


def log_likelihood(gmm: GMM, X) -> float:
    """Mean per-sample log-likelihood (scikit-learn's ``GaussianMixture.score``)."""
    return float(np.mean(score_samples(gmm, X)))


def predict_proba(gmm: GMM, X) -> np.ndarray:
    """Class posteriors Σ_k P(k | x) V_kc: (n, C)."""
    from scipy.special import softmax

    if gmm.labels is None:
        raise FedalignError("the GMM has no labels: cannot classify")
    return softmax(component_log_prob(gmm, X), axis=1) @ gmm.labels


def map_predict(gmm: GMM, X) -> np.ndarray:
    """MAP classifier ŷ(x) = argmax_c Σ_k P(k | x) V_kc: (n,) int64."""
    return predict_proba(gmm, X).argmax(1).astype(np.int64)

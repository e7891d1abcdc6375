"""The linear head of a labeled diagonal GMM, trained on samples of it.

A labeled GMM (:class:`fedalign.gmm.GMM`) classifies by its MAP rule
(:func:`fedalign.gmm.map_predict`) or by a head trained on features drawn from it: every class
that owns a component (argmax_c V_kc = c) gets the same number of samples, its components drawn
with probability ∝ w_k and x = m_k + √v_k ⊙ ε (:func:`sample_balanced`), and a standardised
logistic regression is fitted to them (:func:`train_head_from_gmm`). Its users: the
``linear`` heads of :mod:`fedalign.dadil.classifiers`, the ``auto`` head's rule
(:mod:`fedalign.dadil.target_head`), ``GMMDaDiLClassifier`` (:mod:`fedalign.estimators`) and
``fedalign plot reconstruction``.
"""

from __future__ import annotations

import numpy as np

from fedalign.errors import FedalignError
from fedalign.gmm import GMM


def sample_balanced(gmm: GMM, n_per_class: int, rng=None) -> tuple[np.ndarray, np.ndarray]:
    """n_per_class samples of every class c that owns a component (argmax V_k = c).

    Within a class, components are drawn with probability ∝ w_k. Returns X (m, d), y (m,).
    """
    if gmm.labels is None:
        raise FedalignError("the GMM has no labels: cannot sample labeled features")
    rng = np.random.default_rng(rng)
    owner = gmm.labels.argmax(1)
    Xs, ys = [], []
    for c in np.unique(owner):
        idx = np.flatnonzero(owner == c)
        w = gmm.weights[idx] + 1e-300
        k = idx[rng.choice(len(idx), size=int(n_per_class), p=w / w.sum())]
        Xs.append(gmm.means[k] + np.sqrt(gmm.variances[k]) * rng.standard_normal((len(k), gmm.d)))
        ys.append(np.full(len(k), c, dtype=np.int64))
    return np.concatenate(Xs), np.concatenate(ys)


def train_head_from_gmm(gmm: GMM, n_per_class: int = 500, seed: int = 0, C: float = 1.0,
                        max_iter: int = 1000):
    """Logistic-regression head (with standardisation) trained on labeled GMM samples.

    Parameters
    ----------
    gmm : labeled GMM
    n_per_class : samples drawn per class (:func:`sample_balanced`)
    seed : sampling seed
    C, max_iter : scikit-learn ``LogisticRegression`` controls

    Returns
    -------
    a fitted scikit-learn pipeline with ``predict(X)``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = sample_balanced(gmm, n_per_class, seed)
    if len(np.unique(y)) < 2:
        raise FedalignError("the GMM labels cover fewer than 2 classes: cannot train a head")
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
    return clf.fit(X, y)

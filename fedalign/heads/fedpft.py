"""FedPFT: per-class Gaussian mixtures sent in float16, synthetic features on the server.

Client k fits, for every class c it holds, a GMM with K_c components to its class-c features
and sends the parameters in float16 together with its class counts N_{k,c}. The server draws
N_{k,c} synthetic features from each received class GMM, labels them c, and trains a linear
softmax head on the synthetic set.

Few samples: a class with N_{k,c} samples starts from K_c = max(1, min(K, ⌊N_{k,c}/2⌋))
components, and K_c is lowered until every fitted component carries at least
``min_per_component`` (default 2) samples of weight (w_j · N_{k,c}) — a component that
collapses onto one sample would send that raw row. A class with a single sample is not fitted
(a one-point Gaussian is that raw row): its count still travels, and the server reports it
(the head's ``notes`` and ``info["unfitted"]``); nothing is dropped silently.

Message arrays (C classes, K components, padded with zero weights):
``counts (C,) int64``, ``n_components (C,) int64``, ``weights (C, K) f16``,
``means (C, K, d) f16``, ``covariances`` f16 of shape (C, K, d) diag, (C, K) spherical or
(C, K, d, d) full.

Presets (Beitollahi et al., "Parametric feature transfer: one-shot federated learning with
foundation models", 2024): ``k10-diag`` K=10 diagonal, SGD lr 0.01 momentum 0.9, batch 128,
50 epochs; ``k1-spherical`` K=1 spherical, AdamW lr 1e-4, batch 32, 50 epochs.

Variants (``fedpft.variant``; the preset still chooses K and the covariance type):

- ``fedalign`` (default): the few-sample rule above, EM ``tol`` 1e-3 and ``max_iter`` 100
  (scikit-learn's defaults: enough for a frozen encoder's class clusters), a variance floor
  of 1e-6 on the server, and the preset's optimiser.
- ``reference`` — the Flower baseline by the paper's first author (``baselines/fedpft``:
  ``utils.learn_gmm``, ``strategy.FedPFT.aggregate_fit``, ``model.train``; the Caltech101
  configuration ``server-lr 1e-4``, ``server-batch-size 32``, ``num-epochs 50``, ``tol 1e-12``,
  ``max-iter 10000``): a class is fitted with exactly K components only when it has n > K
  samples, otherwise *nothing* about it is sent (not even its count); EM with tol 1e-12 and
  max_iter 10⁴; float16 parameters; the server rebuilds each GMM in scikit-learn, draws its
  n_c samples with ``GaussianMixture.sample`` from a fresh ``RandomState(seed)`` per GMM (as the
  reference does, so every class GMM uses the same noise stream), and trains ``nn.Linear`` with
  AdamW (lr 1e-4, torch's default weight decay 0.01), batch 32, 50 epochs, plain
  cross-entropy. Differences that remain, and why:

  1. Weights: float16 weights need not sum to 1, and ``RandomState.multinomial`` then raises
     in the reference (K > 1); here they are renormalised in float64 before sampling.
  2. Seeds: the reference fixes the sampler's seed to its config seed (0) for every run;
     here it is the run seed, so seeds differ across runs as the head's initialisation does.
     scikit-learn's ``random_state`` gets the seed as it is (a run seed, or a client's
     :func:`fedalign.heads.round_seed`, both in [0, 2**32 − 1]; another is refused by
     :func:`fedalign.defaults.check_seed`, never wrapped onto a valid one).
     Mini-batch order and initialisation come from numpy (see :mod:`fedalign.heads.linear`).
  3. The reference extracts features itself in float64; here they come from the float32
     features file (cast to float64 before EM, as there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.defaults import check_seed
from fedalign.errors import FedalignError
from fedalign.heads import LinearHead
from fedalign.heads.linear import train_softmax

MESSAGE_KEYS = ("counts", "n_components", "weights", "means", "covariances")

PRESETS = {
    "k10-diag": dict(components=10, covariance="diag", optimizer="sgd", lr=0.01, batch_size=128,
                     epochs=50),
    "k1-spherical": dict(components=1, covariance="spherical", optimizer="adamw", lr=1e-4,
                         batch_size=32, epochs=50),
}

#: Variance floor applied on the server (float16 underflows below ~6e-8).
VAR_FLOOR = 1e-6


@dataclass
class Config:
    variant: str = "fedalign"
    preset: str = "k10-diag"
    components: int = -1
    covariance: str = ""
    optimizer: str = ""
    lr: float = -1.0
    batch_size: int = -1
    epochs: int = -1
    momentum: float = 0.9
    weight_decay: float = 1e-5
    gmm_max_iter: int = 100
    gmm_tol: float = 1e-3
    min_per_component: float = 2.0

    VARIANTS = {
        "fedalign": {},
        "reference": dict(gmm_tol=1e-12, gmm_max_iter=10000, optimizer="adamw", lr=1e-4,
                          batch_size=32, epochs=50, weight_decay=0.01),
    }

    def validate(self):
        if self.preset not in PRESETS:
            raise FedalignError(f"fedpft.preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        for key, value in PRESETS[self.preset].items():
            current = getattr(self, key)
            if current in (-1, -1.0, ""):
                setattr(self, key, value)
        if self.covariance not in ("diag", "spherical", "full"):
            raise FedalignError(f"fedpft.covariance must be diag, spherical or full, got {self.covariance!r}")
        if self.components < 1 or self.epochs < 0 or self.batch_size < 1:
            raise FedalignError("fedpft: components and batch_size must be ≥ 1, epochs ≥ 0")


def n_components_for(n: int, K: int, variant: str = "fedalign") -> int:
    """Components fitted to a class of n samples (0: not fitted).

    fedalign: max(1, min(K, ⌊n/2⌋)) from n ≥ 2 on; reference: K when n > K, else 0.
    """
    if variant == "reference":
        return K if n > K else 0
    return 0 if n < 2 else max(1, min(K, n // 2))


def client_update(X, y, n_classes: int, config: Config, seed: int = 0, init=None) -> dict:
    """Fit one GMM per class; send counts and float16 parameters only."""
    from sklearn.mixture import GaussianMixture

    seed = check_seed(seed)   # scikit-learn's random_state: the seed as it is
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    d, K = X.shape[1], config.components
    cov_shape = {"diag": (n_classes, K, d), "spherical": (n_classes, K),
                 "full": (n_classes, K, d, d)}[config.covariance]
    counts = np.bincount(y, minlength=n_classes).astype(np.int64)
    ncomp = np.zeros(n_classes, dtype=np.int64)
    weights = np.zeros((n_classes, K), dtype=np.float16)
    means = np.zeros((n_classes, K, d), dtype=np.float16)
    covs = np.zeros(cov_shape, dtype=np.float16)
    reference = config.variant == "reference"
    for c in np.flatnonzero(counts):
        kc = n_components_for(int(counts[c]), K, config.variant)
        if kc == 0:
            if reference:  # the reference sends nothing about the class, not even its count
                counts[c] = 0
            continue
        Xc = X[y == c]
        while True:
            g = GaussianMixture(kc, covariance_type=config.covariance, max_iter=config.gmm_max_iter,
                                tol=config.gmm_tol, random_state=seed).fit(Xc)
            if reference or kc == 1 or g.weights_.min() * len(Xc) >= config.min_per_component:
                break
            kc -= 1
        ncomp[c] = kc
        weights[c, :kc] = g.weights_
        means[c, :kc] = g.means_
        covs[c, :kc] = np.minimum(g.covariances_, np.finfo(np.float16).max)
    return {"counts": counts, "n_components": ncomp, "weights": weights, "means": means,
            "covariances": covs}


def sample_class(msg: dict, c: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw n synthetic features (n, d) from a client's class-c GMM."""
    kc = int(msg["n_components"][c])
    w = msg["weights"][c, :kc].astype(np.float64)
    w = w / w.sum() if w.sum() > 0 else np.full(kc, 1.0 / kc)
    mu = msg["means"][c, :kc].astype(np.float64)
    cov = msg["covariances"][c, :kc].astype(np.float64)
    comp = rng.choice(kc, size=n, p=w)
    Z = rng.standard_normal((n, mu.shape[1]))
    if cov.ndim == 1:  # spherical: (kc,)
        return mu[comp] + Z * np.sqrt(np.maximum(cov[comp], VAR_FLOOR))[:, None]
    if cov.ndim == 2:  # diag: (kc, d)
        return mu[comp] + Z * np.sqrt(np.maximum(cov[comp], VAR_FLOOR))
    out = np.empty_like(Z)  # full: (kc, d, d)
    for j in range(kc):
        sel = comp == j
        S = 0.5 * (cov[j] + cov[j].T)
        w_, V = np.linalg.eigh(S)
        L = V * np.sqrt(np.maximum(w_, VAR_FLOOR))
        out[sel] = mu[j] + Z[sel] @ L.T
    return out


def sample_class_sklearn(msg: dict, c: int, n: int, covariance: str, seed: int) -> np.ndarray:
    """The reference's sampler: the GMM rebuilt in scikit-learn (float32 parameters, weights
    renormalised) and ``GaussianMixture.sample(n)`` from a fresh ``RandomState(seed)``."""
    from sklearn.mixture import GaussianMixture

    kc = int(msg["n_components"][c])
    w = msg["weights"][c, :kc].astype(np.float64)
    g = GaussianMixture(kc, covariance_type=covariance, random_state=check_seed(seed))
    g.weights_ = w / w.sum() if w.sum() > 0 else np.full(kc, 1.0 / kc)
    g.means_ = msg["means"][c, :kc].astype(np.float32)
    g.covariances_ = msg["covariances"][c, :kc].astype(np.float32)
    return g.sample(n)[0]


def synthesize(messages, n_classes: int, seed: int, sampler: str = "fedalign", covariance: str = "diag"):
    """Synthetic training set from the messages: (X (N, d) float32, y (N,), report).

    ``sampler="reference"``: :func:`sample_class_sklearn` per class GMM (``covariance`` names
    the covariance type), else one numpy generator for all (:func:`sample_class`).
    """
    rng = np.random.default_rng(seed)
    Xs, ys, unfitted = [], [], []
    for k, m in enumerate(messages):
        for c in np.flatnonzero(m["counts"]):
            if m["n_components"][c] == 0:
                unfitted.append((k, int(c), int(m["counts"][c])))
                continue
            n = int(m["counts"][c])
            if sampler == "reference":
                Xs.append(sample_class_sklearn(m, int(c), n, covariance, seed).astype(np.float32))
            else:
                Xs.append(sample_class(m, int(c), n, rng).astype(np.float32))
            ys.append(np.full(n, c, dtype=np.int64))
    if not Xs:
        raise FedalignError("fedpft: no client sent a fitted class GMM (every class has < 2 samples)")
    report = dict(unfitted=unfitted, n_synthetic=int(sum(len(v) for v in ys)))
    return np.concatenate(Xs), np.concatenate(ys), report


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    """The head trained on the synthetic set; ``info`` is the synthesis report
    (:func:`synthesize`: ``unfitted``, ``n_synthetic``) and ``notes`` names every class a
    client could not fit."""
    X, y, report = synthesize(messages, n_classes, seed, config.variant, config.covariance)
    W, b = train_softmax(X, y, n_classes, epochs=config.epochs, lr=config.lr,
                         batch_size=config.batch_size, optimizer=config.optimizer,
                         momentum=config.momentum, weight_decay=config.weight_decay, seed=seed)
    notes = [f"client {k} class {c}: a single sample, no GMM fitted (count sent)"
             for k, c, _ in report["unfitted"]]
    return LinearHead(W, b, dict(report), notes)

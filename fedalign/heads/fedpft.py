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
(``LAST_REPORT``); nothing is dropped silently.

Message arrays (C classes, K components, padded with zero weights):
``counts (C,) int64``, ``n_components (C,) int64``, ``weights (C, K) f16``,
``means (C, K, d) f16``, ``covariances`` f16 of shape (C, K, d) diag, (C, K) spherical or
(C, K, d, d) full.

Presets (Beitollahi et al., "Parametric feature transfer: one-shot federated learning with
foundation models", 2024): ``k10-diag`` K=10 diagonal, SGD lr 0.01 momentum 0.9, batch 128,
50 epochs; ``k1-spherical`` K=1 spherical, AdamW lr 1e-4, batch 32, 50 epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

#: What the last :func:`server_aggregate` call noticed (classes not fitted, components used).
LAST_REPORT: dict = {}


@dataclass
class Config:
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
    min_per_component: float = 2.0

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


def n_components_for(n: int, K: int) -> int:
    """Components fitted to a class of n samples (0: not fitted)."""
    return 0 if n < 2 else max(1, min(K, n // 2))


def client_update(X, y, n_classes: int, config: Config, seed: int = 0, init=None) -> dict:
    """Fit one GMM per class; send counts and float16 parameters only."""
    from sklearn.mixture import GaussianMixture

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
    for c in np.flatnonzero(counts):
        kc = n_components_for(int(counts[c]), K)
        if kc == 0:
            continue
        Xc = X[y == c]
        while True:
            g = GaussianMixture(kc, covariance_type=config.covariance, max_iter=config.gmm_max_iter,
                                random_state=seed % (2**32 - 1)).fit(Xc)
            if kc == 1 or g.weights_.min() * len(Xc) >= config.min_per_component:
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


def synthesize(messages, n_classes: int, seed: int):
    """Synthetic training set from the messages: (X (N, d) float32, y (N,), report)."""
    rng = np.random.default_rng(seed)
    Xs, ys, unfitted = [], [], []
    for k, m in enumerate(messages):
        for c in np.flatnonzero(m["counts"]):
            if m["n_components"][c] == 0:
                unfitted.append((k, int(c), int(m["counts"][c])))
                continue
            n = int(m["counts"][c])
            Xs.append(sample_class(m, int(c), n, rng).astype(np.float32))
            ys.append(np.full(n, c, dtype=np.int64))
    if not Xs:
        raise FedalignError("fedpft: no client sent a fitted class GMM (every class has < 2 samples)")
    report = dict(unfitted=unfitted, n_synthetic=int(sum(len(v) for v in ys)))
    return np.concatenate(Xs), np.concatenate(ys), report


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    X, y, report = synthesize(messages, n_classes, seed)
    LAST_REPORT.clear()
    LAST_REPORT.update(report)
    W, b = train_softmax(X, y, n_classes, epochs=config.epochs, lr=config.lr,
                         batch_size=config.batch_size, optimizer=config.optimizer,
                         momentum=config.momentum, weight_decay=config.weight_decay, seed=seed)
    return LinearHead(W, b)

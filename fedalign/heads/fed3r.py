"""Fed3R: a closed-form ridge-regression classifier from summed Gram matrices.

Client k sends G_k = X_kᵀX_k (d, d) and B_k = X_kᵀY_k (d, C) with Y the one-hot labels. The
server solves, exactly as on the pooled data,

    W = (λ I + Σ_k G_k)⁻¹ Σ_k B_k      (d, C),   λ = 0.01,

and normalises every column (class) of W to unit Euclidean norm. Scores are XW (no bias);
classes absent everywhere get a zero column and score −∞.

Fanì et al., "Accelerating heterogeneous federated learning with closed-form classifiers",
ICML 2024.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
from fedalign.heads import LinearHead

MESSAGE_KEYS = ("G", "B")


@dataclass
class Config:
    lam: float = 0.01
    normalize: bool = True

    def validate(self):
        if not self.lam > 0:
            raise FedalignError(f"fed3r.lam must be positive, got {self.lam}")


def client_update(X, y, n_classes: int, config: Config, seed: int = 0, init=None) -> dict:
    """G = XᵀX (d, d) and B = XᵀY (d, C), in float64."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.zeros((len(y), n_classes))
    Y[np.arange(len(y)), np.asarray(y)] = 1.0
    return {"G": X.T @ X, "B": X.T @ Y}


def ridge_solution(G, B, lam: float) -> np.ndarray:
    """(λI + G)⁻¹ B by Cholesky (λI + G is SPD for λ > 0)."""
    from scipy.linalg import cho_factor, cho_solve

    A = G + lam * np.eye(G.shape[0])
    return cho_solve(cho_factor(0.5 * (A + A.T)), B)


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    G = sum(m["G"] for m in messages)
    B = sum(m["B"] for m in messages)
    W = ridge_solution(G, B, config.lam)
    norms = np.linalg.norm(W, axis=0)
    present = norms > 0
    if config.normalize:
        W[:, present] /= norms[present]
    b = np.where(present, 0.0, -np.inf)
    return LinearHead(W.T.copy(), b)

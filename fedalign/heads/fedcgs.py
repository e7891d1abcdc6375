"""FedCGS: a linear discriminant head from exact global statistics, in one round.

Client k sends class counts N_{k,c}, class sums Σ_{i∈c} x_i, Σx and Σxxᵀ (all aggregates,
computed by :class:`fedalign.stats.Moments`). The server adds them up, which gives the pooled
statistics exactly, whatever the partition:

    μ_c = Σ_k s_{k,c} / N_c,   μ = Σx / N,   S = Σxxᵀ / N − μ μᵀ                 (total)
    S_w = S − Σ_c (N_c/N) (μ_c − μ)(μ_c − μ)ᵀ                                 (within-class)
    Σ = (1 − r) S + r (tr S / d) I                                            (ridge r)
    W = M Σ⁻¹,   b_c = −½ μ_cᵀ Σ⁻¹ μ_c + log(N_c / N)

M stacks the class means as rows. Classes absent from every client get b_c = −∞ (never
predicted). With ``covariance="within"`` and ``ridge=r`` this is scikit-learn's
``LinearDiscriminantAnalysis(solver="lsqr", shrinkage=r)`` on the pooled data.

The inverse uses a symmetric eigendecomposition with eigenvalues clipped at
``1e-12 · λ_max`` (:mod:`fedalign.linalg`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
from fedalign.heads import LinearHead

MESSAGE_KEYS = ("class_counts", "class_sums", "sum_x", "sum_xx")


@dataclass
class Config:
    covariance: str = "total"
    ridge: float = 0.01

    def validate(self):
        if self.covariance not in ("total", "within"):
            raise FedalignError(f"fedcgs.covariance must be total or within, got {self.covariance!r}")
        if not 0.0 <= self.ridge <= 1.0:
            raise FedalignError(f"fedcgs.ridge must be in [0, 1], got {self.ridge}")


def client_update(X, y, n_classes: int, config: Config, seed: int = 0, init=None) -> dict:
    """Aggregates only: (C,) counts, (C, d) class sums, (d,) Σx, (d, d) Σxxᵀ."""
    from fedalign.stats import Moments

    m = Moments(np.asarray(X).shape[1], n_classes=n_classes).update(X, y).finalize()
    sx, sxx = m.raw_sums()
    return {"class_counts": m.class_counts.copy(), "class_sums": m.class_sums.copy(),
            "sum_x": sx, "sum_xx": sxx}


def global_statistics(messages):
    """Summed statistics → (N_c (C,), μ_c (C, d), μ (d,), S total covariance (d, d))."""
    Nc = sum(m["class_counts"] for m in messages).astype(np.float64)
    sums = sum(m["class_sums"] for m in messages)
    N = Nc.sum()
    mu = sum(m["sum_x"] for m in messages) / N
    S = sum(m["sum_xx"] for m in messages) / N - np.outer(mu, mu)
    with np.errstate(invalid="ignore", divide="ignore"):
        Mc = np.where(Nc[:, None] > 0, sums / np.maximum(Nc, 1)[:, None], 0.0)
    return Nc, Mc, mu, 0.5 * (S + S.T)


def lda_head(Nc, Mc, Sigma) -> LinearHead:
    """W = M Σ⁻¹, b_c = −½ μ_cᵀ Σ⁻¹ μ_c + log(N_c/N); absent classes get b = −∞."""
    from fedalign.linalg import eigh_clipped

    lam, V = eigh_clipped(Sigma)
    W = ((Mc @ V) / lam) @ V.T
    present = Nc > 0
    b = np.full(len(Nc), -np.inf)
    b[present] = -0.5 * np.einsum("cd,cd->c", W[present], Mc[present]) + np.log(Nc[present] / Nc.sum())
    W[~present] = 0.0
    return LinearHead(W, b)


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    Nc, Mc, mu, S = global_statistics(messages)
    if config.covariance == "within":
        D = Mc - mu
        S = S - (D.T * (Nc / Nc.sum())) @ D
    d = S.shape[0]
    Sigma = (1.0 - config.ridge) * S + config.ridge * (np.trace(S) / d) * np.eye(d)
    return lda_head(Nc, Mc, Sigma)

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

Variants (``fedcgs.variant``):

- ``fedalign`` (default): total covariance normalised by N, ridge r = 0.01 towards the scaled
  identity (a d = 1280 covariance from a few hundred rows is singular without it).
- ``reference`` — the official FedCGS code (``main_fedcgs.py`` / ``utils_fl.eval_lda``):
  total covariance S = (Σxxᵀ − N μμᵀ) / (N − 1) (``ddof = 1``), γ = 0 (its ``gamma_list =
  [0]``: S + γI with γ = 0, i.e. ``ridge = 0``), W = M S⁻¹, b_c = −½ μ_cᵀ S⁻¹ μ_c + log(N_c/N).
  Differences that remain, and why:

  1. Inverse: the reference calls ``np.linalg.inv(S)``; here the eigen-clipped inverse above.
     The two agree whenever S is well conditioned; when N ≤ d (S singular) ``inv`` fails or
     returns round-off, and the clipped inverse is its reproducible limit.
  2. Classes absent from every client: the reference divides 0/0 (NaN means, log 0), so its
     scores for them are NaN; here they get b_c = −∞ and are never predicted.
  3. Precision: the reference accumulates in float64 from float32 features, as here; its
     head is then cast to float32 for scoring, here scores are float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
from fedalign.heads import LinearHead

MESSAGE_KEYS = ("class_counts", "class_sums", "sum_x", "sum_xx")


@dataclass
class Config:
    variant: str = "fedalign"
    covariance: str = "total"
    ridge: float = 0.01
    ddof: int = 0

    VARIANTS = {"fedalign": {}, "reference": dict(covariance="total", ridge=0.0, ddof=1)}

    def validate(self):
        if self.ddof not in (0, 1):
            raise FedalignError(f"fedcgs.ddof must be 0 (1/N) or 1 (1/(N−1)), got {self.ddof}")
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


def global_statistics(messages, ddof: int = 0):
    """Summed statistics → (N_c (C,), μ_c (C, d), μ (d,), S total covariance (d, d)).

    S = (Σxxᵀ − N μμᵀ) / (N − ddof).
    """
    Nc = sum(m["class_counts"] for m in messages).astype(np.float64)
    sums = sum(m["class_sums"] for m in messages)
    N = Nc.sum()
    mu = sum(m["sum_x"] for m in messages) / N
    if N - ddof <= 0:
        raise FedalignError(f"fedcgs: {int(N)} training rows in all, cannot normalise by N − {ddof}")
    S = (sum(m["sum_xx"] for m in messages) - N * np.outer(mu, mu)) / (N - ddof)
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
    Nc, Mc, mu, S = global_statistics(messages, config.ddof)
    if config.covariance == "within":
        D = Mc - mu
        S = S - (D.T * (Nc / (Nc.sum() - config.ddof))) @ D
    d = S.shape[0]
    Sigma = (1.0 - config.ridge) * S + config.ridge * (np.trace(S) / d) * np.eye(d)
    return lda_head(Nc, Mc, Sigma)

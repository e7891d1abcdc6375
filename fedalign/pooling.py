"""Pooling clients' statistics exactly: the Gaussian of a domain from its clients' aggregates.

With M clients per domain, a domain's test split is mapped by the *domain map*: the OT map of
the domain's pooled Gaussian (all its participating clients' training rows together) to the
server's barycenter (:func:`fedalign.align.domain_map`). The clients' moment sums
(:class:`fedalign.stats.Moments`, taken around different provisional shifts) are re-centred on
a common shift and added; Ledoit–Wolf is then computed on the pooled sums, which is exactly the
estimator on the concatenated rows. Re-centring ``y = x − s`` to ``y' = x − s' = y + δ``,
δ = s − s', with n rows:

    Σy'        = Σy + n δ
    Σy'y'ᵀ     = Σyyᵀ + Σy δᵀ + δ Σyᵀ + n δδᵀ
    Σ‖y'‖²y'   = Σ‖y‖²y + 2 (Σyyᵀ) δ + ‖δ‖² Σy + (tr Σyyᵀ) δ + 2 (δᵀΣy) δ + n ‖δ‖² δ
    Σ‖y'‖⁴     = Σ‖y‖⁴ + 4 δᵀ(Σyyᵀ)δ + n ‖δ‖⁴ + 4 δᵀ Σ‖y‖²y + 2 ‖δ‖² tr Σyyᵀ + 4 ‖δ‖² δᵀΣy

(expand ‖y + δ‖² = ‖y‖² + 2δᵀy + ‖δ‖²). Only aggregates travel: a domain map needs nothing a
client does not already send for SLOT-Align.
"""

from __future__ import annotations

import numpy as np

from fedalign.errors import FedalignError
from fedalign.stats import GaussianStats, Moments, gaussian_from_moments


def recentre(m: Moments, shift: np.ndarray) -> Moments:
    """The same moments taken around ``shift`` (d,) (exact algebra, module docstring)."""
    m.finalize()
    shift = np.asarray(shift, dtype=np.float64)
    dl = m.shift - shift
    n, sy, syy = m.n, m.sum_y, m.sum_yy
    e = float(dl @ dl)
    t = float(np.trace(syy))
    dsy = float(dl @ sy)
    out = Moments(m.d, shift=shift.copy(), n=n,
                  sum_y=sy + n * dl,
                  sum_yy=syy + np.outer(sy, dl) + np.outer(dl, sy) + n * np.outer(dl, dl),
                  sum_sqnorm_y=(m.sum_sqnorm_y + 2.0 * (syy @ dl) + e * sy + t * dl + 2.0 * dsy * dl
                                + n * e * dl),
                  sum_sqnorm2=(m.sum_sqnorm2 + 4.0 * float(dl @ syy @ dl) + n * e * e
                               + 4.0 * float(dl @ m.sum_sqnorm_y) + 2.0 * e * t + 4.0 * e * dsy))
    if m.class_counts is not None:
        out.n_classes = m.n_classes
        out.class_counts = m.class_counts.copy()
        out.class_sums = m.class_sums.copy()  # uncentred: unchanged
    return out


def pool_moments(moments) -> Moments:
    """Sum of several clients' moments (re-centred on their pooled mean first)."""
    moments = [m.finalize() for m in moments]
    if not moments:
        raise FedalignError("nothing to pool: no statistics given")
    d = moments[0].d
    if any(m.d != d for m in moments):
        raise FedalignError("cannot pool statistics of different dimensions")
    n = sum(m.n for m in moments)
    shift = sum(m.n * m.mean for m in moments) / n
    out = recentre(moments[0], shift)
    for m in moments[1:]:
        out = out.merge(recentre(m, shift))
    return out


def pool_stats(stats_list, shrinkage="auto") -> GaussianStats:
    """The pooled Gaussian proxy (mean, Ledoit–Wolf covariance) of several clients' stats.

    DP releases (``stats.dp``) are pooled by :func:`fedalign.dp.pool_released` (their noisy
    sums added, the same post-processing); DP and exact statistics are not mixed.
    """
    if any(st.dp is not None for st in stats_list):
        from fedalign.dp import pool_released

        return pool_released(stats_list, shrinkage)
    m = pool_moments([st.moments for st in stats_list])
    return gaussian_from_moments(m, shrinkage, "pooled statistics", stats_list[0].class_names)

"""A client's SLOT-Align statistics released with differential privacy, and their
post-processing into a mean and a covariance.

Release (:func:`release_stats`, :func:`release_stats_of_file`): rows clipped to ‖x‖ ≤ C, then
the count n, Σx and the upper triangle of Σxxᵀ (uncentred: no data-dependent shift leaves the
client) with Gaussian noise of σ_n, σ_s, σ_S (sensitivities 1, C, C²: :mod:`fedalign.dp.release`).

Post-processing (:func:`postprocess`; uses only the released values and the public σ's and C,
so it costs no budget):

1. ñ = max(n + noise, 2); μ̃ = Σ̃x / ñ, projected on the ball ‖μ‖ ≤ C (every clipped row lies
   in it, so their mean does);
2. Ŝ = sym(Σ̃xxᵀ)/ñ − μ̃μ̃ᵀ;
3. **PSD projection**: Ŝ = V diag(λ) Vᵀ (float64 ``eigh``), P = V diag(clip(λ, 0, C²)) Vᵀ —
   the projection onto {0 ≼ Σ ≼ C² I}, a convex set that holds the covariance of any clipped
   rows, so ‖P − Σ‖_F ≤ ‖Ŝ − Σ‖_F;
4. **shrinkage** Σ = (1 − s) P + s m I towards m = tr Ŝ / d (capped at C²/d; the trace of
   the projection if tr Ŝ ≤ 0).

The shrinkage rule. Ledoit–Wolf's intensity s = b²/δ² needs b² = E‖Ŝ − Σ‖²_F, which it
estimates from the fourth-moment sums Σ‖x‖²x and Σ‖x‖⁴ — not released. Releasing them too
would cost budget (sensitivities C³ and C⁴) to estimate only the sampling part of b², while
under DP the error of Ŝ is dominated by the noise, whose energy is known exactly from the
σ's. So s uses only released parts:

    ν  = (d² σ_S² + 2 (d + 1) ‖μ̃‖² σ_s²) / ñ² + (d² + 2d) σ_s⁴ / ñ⁴      (E‖noise of Ŝ‖²_F)
    q  = max(‖Ŝ‖²_F − ν, (tr Ŝ)²/d)                                    (≈ ‖Σ‖²_F, noise removed)
    b² = ν + (q + (tr Ŝ)²) / ñ                                        (noise + Gaussian sampling)
    s  = min(1, b² / ‖Ŝ − m I‖²_F)

The sampling term is the Gaussian-data value of E‖S_n − Σ‖²_F = (tr Σ² + (tr Σ)²)/n (the
fourth moment a Gaussian would have: the assumption OAS and RBLW make, Chen et al. 2010), the
noise term is exact. ν ignores the noise of ñ (a common scale factor). ``shrinkage=s`` in
(0, 1] fixes s instead; s = 0 (no shrinkage) is refused: P alone may be singular.

Y. Chen, A. Wiesel, Y. C. Eldar and A. O. Hero, "Shrinkage algorithms for MMSE covariance
estimation", IEEE Trans. Signal Processing 58 (2010).
"""

from __future__ import annotations

import numpy as np

from fedalign.dp.release import (COUNT_SHARE, FIRST_SHARE, SECOND_SHARE, Part, clip_rows,
                                 release)
from fedalign.errors import FedalignError

SHRINKAGE_RULE = ("noise-aware shrinkage to (tr Σ/d) I: s = min(1, b²/‖Ŝ − mI‖²), b² = the DP "
                  "noise energy (exact, from σ) + the Gaussian-data sampling error "
                  "(tr Σ² + tr² Σ)/n (no fourth moment is released)")


def check_shrinkage(shrinkage, flag: str = "shrinkage"):
    """``"auto"`` (the rule above) or a float in (0, 1]; ``"none"``/0 cannot be honoured."""
    if shrinkage in ("auto", None):
        return "auto"
    if shrinkage == "none" or float(shrinkage) == 0.0:
        raise FedalignError(f"{flag} none/0 cannot be honoured for a DP release: the noisy "
                            "covariance needs shrinkage to stay definite (use auto or a value in (0, 1])")
    s = float(shrinkage)
    if not 0.0 < s <= 1.0:
        raise FedalignError(f"{flag} must be in (0, 1] for a DP release, got {s}")
    return s


def postprocess(count: float, sum_x, sum_xx, sigma_sum: float, sigma_second: float,
                clip: float, shrinkage="auto") -> tuple[np.ndarray, np.ndarray, float, dict]:
    """Noisy (count, Σx (d,), Σxxᵀ (d, d)) → (mean (d,), covariance (d, d) SPD, s, info).

    The steps and the shrinkage rule are in the module docstring; ``info`` records what the
    post-processing did (all of it a function of released values).
    """
    shrinkage = check_shrinkage(shrinkage)
    sum_x = np.asarray(sum_x, dtype=np.float64)
    d = sum_x.shape[0]
    C2 = float(clip) ** 2
    n = max(float(count), 2.0)
    mu = sum_x / n
    norm = float(np.linalg.norm(mu))
    projected = norm > clip
    if projected:
        mu = mu * (clip / norm)
    S = np.asarray(sum_xx, dtype=np.float64)
    S = 0.5 * (S + S.T) / n - np.outer(mu, mu)
    w, V = np.linalg.eigh(S)
    wc = np.clip(w, 0.0, C2)
    P = (V * wc) @ V.T
    P = 0.5 * (P + P.T)
    tr = float(np.trace(S))
    m = min(tr / d, C2 / d)
    if m <= 0:
        m = min(float(wc.sum()) / d, C2 / d)
    if not m > 0:
        raise FedalignError("the DP release is all noise: its covariance has no positive "
                            "eigenvalue (raise ε, the number of rows or the clip norm)")
    nu = ((d * d * sigma_second ** 2 + 2.0 * (d + 1) * float(mu @ mu) * sigma_sum ** 2) / n ** 2
          + (d * d + 2 * d) * sigma_sum ** 4 / n ** 4)
    trp = max(tr, 0.0)
    D = S.copy()
    D[np.diag_indices(d)] -= m
    delta2 = float(np.sum(D * D))
    if shrinkage == "auto":
        q = max(float(np.sum(S * S)) - nu, trp * trp / d)
        b2 = nu + (q + trp * trp) / n
        s = 1.0 if delta2 <= 0 else min(1.0, b2 / delta2)
    else:
        s = float(shrinkage)
    cov = (1.0 - s) * P
    cov[np.diag_indices(d)] += s * m
    info = dict(shrinkage_rule=SHRINKAGE_RULE if shrinkage == "auto" else "fixed", shrinkage=s,
                count_used=n, mean_projected_to_ball=bool(projected),
                eigenvalues_clipped_at_0=int(np.count_nonzero(w < 0)),
                eigenvalues_capped_at_C2=int(np.count_nonzero(w > C2)),
                noise_energy=nu, target_scale=m)
    return mu, cov, s, info


def _sigmas(record: dict) -> tuple[float, float]:
    p = record["parts"]
    return float(p["sum"]["sigma"]), float(p["second_moment"]["sigma"])


def stats_from_release(count: float, sum_x, sum_xx, record: dict, shrinkage="auto",
                       class_names=()):
    """:class:`fedalign.stats.GaussianStats` of a released (count, Σx, Σxxᵀ): post-processed
    mean and covariance, moments around shift 0 without fourth-moment sums, ``dp`` the record
    (with the released count and what the post-processing did)."""
    from fedalign.stats import GaussianStats, Moments

    sig_s, sig_S = _sigmas(record)
    mean, cov, s, info = postprocess(count, sum_x, sum_xx, sig_s, sig_S, record["clip"], shrinkage)
    d = mean.shape[0]
    n = int(round(max(float(count), 2.0)))
    mom = Moments(d, shift=np.zeros(d), n=n, sum_y=np.asarray(sum_x, dtype=np.float64),
                  sum_yy=np.asarray(sum_xx, dtype=np.float64), sum_sqnorm_y=None,
                  sum_sqnorm2=None)
    rec = dict(record, released_count=float(count), postprocessing=info)
    return GaussianStats(n, mean, cov, s, mom, list(class_names), dp=rec)


def _release_moments(m, clipped: int, spec, rng, shrinkage, class_names):
    C = spec.clip
    parts = dict(count=Part(np.float64(m.n), 1.0, COUNT_SHARE),
                 sum=Part(m.sum_y, C, FIRST_SHARE),
                 second_moment=Part(m.sum_yy, C * C, SECOND_SHARE, symmetric=True))
    noisy, rec = release(parts, spec, rng, clipped, m.n)
    return stats_from_release(float(noisy["count"]), noisy["sum"], noisy["second_moment"], rec,
                              shrinkage, class_names)


def release_stats(X, spec, rng, shrinkage="auto", class_names=()):
    """DP Gaussian proxy of rows X (n, d) under ``spec`` (:class:`fedalign.dp.DPSpec`), noise
    from ``rng`` → :class:`fedalign.stats.GaussianStats` with its ``dp`` record."""
    from fedalign.stats import Moments

    check_shrinkage(shrinkage)
    Xc, k = clip_rows(X, spec.clip)
    m = Moments(Xc.shape[1], shift=np.zeros(Xc.shape[1])).update(Xc).finalize()
    return _release_moments(m, k, spec, rng, shrinkage, class_names)


def release_stats_of_file(path, spec, rng, shrinkage="auto", chunk_rows: int = 65536,
                          progress=None, backend=None):
    """:func:`release_stats` in one streaming pass over a features file (each chunk clipped,
    then accumulated in float64; ``backend`` as in :func:`fedalign.stats.moments_of_file`)."""
    from fedalign.files import open_features
    from fedalign.stats import Moments

    check_shrinkage(shrinkage)
    clipped = 0
    with open_features(path) as ff:
        names = ff.class_names
        m = Moments(ff.d, shift=np.zeros(ff.d), backend=backend)
        for _, X in ff.iter_chunks(chunk_rows):
            Xc, k = clip_rows(X, spec.clip)
            clipped += k
            m.update(Xc)
            if progress is not None:
                progress(len(X))
    m.finalize()
    if m.n < 2:
        raise FedalignError(f"{path}: need at least 2 rows for a DP release, got {m.n}")
    return _release_moments(m, clipped, spec, rng, shrinkage, names)


def pool_released(stats_list, shrinkage="auto"):
    """The pooled Gaussian of several clients' DP releases (a domain map): their noisy sums
    added (all around shift 0), the noise variances added, the same post-processing."""
    from fedalign.stats import GaussianStats

    recs = [st.dp for st in stats_list]
    if any(r is None or "parts" not in r for r in recs):
        raise FedalignError("cannot pool DP-released and exact statistics of one domain: give "
                            "the DP stats files of every client (or the exact ones of every client)")
    count = sum(float(r["released_count"]) for r in recs)
    sum_x = sum(st.moments.sum_y for st in stats_list)
    sum_xx = sum(st.moments.sum_yy for st in stats_list)
    sig_s = float(np.sqrt(sum(_sigmas(r)[0] ** 2 for r in recs)))
    sig_S = float(np.sqrt(sum(_sigmas(r)[1] ** 2 for r in recs)))
    clip = max(float(r["clip"]) for r in recs)
    mean, cov, s, info = postprocess(count, sum_x, sum_xx, sig_s, sig_S, clip, shrinkage)
    st0 = stats_list[0]
    mom = type(st0.moments)(st0.d, shift=np.zeros(st0.d), n=int(round(max(count, 2.0))),
                            sum_y=sum_x, sum_yy=sum_xx, sum_sqnorm_y=None, sum_sqnorm2=None)
    dp = dict(release="pooled differentially private releases (post-processing of each)",
              pooled=len(recs), postprocessing=info)
    return GaussianStats(mom.n, mean, cov, s, mom, list(st0.class_names), dp=dp)

"""The target's Gaussian when it lacks classes: label-shift-completed references.

Mapping every source onto the target's Gaussian N(μ_T, Σ_T) (SLOT toward the target, the
first half of the ``fedalign`` DaDiL pipeline) matches the sources' *whole* distribution to
the target's. When the target holds only some classes, μ_T and Σ_T describe those classes
only, and the map squeezes every source class — the missing ones too — into their region.
This module gives the target a reference that stands for all classes:

1. **Which classes the target holds.** An LDA of the sources' summed class statistics
   (FedCGS's message, :mod:`fedalign.heads.fedcgs`; ridge :data:`LDA_RIDGE` towards the scaled
   identity) gives posteriors p(c | x) on the target's rows, trained under the sources' class
   priors π_S. The EM of Saerens, Latinne & Decaestecker (Neural Computation 14, 2002)
   re-estimates the target's priors,

       q_ic ∝ p(c | x_i) π̂_c / π_S,c,        π̂_c ← (1/n) Σ_i q_ic,

   from π̂ = π_S until max_c |Δπ̂_c| ≤ ``tol``. Class c is *absent* when
   π̂_c < :data:`ABSENT_RATIO` · π_S,c.
2. **The completed Gaussian.** Each absent class c is put where the sources hold it, moved by
   the shift the present classes show, δ = μ_T − Σ_c π̂_c μ_c^S (μ_c^S: the pooled sources'
   class means), with the sources' pooled within-class covariance S_W:
   N(μ_c^S + δ, S_W), weight π_S,c. The target's Gaussian keeps weight w_T = 1 − Σ_absent π_S,c.
   The reference is the mixture's Gaussian:

       μ = w_T μ_T + Σ_c w_c m_c,
       Σ = w_T (Σ_T + (μ_T − μ)(μ_T − μ)ᵀ) + Σ_c w_c (S_W + (m_c − μ)(m_c − μ)ᵀ),

   with m_c = μ_c^S + δ. No absent class: the reference is (μ_T, Σ_T) itself, bit for bit.

Messages: each source sends its class statistics (class counts, class sums, Σx, Σxxᵀ:
``fedalign stats --per-class`` files hold them) to the target once; the target's rows never
leave it. The thresholds (:data:`LDA_RIDGE`, :data:`ABSENT_RATIO`) were fixed before any run;
see ``examples/dadil/RESULTS.md`` for what they gave.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedalign.errors import FedalignError

#: ridge of the LDA whose posteriors the EM re-weights (towards the scaled identity)
LDA_RIDGE = 0.1
#: a class is absent from the target when its estimated prior is below this fraction of the
#: sources' prior
ABSENT_RATIO = 0.2


@dataclass
class PriorEstimate:
    """Saerens' EM: the target's estimated class priors and how the EM ended."""

    priors: np.ndarray          # (C,)
    train_priors: np.ndarray    # (C,) the sources' π_S
    iterations: int
    converged: bool
    absent: list = field(default_factory=list)

    def record(self) -> dict:
        return dict(priors=[float(p) for p in self.priors],
                    train_priors=[float(p) for p in self.train_priors],
                    iterations=int(self.iterations), converged=bool(self.converged),
                    absent=[int(c) for c in self.absent], absent_ratio=ABSENT_RATIO,
                    lda_ridge=LDA_RIDGE, method="Saerens et al. (2002) EM on an LDA of the "
                    "sources' class statistics")


def em_priors(posteriors: np.ndarray, train_priors: np.ndarray, tol: float = 1e-8,
              max_iter: int = 1000) -> tuple[np.ndarray, int, bool]:
    """Saerens–Latinne–Decaestecker EM for the priors of unlabeled rows.

    Parameters
    ----------
    posteriors : (n, C) p(c | x_i) under ``train_priors``
    train_priors : (C,) the priors the posteriors were trained under (a class with prior 0
        stays at 0)

    Returns
    -------
    (priors (C,), iterations, converged)
    """
    P = np.asarray(posteriors, dtype=np.float64)
    pi_s = np.asarray(train_priors, dtype=np.float64)
    if P.ndim != 2 or P.shape[1] != pi_s.shape[0] or len(P) == 0:
        raise FedalignError(f"posteriors must be (n ≥ 1, {pi_s.shape[0]}), got {P.shape}")
    ratio = np.divide(1.0, pi_s, out=np.zeros_like(pi_s), where=pi_s > 0)
    pi = pi_s.copy()
    for it in range(1, max_iter + 1):
        Q = P * (pi * ratio)
        Q /= np.maximum(Q.sum(axis=1, keepdims=True), np.finfo(float).tiny)
        new = Q.mean(axis=0)
        done = np.max(np.abs(new - pi)) <= tol
        pi = new
        if done:
            return pi, it, True
    return pi, max_iter, False


def class_moments(messages: list) -> tuple:
    """Summed class statistics → (π_S (C,), class means μ_c^S (C, d), within-class covariance
    S_W (d, d)) of the pooled sources (:func:`fedalign.heads.fedcgs.global_statistics`)."""
    from fedalign.heads import fedcgs

    Nc, Mc, mu, S = fedcgs.global_statistics(messages)
    return Nc / Nc.sum(), Mc, fedcgs.within(S, Nc, Mc, mu)


def estimate_priors(messages: list, X_target: np.ndarray, n_classes: int,
                    tol: float = 1e-8) -> PriorEstimate:
    """The target's class priors from the sources' class statistics and its own rows (n, d)
    (step 1 of the module docstring), absent classes marked."""
    from fedalign.heads import fedcgs

    from scipy.special import softmax

    cfg = fedcgs.Config(covariance="within", ridge=LDA_RIDGE, shrink_to="identity")
    head = fedcgs.server_aggregate(messages, n_classes, cfg)
    Nc = sum(m["class_counts"] for m in messages).astype(np.float64)
    pi_s = Nc / Nc.sum()
    pi, it, ok = em_priors(softmax(head.scores(X_target), axis=1), pi_s, tol)
    absent = np.flatnonzero((pi_s > 0) & (pi < ABSENT_RATIO * pi_s)).tolist()
    return PriorEstimate(pi, pi_s, it, ok, absent)


def completed_gaussian(mean: np.ndarray, covariance: np.ndarray, messages: list,
                       estimate: PriorEstimate) -> tuple[np.ndarray, np.ndarray]:
    """The target's Gaussian (μ_T (d,), Σ_T (d, d)) completed by its absent classes (step 2
    of the module docstring); unchanged (the same arrays) when no class is absent."""
    if not estimate.absent:
        return mean, covariance
    pi_s, Mc, Sw = class_moments(messages)
    pi = estimate.priors / estimate.priors.sum()
    shift = mean - pi @ Mc
    absent = np.asarray(estimate.absent)
    w = pi_s[absent]
    w_t = 1.0 - w.sum()
    if w_t <= 0:
        raise FedalignError("every class of the sources looks absent from the target: "
                            "no completed reference")
    centres = Mc[absent] + shift
    mu = w_t * mean + w @ centres
    D = centres - mu
    dt = mean - mu
    cov = (w_t * (covariance + np.outer(dt, dt)) + w.sum() * Sw + (D.T * w) @ D)
    return mu, 0.5 * (cov + cov.T)


def target_reference(mean: np.ndarray, covariance: np.ndarray, messages: list,
                     X_target: np.ndarray, n_classes: int) -> tuple:
    """(μ, Σ, record): the reference the sources are mapped onto — the target's Gaussian,
    completed by the classes its rows (n, d) lack (module docstring)."""
    est = estimate_priors(messages, X_target, n_classes)
    mu, cov = completed_gaussian(mean, covariance, messages, est)
    return mu, cov, est.record()


def class_message(st, path) -> dict:
    """FedCGS's message (class counts, class sums, Σx, Σxxᵀ) from a ``stats --per-class``
    file's :class:`fedalign.stats.GaussianStats`; a file without class sums is refused."""
    m = st.moments
    if st.dp is not None or m is None or m.class_counts is None:
        raise FedalignError(f"{path}: no class sums (write the sources' stats with "
                            "`fedalign stats --per-class`, without --dp-epsilon)")
    sx, sxx = m.raw_sums()
    return dict(class_counts=m.class_counts.copy(), class_sums=m.class_sums.copy(), sum_x=sx,
                sum_xx=sxx)


def completed_reference(stats, messages: list, X_target: np.ndarray, n_classes: int) -> tuple:
    """:func:`target_reference` of the target's :class:`fedalign.stats.GaussianStats` as a
    one-client :class:`fedalign.align.Reference` (the EM's record in its metadata), with the
    record: what the sources' ``align --tau 1`` maps onto."""
    from fedalign.align import Reference

    mu, cov, rec = target_reference(stats.mean, stats.covariance, messages, X_target, n_classes)
    meta = dict(reference="the target's Gaussian, completed by the classes it lacks",
                label_shift=rec)
    return Reference(mu, cov, np.ones(1), np.array([stats.n]), meta), rec


def reference_from_files(target_features, source_stats) -> tuple:
    """The target's label-shift-completed reference from its features file and the sources'
    ``stats --per-class`` files: (:class:`fedalign.align.Reference`, record). What
    ``fedalign target-reference`` writes; every source file is checked against the target's
    dimension (its header) and the first source's classes before the target's rows are read."""
    from fedalign.files import open_features, read_features
    from fedalign.stats import compute_stats, load_stats

    if not source_stats:
        raise FedalignError("target-reference needs at least one source stats file")
    with open_features(target_features) as ff:
        d = ff.d
    msgs, C = [], None
    for p in source_stats:
        st = load_stats(p)
        if st.d != d:
            raise FedalignError(f"dimension mismatch: {p} has d={st.d}, "
                                f"{target_features} has d={d}")
        msg = class_message(st, p)
        if C is not None and len(msg["class_counts"]) != C:
            raise FedalignError(f"{p}: {len(msg['class_counts'])} classes, the first source "
                                f"has {C}")
        C = len(msg["class_counts"])
        msgs.append(msg)
    return reference_from_messages(target_features, msgs)


def reference_from_messages(target_features, messages: list) -> tuple:
    """The target's label-shift-completed reference from its features file and the sources'
    class statistics as they arrived (:func:`class_message`'s dicts, in the sources' order):
    (:class:`fedalign.align.Reference`, record) — :func:`reference_from_files` once it has
    read the sources' files (a front end that receives the messages instead calls this).

    Parameters
    ----------
    target_features : the target's features file (labels unused)
    messages : per source, ``class_counts`` (C,), ``class_sums`` (C, d), ``sum_x`` (d,),
        ``sum_xx`` (d, d); every source with the same C and the file's d
    """
    from fedalign.files import open_features, read_features
    from fedalign.stats import compute_stats

    if not messages:
        raise FedalignError("target-reference needs the class statistics of at least one source")
    with open_features(target_features) as ff:
        d = ff.d
    C = len(messages[0]["class_counts"])
    for k, msg in enumerate(messages):
        if len(msg["class_counts"]) != C or np.shape(msg["sum_xx"]) != (d, d):
            raise FedalignError(f"source {k}: class statistics of {len(msg['class_counts'])} "
                                f"classes and d={np.shape(msg['sum_x'])[-1]}, expected {C} "
                                f"classes and the target's d={d}")
    X, _, _ = read_features(target_features)
    return completed_reference(compute_stats(target_features), list(messages),
                               np.asarray(X, np.float64), C)


def onto_target(sources: list, X_target: np.ndarray, n_classes: int,
                shrinkage="auto") -> tuple:
    """Every source's rows mapped onto the target's completed Gaussian at τ = 1 (SLOT toward
    the target, the first half of the ``fedalign`` DaDiL pipeline), in memory.

    What ``stats --per-class`` of each source, ``target-reference`` and ``align --tau 1`` do
    with files: each source's class statistics (FedCGS's message) go to the target, which
    builds :func:`completed_reference` from its own rows; each source's own map onto it
    (:func:`fedalign.align.client_maps`: the reference's root once) moves its rows.

    Parameters
    ----------
    sources : list of (X (n_s, d), y (n_s,) int in [0, n_classes), or −1 for a row without
        a label): each source's rows; its class statistics are those of its labeled rows, its
        Gaussian and its map those of all its rows
    X_target : (n_T, d) the target's unlabeled rows
    n_classes : C
    shrinkage : covariance shrinkage of the target's and every source's Gaussian
        (:func:`fedalign.stats.gaussian_from_moments`): "auto" (Ledoit–Wolf, the default and
        the ``fedalign`` preset's) or s in [0, 1]; s = 1 makes each map one scale and a shift
        when nothing is absent (tried for the whole DaDiL pipeline at stop 42 and not adopted:
        examples/dadil/RESULTS.md)

    Returns
    -------
    mapped : list of (n_s, d) float64 arrays, the sources' rows on the target's Gaussian
    record : the EM's record (:func:`target_reference`: priors, absent classes)
    """
    from fedalign.align import apply_map, client_maps
    from fedalign.heads.fedcgs import class_statistics
    from fedalign.stats import gaussian_stats

    msgs = []
    for X, y in sources:
        lab = np.asarray(y) >= 0
        if lab.any():   # a source without labels is mapped but has no class statistics
            msgs.append(class_statistics(np.asarray(X)[lab], np.asarray(y)[lab], n_classes))
    if not msgs:
        raise FedalignError("no source has a labeled row: no class statistics to estimate "
                            "the target's classes from")
    ref, rec = completed_reference(gaussian_stats(X_target, shrinkage), msgs, X_target, n_classes)
    maps = client_maps([gaussian_stats(X, shrinkage) for X, _ in sources], ref,
                       domains=[f"source {k}" for k in range(len(sources))])
    return [apply_map(X, m, 1.0).astype(np.float64) for (X, _), m in zip(sources, maps)], rec

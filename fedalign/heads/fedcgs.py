"""FedCGS: a linear discriminant head from exact global statistics, in one round.

Client k sends class counts N_{k,c}, class sums Σ_{i∈c} x_i, Σx and Σxxᵀ (all aggregates,
computed by :class:`fedalign.stats.Moments`). The server adds them up, which gives the pooled
statistics exactly, whatever the partition:

    μ_c = Σ_k s_{k,c} / N_c,   μ = Σx / N,   S = Σxxᵀ / N − μ μᵀ                 (total)
    S_w = S − Σ_c (N_c/N) (μ_c − μ)(μ_c − μ)ᵀ                                 (within-class)
    Σ = (1 − r) S + r (tr S / d) I                                            (ridge r)
    Σ = (1 − r) S + r (tr(D⁻¹SD⁻¹) / d) D²,  D² = diag of the total covariance    (shrink_to diagonal)
    W = M Σ⁻¹,   b_c = −½ μ_cᵀ Σ⁻¹ μ_c + log(N_c / N)

M stacks the class means as rows. Classes absent from every client get b_c = −∞ (never
predicted). With ``covariance="within"`` and ``ridge=r`` this is scikit-learn's
``LinearDiscriminantAnalysis(solver="lsqr", shrinkage=r)`` on the pooled data.
With ``shrink_to="diagonal"`` the ridge pulls towards the per-feature variances instead of a
multiple of the identity: the same head as ``shrink_to="identity"`` on features standardised
by the pooled standard deviations (LDA is affine-equivariant), which no feature's scale can
dominate; features of zero variance keep a variance floor of 1e-12 · the largest.

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

Differential privacy (``fedcgs.dp_epsilon``, ``dp_delta``, ``clip``, ``dp_mechanism``; off by
default, ε = inf). Each client clips its labeled rows to ‖x‖ ≤ C and releases the class counts
(sensitivity 1), the class sums (C in total: a row touches one class) and the upper triangle
of Σxxᵀ (C²) with Gaussian noise (:mod:`fedalign.dp`; shares of μ² 5 / 25 / 70 %), seeded by
the client's seed; Σx is the sum of the noisy class sums (post-processing). The message also
carries the exact clipped fraction, outside the guarantee (:data:`fedalign.dp.CLIPPED_NOTE`).
The server post-processes: a class whose noisy total count is below 1 counts as absent, the
total covariance S is projected to PSD (eigenvalues clipped at 0) before the ridge, and the
noise floor 2σ√(K d)/N of the summed second moments (:func:`fedalign.dp.release.noise_floor`)
is added to its diagonal: directions that only the noise made are not inverted (with the ridge
alone, accuracy fell as ε grew); ``head.info["dp"]`` records the release (σ of every part) and
each client's clipped fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
from fedalign.heads import LinearHead
from fedalign.linalg import project_psd

#: What the ridge pulls the covariance towards: (tr S / d) I, or the scaled diagonal.
SHRINK_TARGETS = ("identity", "diagonal")
MESSAGE_KEYS = ("class_counts", "class_sums", "sum_x", "sum_xx")
OPTIONAL_MESSAGE_KEYS = ("clipped_fraction",)  # a DP message only


@dataclass
class Config:
    variant: str = "fedalign"
    covariance: str = "total"
    ridge: float = 0.01
    shrink_to: str = "identity"
    ddof: int = 0
    dp_epsilon: float = float("inf")
    dp_delta: float = 0.0
    clip: float = 0.0
    dp_mechanism: str = "analytic"

    VARIANTS = {"fedalign": {}, "reference": dict(covariance="total", ridge=0.0, ddof=1)}

    def validate(self):
        if self.ddof not in (0, 1):
            raise FedalignError(f"fedcgs.ddof must be 0 (1/N) or 1 (1/(N−1)), got {self.ddof}")
        if self.covariance not in ("total", "within"):
            raise FedalignError(f"fedcgs.covariance must be total or within, got {self.covariance!r}")
        if not 0.0 <= self.ridge <= 1.0:
            raise FedalignError(f"fedcgs.ridge must be in [0, 1], got {self.ridge}")
        if self.shrink_to not in SHRINK_TARGETS:
            raise FedalignError(f"fedcgs.shrink_to must be {' or '.join(SHRINK_TARGETS)}, "
                                f"got {self.shrink_to!r}")
        self.spec()

    def spec(self):
        """The DP budget of the message (None: exact message)."""
        from fedalign.dp import config_spec

        return config_spec(self, "fedcgs")


def _dp_parts(C: float, n_classes: int, d: int) -> dict:
    """The released parts of a DP message: name → (sensitivity, share, coordinates, symmetric)."""
    from fedalign.dp.release import COUNT_SHARE, FIRST_SHARE, SECOND_SHARE

    return dict(class_counts=(1.0, COUNT_SHARE, n_classes, False),
                class_sums=(C, FIRST_SHARE, n_classes * d, False),
                sum_xx=(C * C, SECOND_SHARE, d * (d + 1) // 2, True))


def client_update(X, y, n_classes: int, config: Config, seed: int = 0, init=None) -> dict:
    """Aggregates only: (C,) counts, (C, d) class sums, (d,) Σx, (d, d) Σxxᵀ; with DP the
    same keys noisy (counts as floats) plus the clipped fraction (module docstring)."""
    from fedalign.stats import Moments

    spec = config.spec()
    if spec is not None:
        return _dp_update(np.asarray(X), np.asarray(y), n_classes, spec, seed)
    m = Moments(np.asarray(X).shape[1], n_classes=n_classes).update(X, y).finalize()
    sx, sxx = m.raw_sums()
    return {"class_counts": m.class_counts.copy(), "class_sums": m.class_sums.copy(),
            "sum_x": sx, "sum_xx": sxx}


def class_statistics(X, y, n_classes: int) -> dict:
    """FedCGS's message (no DP) of labeled rows X (n, d), y (n,) int in [0, C): counts, class
    sums, Σx, Σxxᵀ — what the DaDiL target's ``lda`` head and the label-shift EM sum."""
    return client_update(np.asarray(X, np.float64), np.asarray(y, np.int64), n_classes, Config())


def _dp_update(X, y, n_classes: int, spec, seed) -> dict:
    from fedalign.dp import Part, clip_rows, noise_rng, release
    from fedalign.stats import Moments

    keep = y >= 0
    Xc, k = clip_rows(X[keep], spec.clip)
    d = Xc.shape[1]
    m = Moments(d, shift=np.zeros(d), n_classes=n_classes).update(Xc, y[keep]).finalize()
    plan = _dp_parts(spec.clip, n_classes, d)
    values = dict(class_counts=m.class_counts.astype(np.float64), class_sums=m.class_sums,
                  sum_xx=m.sum_yy)
    parts = {name: Part(values[name], sens, share, sym) for name, (sens, share, _, sym) in plan.items()}
    noisy, _ = release(parts, spec, noise_rng(seed))
    return {"class_counts": noisy["class_counts"], "class_sums": noisy["class_sums"],
            "sum_x": noisy["class_sums"].sum(axis=0), "sum_xx": noisy["sum_xx"],
            "clipped_fraction": np.float64(k / max(len(Xc), 1))}


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
    return head_of(Nc, Mc, ((Mc @ V) / lam) @ V.T)


def head_of(Nc, Mc, W) -> LinearHead:
    """The LDA head of weights W = M Σ⁻¹ (C, d): b_c = −½ w_cᵀ μ_c + log(N_c/N); absent
    classes (N_c = 0) get W_c = 0, b_c = −∞."""
    present = Nc > 0
    b = np.full(len(Nc), -np.inf)
    b[present] = -0.5 * np.einsum("cd,cd->c", W[present], Mc[present]) + np.log(Nc[present] / Nc.sum())
    W[~present] = 0.0
    return LinearHead(W, b)


def within(S, Nc, Mc, mu, ddof: int = 0) -> np.ndarray:
    """The within-class covariance S_w = S − Σ_c N_c/(N − ddof) (μ_c − μ)(μ_c − μ)ᵀ (d, d)."""
    D = Mc - mu
    return S - (D.T * (Nc / (Nc.sum() - ddof))) @ D


def floored_variances(v) -> np.ndarray:
    """The ``diagonal`` shrinkage target's variances D² (d,): ``v`` floored at 1e-12 · its
    largest (a constant feature stays invertible)."""
    v = np.asarray(v, np.float64)
    return np.maximum(v, 1e-12 * max(float(v.max()), 1e-300))


def shrink(S, ridge: float, shrink_to: str = "identity", variances=None) -> np.ndarray:
    """The shrunk covariance Σ (d, d) of the LDA head.

    ``identity``: Σ = (1 − r) S + r (tr S / d) I. ``diagonal``: with D² = diag(``variances``)
    (the total covariance's diagonal; S's own by default), floored at 1e-12 · its largest,
    Σ = (1 − r) S + r (tr(D⁻¹ S D⁻¹) / d) D² — the identity rule in standardised coordinates.
    """
    d = S.shape[0]
    if shrink_to == "identity":
        return (1.0 - ridge) * S + ridge * (np.trace(S) / d) * np.eye(d)
    v = floored_variances(np.diag(S) if variances is None else variances)
    scale = float(np.sum(np.diag(S) / v)) / d
    return (1.0 - ridge) * S + np.diag(ridge * scale * v)


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    spec = config.spec()
    if spec is not None:
        messages = _dp_counts(messages)
    Nc, Mc, mu, S = global_statistics(messages, config.ddof)
    if spec is not None:
        S = project_psd(S)
    total_variance = np.diag(S).copy()
    if config.covariance == "within":
        S = within(S, Nc, Mc, mu, config.ddof)
        if spec is not None:
            S = project_psd(S)
    d = S.shape[0]
    Sigma = shrink(S, config.ridge, config.shrink_to, total_variance)
    if spec is None:
        return lda_head(Nc, Mc, Sigma)
    from fedalign.dp import describe
    from fedalign.dp.release import SIMULATION_SEED, noise_floor

    rec = describe(spec, _dp_parts(spec.clip, n_classes, d))
    # the noise floor of Σ Σxxᵀ, divided by N as S is (fedalign.dp.release.noise_floor)
    floor = noise_floor(rec["parts"]["sum_xx"]["sigma"], d, len(messages)) / max(Nc.sum(), 1.0)
    head = lda_head(Nc, Mc, Sigma + floor * np.eye(d))
    head.info["dp"] = dict(record=dict(rec, noise_seed=SIMULATION_SEED),
                           clipped_fraction=[float(m["clipped_fraction"]) for m in messages])
    head.info["noise_floor"] = floor
    return head


def _dp_counts(messages) -> list:
    """Noisy class counts → the server's counts: a class whose summed noisy count is below 1
    is absent (its counts set to 0 in every message), others are kept as released."""
    total = sum(np.asarray(m["class_counts"], dtype=np.float64) for m in messages)
    present = total >= 1.0
    return [dict(m, class_counts=np.where(present, np.asarray(m["class_counts"], dtype=np.float64), 0.0),
                 class_sums=np.where(present[:, None], m["class_sums"], 0.0)) for m in messages]

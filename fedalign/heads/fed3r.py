"""Fed3R: a closed-form ridge-regression classifier from summed Gram matrices.

Client k sends G_k = X̃_kᵀX̃_k and B_k = X̃_kᵀY_k with Y the one-hot labels and X̃ = X, or
X̃ = [X, 1] with ``bias`` (then G_k also carries Σx and n_k, B_k the class counts). The server
solves, exactly as on the pooled data,

    W̃ = (λ I + Σ_k G_k)⁻¹ Σ_k B_k      ((d [+1]), C),   λ = 0.01,

splits W̃ into weights W (d, C) and, with ``bias``, the bias row β (C,), and divides every
class column by its weight norm ‖W_c‖ (and β_c by the same norm). Scores are x W + β.

Variants (``fed3r.variant``):

- ``fedalign`` (default): no bias column (with these frozen-encoder features it changed macro
  accuracy by less than 0.5 points on Office-Caltech10 and Digits, α = 0.1, seed 0, every τ);
  classes absent from every client get a zero column and score −∞ (never predicted).
- ``reference`` — the official Fed3R code (``src/fed3r.py``: ``fed3r_step``,
  ``calc_ridge_params``, ``normalize_W``; ``lambda_ = 0.01``): features with a bias column,
  λ I of size d + 1 (the bias is regularised too), W and bias divided by ‖W_c‖, a zero norm
  replaced by 1e-6 — so a class absent everywhere has W_c = 0, β_c = 0 and scores 0.
  Differences that remain, and why:

  1. Precision: the reference accumulates A and b in float32 on the GPU and solves in
     float32; here float64 and a Cholesky solve (the same solution up to float32 round-off,
     reproducible across devices).
  2. Order: the reference shuffles the client list and adds clients one by one (the sum is
     order-independent in exact arithmetic); here clients are added in the given order.

Differential privacy (``fed3r.dp_epsilon``, ``dp_delta``, ``clip``, ``dp_mechanism``; off by
default, ε = inf). Each client clips its rows to ‖x‖ ≤ C (before the bias column) and releases
the upper triangle of G (sensitivity C², or √(C⁴ + C² + 1) with the bias column) and B (C, or
√(C² + 1)) with Gaussian noise (:mod:`fedalign.dp`; shares of μ² 70 / 30 %), seeded by the
client's seed, plus the exact clipped fraction (outside the guarantee). The server projects
Σ_k G_k on the PSD cone (eigenvalues clipped at 0) and adds (λ + 2σ_G√(K d)) I: the ridge
plus the noise floor of the summed G (:func:`fedalign.dp.release.noise_floor`; with λ alone
the directions only the noise made were inverted and accuracy fell as ε grew);
``head.info["dp"]`` records the release and each client's clipped fraction.
Under DP a class absent from every client still gets a (noise) column.

Fanì et al., "Accelerating heterogeneous federated learning with closed-form classifiers",
ICML 2024.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
from fedalign.heads import LinearHead

MESSAGE_KEYS = ("G", "B")
OPTIONAL_MESSAGE_KEYS = ("clipped_fraction",)  # a DP message only


@dataclass
class Config:
    variant: str = "fedalign"
    lam: float = 0.01
    normalize: bool = True
    bias: bool = False
    dp_epsilon: float = float("inf")
    dp_delta: float = 0.0
    clip: float = 0.0
    dp_mechanism: str = "analytic"

    VARIANTS = {"fedalign": {}, "reference": dict(lam=0.01, normalize=True, bias=True)}

    def validate(self):
        if not self.lam > 0:
            raise FedalignError(f"fed3r.lam must be positive, got {self.lam}")
        self.spec()

    def spec(self):
        """The DP budget of the message (None: exact message)."""
        from fedalign.dp import config_spec

        return config_spec(self, "fed3r")


def _dp_parts(C: float, bias: bool, n_classes: int, d: int) -> dict:
    """The released parts of a DP message: name → (sensitivity, share, coordinates, symmetric);
    d includes the bias column."""
    from fedalign.dp import sensitivities
    from fedalign.dp.release import SECOND_SHARE

    s = sensitivities(C, bias)
    return dict(G=(s["gram"], SECOND_SHARE, d * (d + 1) // 2, True),
                B=(s["cross"], 1.0 - SECOND_SHARE, d * n_classes, False))


def client_update(X, y, n_classes: int, config: Config, seed: int = 0, init=None) -> dict:
    """G = X̃ᵀX̃ ((d [+1]), (d [+1])) and B = X̃ᵀY ((d [+1]), C), in float64; with DP both
    noisy plus the clipped fraction (module docstring)."""
    spec = config.spec()
    X = np.asarray(X, dtype=np.float64)
    k = 0
    if spec is not None:
        from fedalign.dp import clip_rows

        X, k = clip_rows(X, spec.clip)
    if config.bias:
        X = np.hstack([X, np.ones((len(X), 1))])
    Y = np.zeros((len(y), n_classes))
    Y[np.arange(len(y)), np.asarray(y)] = 1.0
    if spec is None:
        return {"G": X.T @ X, "B": X.T @ Y}
    from fedalign.dp import Part, noise_rng, release

    plan = _dp_parts(spec.clip, config.bias, n_classes, X.shape[1])
    values = dict(G=X.T @ X, B=X.T @ Y)
    parts = {name: Part(values[name], sens, share, sym) for name, (sens, share, _, sym) in plan.items()}
    noisy, _ = release(parts, spec, noise_rng(seed))
    return {"G": noisy["G"], "B": noisy["B"], "clipped_fraction": np.float64(k / max(len(X), 1))}


def ridge_solution(G, B, lam: float) -> np.ndarray:
    """(λI + G)⁻¹ B by Cholesky (λI + G is SPD for λ > 0)."""
    from scipy.linalg import cho_factor, cho_solve

    A = G + lam * np.eye(G.shape[0])
    return cho_solve(cho_factor(0.5 * (A + A.T)), B)


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    G = sum(m["G"] for m in messages)
    B = sum(m["B"] for m in messages)
    spec = config.spec()
    if spec is not None:
        from fedalign.dp import describe

        from fedalign.dp.release import SIMULATION_SEED, noise_floor

        rec = describe(spec, _dp_parts(spec.clip, config.bias, n_classes, G.shape[0]))
        # (λ' I + P(G))⁻¹ B from one eigendecomposition, P(G) the PSD projection of Σ G and
        # λ' = λ + the noise floor of Σ G (fedalign.dp.release.noise_floor)
        lam = config.lam + noise_floor(rec["parts"]["G"]["sigma"], G.shape[0], len(messages))
        w, V = np.linalg.eigh(0.5 * (G + G.T))
        Wt = (V / (np.clip(w, 0.0, None) + lam)) @ (V.T @ B)
        head = _head(Wt, config)
        head.info["ridge_dp"] = lam
        head.info["dp"] = dict(record=dict(rec, noise_seed=SIMULATION_SEED),
                               clipped_fraction=[float(m["clipped_fraction"]) for m in messages])
        return head
    return _head(ridge_solution(G, B, config.lam), config)


def _head(Wt, config: Config) -> LinearHead:
    W, beta = (Wt[:-1], Wt[-1].copy()) if config.bias else (Wt, np.zeros(Wt.shape[1]))
    norms = np.linalg.norm(W, axis=0)
    present = norms > 0
    if config.variant == "reference":
        if config.normalize:
            norms = np.where(present, norms, 1e-6)
            W, beta = W / norms, beta / norms
        return LinearHead(W.T.copy(), beta)
    if config.normalize:
        W[:, present] /= norms[present]
        beta[present] /= norms[present]
    b = np.where(present, beta, -np.inf)
    return LinearHead(W.T.copy(), b)

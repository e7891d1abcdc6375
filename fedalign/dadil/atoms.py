"""Dictionary atoms: labeled diagonal GMMs, their seeded starts, and the simplex.

A dictionary is A labeled diagonal GMMs (atoms) with K components each: means (A, K, d),
variances (A, K, d) ≥ a floor and label logits (A, K, C) (labels = softmax of the logits).
Every domain ℓ is represented by weights α_ℓ ∈ Δ_A and its barycenter B(α_ℓ; atoms)
(:mod:`fedalign.dadil.barycenter`).

References
----------
J. Duchi et al., "Efficient projections onto the l1-ball for learning in high dimensions",
ICML 2008 (simplex projection).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.dadil.barycenter import softmax
from fedalign.errors import FedalignError
from fedalign.gmm import GMM, floor_from_variance


@dataclass
class Atoms:
    """Dictionary atoms (numpy float64).

    Attributes
    ----------
    means : (A, K, d)
    variances : (A, K, d), ≥ min_var
    label_logits : (A, K, C); labels = softmax over C
    """

    means: np.ndarray
    variances: np.ndarray
    label_logits: np.ndarray

    def __post_init__(self):
        self.means = np.asarray(self.means, dtype=np.float64)
        self.variances = np.asarray(self.variances, dtype=np.float64)
        self.label_logits = np.asarray(self.label_logits, dtype=np.float64)
        if self.means.ndim != 3 or self.variances.shape != self.means.shape \
                or self.label_logits.ndim != 3 \
                or self.label_logits.shape[:2] != self.means.shape[:2]:
            raise FedalignError(
                f"atom shapes disagree: means {self.means.shape}, variances "
                f"{self.variances.shape}, label logits {self.label_logits.shape}")

    @property
    def n_atoms(self) -> int:
        return int(self.means.shape[0])

    @property
    def n_components(self) -> int:
        return int(self.means.shape[1])

    @property
    def d(self) -> int:
        return int(self.means.shape[2])

    @property
    def n_classes(self) -> int:
        return int(self.label_logits.shape[2])

    @property
    def labels(self) -> np.ndarray:
        """Soft labels softmax(label_logits): (A, K, C)."""
        return softmax(self.label_logits)

    def copy(self) -> "Atoms":
        return Atoms(self.means.copy(), self.variances.copy(), self.label_logits.copy())


def init_atoms(n_atoms: int, n_components: int, d: int, n_classes: int, seed=0,
               center=None, scale=None) -> Atoms:
    """Fresh atoms, seeded: means center + scale ⊙ ε (ε ~ N(0, I)), variances scale², zero
    label logits (uniform labels).

    ``center`` / ``scale`` are scalars or (d,) arrays (default 0 and 1: means ~ N(0, I),
    variances 1). ``seed`` is anything :func:`numpy.random.default_rng` takes (an int, a
    :class:`numpy.random.SeedSequence`).
    """
    rng = np.random.default_rng(seed)
    shape = (int(n_atoms), int(n_components), int(d))
    c = (np.zeros(int(d)) if center is None
         else np.broadcast_to(np.asarray(center, np.float64), (int(d),)))
    sc = (np.ones(int(d)) if scale is None
          else np.broadcast_to(np.asarray(scale, np.float64), (int(d),)))
    return Atoms(c + sc * rng.standard_normal(shape), np.broadcast_to(sc**2, shape).copy(),
                 np.zeros((int(n_atoms), int(n_components), int(n_classes))))


def init_atoms_from_gmms(gmms, n_atoms: int, n_components: int, n_classes: int, seed: int = 0,
                         noise: float = 0.1) -> Atoms:
    """Atoms started from labeled GMMs: atom a copies the components of gmms[a mod len]
    (cycled or cut to K), plus noise·std jitter on the means; labels from their labels."""
    rng = np.random.default_rng(seed)
    M, V, L = [], [], []
    for a in range(int(n_atoms)):
        g = gmms[a % len(gmms)]
        idx = np.arange(int(n_components)) % g.K
        std = np.sqrt(g.variances[idx])
        M.append(g.means[idx] + noise * std * rng.standard_normal(std.shape))
        V.append(g.variances[idx])
        lab = (g.labels[idx] if g.labels is not None
               else np.full((len(idx), n_classes), 1 / n_classes))
        L.append(np.log(np.clip(lab, 1e-3, None)))
    return Atoms(np.stack(M), np.stack(V), np.stack(L))


def project_simplex(v) -> np.ndarray:
    """Euclidean projection onto the probability simplex {x ≥ 0, Σ x = 1} (Duchi et al. 2008).

    Works on the last axis of an array of any shape.
    """
    v = np.asarray(v, dtype=np.float64)
    u = np.sort(v, axis=-1)[..., ::-1]
    css = np.cumsum(u, axis=-1) - 1.0
    ind = np.arange(1, v.shape[-1] + 1)
    cond = u - css / ind > 0
    rho = cond.shape[-1] - 1 - np.argmax(cond[..., ::-1], axis=-1)
    theta = np.take_along_axis(css, rho[..., None], -1) / (rho[..., None] + 1.0)
    return np.maximum(v - theta, 0.0)


def data_moments(gmm: GMM) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and variance of a diagonal mixture: (d,), (d,).

    μ = Σ_k w_k m_k,  σ² = Σ_k w_k (v_k + m_k²) − μ²  (clipped at 0).
    """
    w = gmm.weights / gmm.weights.sum()
    mu = w @ gmm.means
    var = w @ (gmm.variances + gmm.means**2) - mu**2
    return mu, np.maximum(var, 0.0)


def relative_floor(gmm: GMM, rel: float) -> np.ndarray:
    """Variance floor rel · σ²_d per dimension from the domain's own GMM (d,)
    (:func:`fedalign.gmm.floor_from_variance` of :func:`data_moments`)."""
    return floor_from_variance(data_moments(gmm)[1], rel)


"""What a client releases with noise: the budget (:class:`DPSpec`), clipping, the sensitivities
of the released sums, and the Gaussian release of several named parts (:func:`release`).

Neighbouring relation: **add/remove one row** — two datasets are neighbours when one is the
other with one feature row (and its label) more. The row count is then private too and is
released with noise.

Sensitivities (rows clipped to ‖x‖₂ ≤ C first, :func:`clip_rows`; proof sketches). Adding or
removing the row x changes

- the count n by 1: Δ = 1;
- Σx by x: Δ = ‖x‖ ≤ C;
- Σxxᵀ by xxᵀ. Only its upper triangle (diagonal included, d(d+1)/2 numbers) is released and
  mirrored, and ‖upper(xxᵀ)‖² = Σᵢ xᵢ⁴ + Σ_{i<j} xᵢ²xⱼ² ≤ (Σᵢ xᵢ²)² = ‖x‖⁴, so Δ = C²
  (tight: x = C e₁);
- the class counts (N_c)_c by one unit vector (a row has one label): Δ = 1;
- the class sums (Σ_{i∈c} xᵢ)_c in one class only, by x: Δ = C (not C per class). Σx is
  then the sum of the noisy class sums (post-processing, no extra budget);
- Fed3R's G = X̃ᵀX̃ with X̃ = X: Δ = C² (as Σxxᵀ); with the bias column x̃ = [x, 1], upper(x̃x̃ᵀ)
  is upper(xxᵀ), x (the last column above the corner) and the corner 1, so
  ‖upper(x̃x̃ᵀ)‖² ≤ C⁴ + C² + 1 and Δ = √(C⁴ + C² + 1) (tighter than (‖x̃‖²)² = (C² + 1)²);
- Fed3R's B = X̃ᵀY by x̃ in one class column: Δ = C, or √(C² + 1) with the bias column.

Releasing several parts with independent noise σᵢ is one Gaussian mechanism on the scaled
concatenation (fᵢ/σᵢ)ᵢ, whose sensitivity is at most √(Σ (Δᵢ/σᵢ)²) = μ — attained for the
sums above by one row x = C e₁, so the composed guarantee is also tight. A budget (ε, δ) is
turned into a total μ (:func:`fedalign.dp.calibration.mu_for_budget`) and split over the parts
by their shares of μ² (of ρ): part i gets μᵢ = μ √(wᵢ / Σw) and σᵢ = Δᵢ / μᵢ.

Noise. Draws come from a seeded numpy ``Generator`` (:func:`noise_rng`) so that simulations
are reproducible; whoever knows the seed can remove the noise, so a deployment draws it
from a fresh OS seed (what ``fedalign stats`` does without ``--seed``). numpy's normal
sampler is not hardened against floating-point attacks (Mironov 2012).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedalign.dp.calibration import MECHANISMS, account, compose_mu, epsilon_for_mu, mu_for_budget
from fedalign.errors import FedalignError

NEIGHBOURING = ("add/remove one row: neighbouring datasets differ by one feature row (and "
                "its label), so the row count is private and released with noise")

#: A-priori shares of μ² (of ρ) in one release: counts 5 %, first moments 25 %, second moments
#: 70 % (a second moment has d(d+1)/2 noisy coordinates and dominates the error of a
#: covariance). Chosen before any run, never tuned on data.
COUNT_SHARE, FIRST_SHARE, SECOND_SHARE = 0.05, 0.25, 0.70

SIMULATION_SEED = ("derived from the run's seed and the client index: reproducible, so the "
                   "noise is not secret (a simulation; a deployment draws it from the OS)")

CLIPPED_NOTE = ("exact, computed on the private rows and not covered by the guarantee (it "
                "changes by at most 1/n per row); drop it before sending for a fully covered "
                "release")


@dataclass(frozen=True)
class DPSpec:
    """A privacy budget and the clipping norm: (ε, δ)-DP of one release, rows clipped to
    ‖x‖₂ ≤ ``clip``, calibrated by ``mechanism`` ("analytic" or "zcdp",
    :mod:`fedalign.dp.calibration`). Built through :func:`make_spec` (validated)."""

    epsilon: float
    delta: float
    clip: float
    mechanism: str = "analytic"

    def mu(self) -> float:
        """The total GDP μ the release may spend."""
        return mu_for_budget(self.epsilon, self.delta, self.mechanism)

    def share(self, fraction: float) -> "DPSpec":
        """The budget of a release that gets ``fraction`` of this one's μ² (ρ): the ε at the
        same δ whose calibration gives μ √fraction (two such releases compose to this one)."""
        if fraction >= 1.0:
            return self
        mu = self.mu() * math.sqrt(fraction)
        return DPSpec(epsilon_for_mu(mu, self.delta, self.mechanism), self.delta, self.clip,
                      self.mechanism)


#: Range of the clip norm C: the release's moments hold (C/μ)⁴ (the variance of Σxxᵀ's
#: noise, squared), which must stay a float64 (``--clip 1e150`` overflowed, ``--clip 1e-300``
#: gave σ = 0 and a division by zero).
MIN_CLIP, MAX_CLIP = 1e-30, 1e30
#: Range of the budget's GDP μ (the noise σ is the sensitivity over μ): ``--dp-epsilon 1e308``
#: (a TypeError), ``1e-150`` with ``--dp-delta 1e-150`` (an overflow) or ``--dp-mechanism
#: zcdp`` (σ = inf, a division by zero) ended in tracebacks. μ < 1e-12 is a release of pure
#: noise, μ > 1e12 one without any.
MIN_MU, MAX_MU = 1e-12, 1e12


def make_spec(epsilon, delta, clip, mechanism="analytic", names=None) -> DPSpec:
    """A validated :class:`DPSpec`; ``names`` maps epsilon/delta/clip/mechanism to the names
    the caller's user typed (``--dp-epsilon``, ``fedcgs.dp_epsilon``) for the error lines."""
    nm = {**dict(epsilon="epsilon", delta="delta", clip="clip", mechanism="mechanism"), **(names or {})}

    def num(v, key):
        try:
            return float(v)
        except (TypeError, ValueError):
            raise FedalignError(f"{nm[key]} must be a number, got {v!r}") from None

    eps, dlt, c = num(epsilon, "epsilon"), num(delta, "delta"), num(clip, "clip")
    if not eps > 0 or math.isinf(eps):
        raise FedalignError(f"{nm['epsilon']} must be a positive finite number, got {epsilon}")
    if not 0.0 < dlt < 1.0:
        raise FedalignError(f"{nm['delta']} must be in (0, 1), got {delta}")
    if not c > 0 or math.isinf(c):
        raise FedalignError(f"{nm['clip']} (the L2 norm rows are clipped to) must be a positive "
                            f"finite number, got {clip}")
    if not MIN_CLIP <= c <= MAX_CLIP:
        raise FedalignError(f"{nm['clip']} (the L2 norm rows are clipped to) must be in "
                            f"[{MIN_CLIP:g}, {MAX_CLIP:g}] (the noise's moments hold its "
                            f"fourth power), got {clip}")
    mech = str(mechanism).strip().lower()
    if mech not in MECHANISMS:
        raise FedalignError(f"{nm['mechanism']} must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    spec = DPSpec(eps, dlt, c, mech)
    try:
        mu = spec.mu()
    except (ArithmeticError, ValueError):
        mu = math.nan
    if not MIN_MU <= mu <= MAX_MU:
        raise FedalignError(f"{nm['epsilon']} {epsilon:g} at {nm['delta']} {delta:g} calibrates "
                            f"a noise multiplier μ = {mu:.3g}, outside [{MIN_MU:g}, {MAX_MU:g}] "
                            "(a release of pure noise, or none): give an ε nearer 1")
    return spec


def config_spec(cfg, head: str) -> DPSpec | None:
    """The budget of a head's DP message from its Config (``dp_epsilon`` inf: off)."""
    eps = float(cfg.dp_epsilon)
    if math.isinf(eps) and eps > 0:
        if cfg.dp_delta != 0.0 or cfg.clip != 0.0:
            raise FedalignError(f"{head}.dp_delta and {head}.clip are for a DP message: also give "
                                f"{head}.dp_epsilon")
        return None
    return make_spec(eps, cfg.dp_delta, cfg.clip, cfg.dp_mechanism,
                     {k: f"{head}.{v}" for k, v in dict(epsilon="dp_epsilon", delta="dp_delta",
                                                         clip="clip", mechanism="dp_mechanism").items()})


#: The Config fields of a head's DP message (dropped from a non-DP head's recorded options).
CONFIG_FIELDS = ("dp_epsilon", "dp_delta", "clip", "dp_mechanism")


def config_record(cfg) -> dict:
    """``dataclasses.asdict(cfg)``, without the DP fields when DP is off (so the recorded
    options of a non-DP head are what they were before DP existed)."""
    import dataclasses

    out = dataclasses.asdict(cfg)
    if math.isinf(float(out.get("dp_epsilon", 0.0))):
        for k in CONFIG_FIELDS:
            out.pop(k, None)
    return out


def noise_rng(seed, *keys: int) -> np.random.Generator:
    """The noise generator of one release: seeded by ``seed`` and ``keys`` (a reproducible
    simulation; its own stream, apart from any other use of the seed) or, with ``seed=None``,
    from the OS (a deployment)."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([int(seed), 0x44505, *map(int, keys)]))


def clip_rows(X, clip: float) -> tuple[np.ndarray, int]:
    """Rows scaled to ‖x‖₂ ≤ C (x ↦ x · min(1, C/‖x‖)), float64. Returns (X̃ (n, d), number
    of rows that were clipped)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    over = norms > clip
    if np.any(over):
        X = X.copy()
        X[over] *= (clip / norms[over])[:, None]
    return X, int(np.count_nonzero(over))


def sensitivities(clip: float, bias: bool = False) -> dict:
    """L2 sensitivities of the released sums for rows clipped to C (module docstring)."""
    C = float(clip)
    return dict(count=1.0, sum=C, second_moment=C * C, class_counts=1.0, class_sums=C,
                gram=math.sqrt(C ** 4 + C * C + 1.0) if bias else C * C,
                cross=math.sqrt(C * C + 1.0) if bias else C)


@dataclass
class Part:
    """One released array: its exact value, L2 sensitivity, share of μ², and whether it is a
    symmetric (d, d) matrix released as its upper triangle (noise mirrored)."""

    value: np.ndarray
    sensitivity: float
    share: float
    symmetric: bool = False


def sym_noise(rng: np.random.Generator, d: int, sigma: float) -> np.ndarray:
    """(d, d) symmetric noise: N(0, σ²) on the upper triangle (diagonal included), mirrored."""
    Z = rng.normal(0.0, sigma, size=(d, d))
    U = np.triu(Z)
    return U + np.triu(U, 1).T


def noise_floor(sigma: float, d: int, n_messages: int = 1) -> float:
    """2σ√(k d): the spectral norm that the sum of k symmetric (d, d) Gaussian noise matrices
    (entries N(0, σ²), upper triangle mirrored, as :func:`sym_noise` draws) reaches, the edge
    of Wigner's semicircle (for d ≳ 50 the norm exceeds it by O(σ √k d^{-1/6}) only).

    A server that inverts a noisy Gram or covariance matrix adds it to the diagonal: after the
    PSD projection, directions that only the noise made (eigenvalues anywhere in [0, 2σ√(kd)])
    would otherwise be inverted with the head's own small ridge and amplify the noise of the
    other released sums (measured: Fed3R on Office-Caltech10 fell from 95 % to 15 % as ε grew
    from 100 to 1e6 with the ridge alone). Post-processing: σ, d and k are public.
    """
    return 2.0 * float(sigma) * math.sqrt(float(n_messages) * float(d))


def describe(spec: DPSpec, parts: dict, clipped: int | None = None,
             n_rows: int | None = None) -> dict:
    """The record of a release under ``spec`` of ``parts`` {name: (sensitivity, share,
    coordinates, symmetric)}: σᵢ = Δᵢ / (μ √(wᵢ/Σw)), data-independent (a server can
    recompute it from the budget), plus the clipped fraction when given.

    Returns a JSON-ready dict: mechanism, ε, δ, C, neighbouring relation, each part's
    sensitivity, share, σ and number of noisy coordinates, and the guarantee (μ, ρ, ε of the
    exact profile, ε through zCDP) recomputed from the σ's.
    """
    mu = spec.mu()
    total = sum(float(p[1]) for p in parts.values())
    rec_parts = {}
    for name, (sens, share, coords, symmetric) in parts.items():
        sigma = float(sens) / (mu * math.sqrt(float(share) / total))
        rec_parts[name] = dict(sensitivity=float(sens), sigma=sigma, share=float(share) / total,
                               coordinates=int(coords), symmetric=bool(symmetric))
    mu_rec = compose_mu(q["sensitivity"] / q["sigma"] for q in rec_parts.values())
    record = dict(release="differentially private (Gaussian mechanism)", mechanism=spec.mechanism,
                  epsilon=spec.epsilon, delta=spec.delta, clip=spec.clip, neighbouring=NEIGHBOURING,
                  parts=rec_parts, guarantee=account(mu_rec, spec.delta))
    if clipped is not None and n_rows:
        record.update(clipped_fraction=clipped / n_rows, clipped_fraction_note=CLIPPED_NOTE)
    return record


def part_shape(value: np.ndarray, symmetric: bool) -> int:
    """Noisy coordinates of a part: d(d+1)/2 for a symmetric (d, d) matrix, else its size."""
    return value.shape[0] * (value.shape[0] + 1) // 2 if symmetric else int(np.size(value))


def release(parts: dict, spec: DPSpec, rng: np.random.Generator, clipped: int | None = None,
            n_rows: int | None = None) -> tuple[dict, dict]:
    """Gaussian release of named :class:`Part` s under one budget.

    Returns
    -------
    noisy : {name: array} (float64, same shapes; a symmetric part gets mirrored noise)
    record : :func:`describe` of the release (σ of every part, the clipped fraction
        ``clipped`` / ``n_rows``, see :data:`CLIPPED_NOTE`)
    """
    record = describe(spec, {k: (p.sensitivity, p.share, part_shape(np.asarray(p.value), p.symmetric),
                                 p.symmetric) for k, p in parts.items()}, clipped, n_rows)
    noisy = {}
    for name, p in parts.items():
        sigma = record["parts"][name]["sigma"]
        v = np.asarray(p.value, dtype=np.float64)
        noise = sym_noise(rng, v.shape[0], sigma) if p.symmetric else rng.normal(0.0, sigma, size=v.shape)
        noisy[name] = v + noise
    return noisy, record


def record_mu(record: dict | None) -> float:
    """μ of one release record, recomputed from its parts' sensitivities and σ (None, or a
    record without parts: not private, μ = inf)."""
    if not record or "parts" not in record:
        return math.inf
    return compose_mu(p["sensitivity"] / p["sigma"] for p in record["parts"].values())

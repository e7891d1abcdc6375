"""Calibrating and accounting Gaussian mechanisms: zCDP, the analytic Gaussian mechanism and
Gaussian differential privacy (GDP).

A Gaussian mechanism M(D) = f(D) + N(0, σ² I) whose query f has L2 sensitivity
Δ = sup ‖f(D) − f(D')‖₂ over neighbouring datasets D ≃ D' is, exactly,

- μ-GDP with μ = Δ/σ (Dong, Roth & Su 2022, Thm. 2.7): its privacy profile is that of
  N(0, 1) against N(μ, 1);
- ρ-zCDP with ρ = Δ²/(2σ²) = μ²/2 (Bun & Steinke 2016, Prop. 1.6);
- (ε, δ)-DP exactly when (Balle & Wang 2018, Thm. 8)

      δ ≥ δ_μ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ),   μ = Δ/σ.

Composition. k Gaussian releases on the same data (adaptively chosen, each with its own Δᵢ and
σᵢ) are together μ-GDP with μ = √(Σ (Δᵢ/σᵢ)²) (Dong, Roth & Su, Cor. 3.3) — exact for Gaussian
mechanisms, and the same as adding the ρᵢ of zCDP (ρ = μ²/2). A client's total (ε, δ) over
everything it sent is therefore computed from the recorded σᵢ and Δᵢ alone, by
:func:`gdp_epsilon` (the exact profile) or, more loosely, through ρ (:func:`zcdp_epsilon`).

Calibration of a budget (ε, δ) to a total μ (split afterwards over the released parts):

- ``"zcdp"``: ρ from (ε, δ) by the standard conversion of Bun & Steinke (2016, Prop. 1.3),
  ε = ρ + 2√(ρ log(1/δ)), inverted in closed form, ρ = (√(log(1/δ) + ε) − √(log(1/δ)))²; then
  μ = √(2ρ), i.e. σ = Δ/√(2ρ) for a part of sensitivity Δ that gets all of ρ. (This is the
  standard conversion, not the tighter one of Canonne, Kamath & Steinke 2020; the release is
  then (ε, δ)-DP with room to spare, which :func:`gdp_epsilon` shows.)
- ``"analytic"``: the largest μ with δ_μ(ε) ≤ δ, by root finding on the exact profile above
  (Balle & Wang's analytic Gaussian mechanism, applied to the composed release: the joint
  Gaussian release of several parts is itself one Gaussian mechanism with this μ).

References
----------
M. Bun and T. Steinke, "Concentrated differential privacy: simplifications, extensions, and
lower bounds", TCC 2016. B. Balle and Y.-X. Wang, "Improving the Gaussian mechanism for
differential privacy: analytical calibration and optimal denoising", ICML 2018. J. Dong,
A. Roth and W. J. Su, "Gaussian differential privacy", JRSS B 84 (2022).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr

from fedalign.errors import FedalignError

#: The calibration routes of :func:`mu_for_budget`.
MECHANISMS = ("analytic", "zcdp")


def zcdp_rho(epsilon: float, delta: float) -> float:
    """ρ with ρ + 2√(ρ log(1/δ)) = ε (Bun & Steinke 2016, Prop. 1.3, inverted)."""
    L = math.log(1.0 / delta)
    return (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2


def zcdp_epsilon(rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ log(1/δ)): the (ε, δ)-DP that ρ-zCDP implies (the standard conversion)."""
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def gdp_delta(epsilon: float, mu: float) -> float:
    """δ_μ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ): the exact privacy profile of a Gaussian
    mechanism with Δ/σ = μ (Balle & Wang 2018, Thm. 8). ``mu = 0``: 0; ``mu = inf``: 1."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a, b = mu / 2.0 - epsilon / mu, -mu / 2.0 - epsilon / mu
    return float(max(ndtr(a) - math.exp(epsilon + float(log_ndtr(b))), 0.0))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with δ_μ(ε) ≤ δ (0 when δ_μ(0) ≤ δ; inf for μ = inf)."""
    if math.isinf(mu):
        return math.inf
    if mu <= 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-300, rtol=1e-15,
                        maxiter=500))


@functools.lru_cache(maxsize=256)
def analytic_mu(epsilon: float, delta: float) -> float:
    """The largest μ = Δ/σ with δ_μ(ε) ≤ δ (the analytic Gaussian mechanism's calibration)."""
    lo, hi = 0.0, 1.0
    while gdp_delta(epsilon, hi) < delta:
        lo, hi = hi, 2.0 * hi
    return float(brentq(lambda m: gdp_delta(epsilon, m) - delta, lo, hi, xtol=1e-300, rtol=1e-15,
                        maxiter=500))


def analytic_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ of the analytic Gaussian mechanism for one release of L2 sensitivity Δ."""
    return sensitivity / analytic_mu(epsilon, delta)


def classical_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Δ √(2 log(1.25/δ)) / ε: the classical Gaussian mechanism (Dwork & Roth 2014, Thm. A.1,
    valid for ε < 1); for comparison only."""
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def zcdp_sigma(sensitivity: float, rho: float) -> float:
    """σ = Δ / √(2ρ): the Gaussian mechanism that is exactly ρ-zCDP."""
    return sensitivity / math.sqrt(2.0 * rho)


def mu_for_budget(epsilon: float, delta: float, mechanism: str) -> float:
    """The total GDP μ a release calibrated to (ε, δ) by ``mechanism`` may spend."""
    if math.isinf(epsilon):
        return math.inf
    if mechanism == "zcdp":
        return math.sqrt(2.0 * zcdp_rho(epsilon, delta))
    if mechanism == "analytic":
        return analytic_mu(epsilon, delta)
    raise FedalignError(f"DP mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")


def epsilon_for_mu(mu: float, delta: float, mechanism: str) -> float:
    """The ε whose calibration by ``mechanism`` at δ gives exactly μ (inverse of
    :func:`mu_for_budget`; used to hand a share of a budget to a second release)."""
    if mechanism == "zcdp":
        return zcdp_epsilon(mu * mu / 2.0, delta)
    return gdp_epsilon(mu, delta)


def compose_mu(mus) -> float:
    """μ = √(Σ μᵢ²): Gaussian releases composed (exact for Gaussian mechanisms)."""
    mus = [float(m) for m in mus]
    if any(math.isinf(m) for m in mus):
        return math.inf
    return float(np.sqrt(np.sum(np.square(mus)))) if mus else 0.0


def account(mu: float, delta: float) -> dict:
    """The guarantee of a μ-GDP release at δ: μ, ρ = μ²/2, ε (exact profile) and ε through
    zCDP (standard conversion)."""
    if math.isinf(mu):
        return dict(mu=None, rho=None, delta=delta, epsilon=None, epsilon_zcdp=None,
                    private=False)
    rho = mu * mu / 2.0
    return dict(mu=mu, rho=rho, delta=delta, epsilon=gdp_epsilon(mu, delta),
                epsilon_zcdp=zcdp_epsilon(rho, delta), private=True)

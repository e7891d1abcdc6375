"""Differentially private messages: SLOT-Align's statistics and the FedCGS / Fed3R sums.

A client clips its feature rows to ‖x‖₂ ≤ C, adds Gaussian noise to the sums it sends, and
records what it did; the server post-processes (which costs no privacy). Modules:

- :mod:`fedalign.dp.calibration` — Gaussian mechanisms: zCDP (standard conversion), the
  analytic Gaussian mechanism (Balle & Wang 2018), Gaussian-DP composition and accounting;
- :mod:`fedalign.dp.release` — the budget (:class:`DPSpec`, :func:`make_spec`), clipping,
  the sensitivities (with their proofs), the seeded Gaussian release of named parts and its
  JSON record; the neighbouring relation is **add/remove one row**;
- :mod:`fedalign.dp.moments` — a client's DP statistics (count, Σx, Σxxᵀ) and their
  post-processing: symmetrise, project to {0 ≼ Σ ≼ C² I}, shrink by a rule that needs only
  the released parts (the noise energy is known from σ; no fourth moment is released);
- :mod:`fedalign.dp.accounting` — carrying records forward (reference, map, aligned files)
  and a client's total privacy loss over everything it sent, and whether the head message is
  covered (it is not when the client mapped its rows with its exact statistics).

What is protected, and what is not: the released numbers (count, sums, second moments, head
sums) are (ε, δ)-DP for each client's rows under add/remove-one-row. Not protected: the
exact clipped fraction that each record carries (a diagnostic; :data:`CLIPPED_NOTE`), the
seed of a simulation (its noise is reproducible on purpose), and anything a client sends
without DP (an exact head message, exact statistics). The barycenter needs every client's
own statistics, so secure aggregation (which reveals only sums) could not hide them; the DP
noise does.
"""

from fedalign.dp.accounting import (client_privacy, compose, map_record, reference_inputs,
                                    summary)
from fedalign.dp.calibration import (MECHANISMS, account, analytic_mu, analytic_sigma,
                                     classical_sigma, compose_mu, gdp_delta, gdp_epsilon,
                                     mu_for_budget, zcdp_epsilon, zcdp_rho, zcdp_sigma)
from fedalign.dp.moments import (SHRINKAGE_RULE, check_shrinkage, pool_released, postprocess,
                                 release_stats, release_stats_of_file, stats_from_release)
from fedalign.dp.release import (CLIPPED_NOTE, NEIGHBOURING, DPSpec, Part, clip_rows,
                                 config_record, config_spec, describe, make_spec, noise_rng,
                                 record_mu, release, sensitivities, sym_noise)

__all__ = [
    "CLIPPED_NOTE", "DPSpec", "MECHANISMS", "NEIGHBOURING", "Part", "SHRINKAGE_RULE", "account",
    "analytic_mu", "analytic_sigma", "check_shrinkage", "classical_sigma", "client_privacy",
    "clip_rows", "compose", "compose_mu", "config_record", "config_spec", "describe", "gdp_delta",
    "gdp_epsilon", "make_spec", "map_record", "mu_for_budget", "noise_rng", "pool_released",
    "postprocess", "record_mu", "reference_inputs", "release", "release_stats",
    "release_stats_of_file", "sensitivities", "stats_from_release", "summary", "sym_noise",
    "zcdp_epsilon", "zcdp_rho", "zcdp_sigma",
]

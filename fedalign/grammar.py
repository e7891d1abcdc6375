"""The small option grammars both front ends read: seeds, head parameters, shrinkage, α, yes/no.

The command line (:mod:`fedalign.cli.options`) and the Flower run config
(:mod:`fedalign.flower.settings`) read ``0-4`` seeds and ``METHOD.KEY=VALUE`` parameters
through these functions, so the two cannot drift apart; ``flag`` names the option or config
key in the one-line error. Pure Python (no numpy): ``fedalign --help`` stays fast.
"""

from __future__ import annotations

import math
import re

from fedalign.defaults import check_seed
from fedalign.errors import FedalignError


#: Most seeds one range may give (each seed is a whole run of the methods).
MAX_SEEDS = 10_000

#: Largest and smallest nonzero magnitude of a number option: the magnitude files may hold
#: (:data:`fedalign.files.MAX_MAGNITUDE`), whose square is still a float64, and its inverse.
#: ``--clip 1e308`` (its square overflowed), ``--var-floor-rel 1e308`` (a floor of inf reached
#: scikit-learn), ``--dp-epsilon 1e308``, ``--clip 1e-300`` (σ = 0) and ``fedpft.lr=1e308`` (a
#: head of NaN weights, reported as a result) ended in tracebacks or nonsense.
OPTION_MAX_MAGNITUDE = 1e150
OPTION_MIN_MAGNITUDE = 1e-150


def check_number(value: float, flag: str) -> None:
    """A float option's value must be finite, and 0 or of a magnitude in
    [:data:`OPTION_MIN_MAGNITUDE`, :data:`OPTION_MAX_MAGNITUDE`]: no option of fedalign gives
    infinity, or a value beyond those, a meaning (the command line's options,
    ``fedalign.cli.runtime.check_finite``; the heads' ``METHOD.KEY=VALUE``)."""
    if not math.isfinite(value):
        raise FedalignError(f"{flag} must be a finite number, got {value}")
    if value != 0.0 and not OPTION_MIN_MAGNITUDE <= abs(value) <= OPTION_MAX_MAGNITUDE:
        raise FedalignError(f"{flag} must be 0 or of a magnitude in [{OPTION_MIN_MAGNITUDE:g}, "
                            f"{OPTION_MAX_MAGNITUDE:g}], got {value:g}")


def parse_seeds(values, flag: str = "--seeds") -> list:
    """``["0,1,2"]``, ``["0-4"]``, ``["0 3"]`` or ``["0", "1"]`` → sorted unique ints (commas or
    spaces separate, ``a-b`` is a range), each in [0, :data:`fedalign.defaults.MAX_SEED`]
    (:func:`fedalign.defaults.check_seed`)."""
    seeds = []
    for v in values or []:
        for tok in re.split(r"[,\s]+", str(v).strip()):
            if not tok:
                continue
            try:
                if "-" in tok[1:]:
                    lo, hi = tok.split("-", 1) if tok[0] != "-" else (tok, tok)
                    lo, hi = int(lo), int(hi)
                    if lo > hi:
                        raise FedalignError(f"{flag}: the range {tok!r} is empty (write it "
                                            f"low-high, e.g. {hi}-{lo})")
                    if hi - lo >= MAX_SEEDS:
                        raise FedalignError(f"{flag}: the range {tok!r} holds {hi - lo + 1:,} "
                                            f"seeds, more than {MAX_SEEDS:,}")
                    seeds.extend(range(lo, hi + 1))
                else:
                    seeds.append(int(tok))
            except ValueError:
                raise FedalignError(f"{flag}: expected integers like 0,1,2 or 0-4, got {tok!r}") from None
    if not seeds:
        raise FedalignError(f"{flag}: give at least one seed")
    for s in (min(seeds), max(seeds)):
        check_seed(s, f"{flag}: each seed")
    return sorted(set(seeds))


#: The words a yes/no option takes (any case), and their values.
BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True,
              "0": False, "false": False, "no": False, "off": False}


def parse_bool(value, flag: str = "option") -> bool:
    """``true``/``yes``/``on``/``1`` → True, ``false``/``no``/``off``/``0`` → False (any case);
    a bool stays itself; any other word is an error (never silently False)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in BOOL_WORDS:
        raise FedalignError(f"{flag}: expected true or false (or yes/no, on/off, 1/0), "
                            f"got {value!r}")
    return BOOL_WORDS[word]


def parse_params(values, flag: str = "--param") -> dict:
    """``METHOD.KEY=VALUE`` strings → {method: {key: value}} (values stay text)."""
    out: dict = {}
    for v in values or []:
        key, eq, value = str(v).partition("=")
        method, dot, opt = key.strip().partition(".")
        if not eq or not dot or not opt:
            raise FedalignError(f"{flag} must look like METHOD.KEY=VALUE, got {v!r}")
        out.setdefault(method, {})[opt] = value.strip()
    return out


def parse_shrinkage(text, flag: str = "--shrinkage"):
    """``auto`` | ``none`` | a number in [0, 1] (the Ledoit–Wolf intensity)."""
    t = str(text).strip().lower()
    if t in ("auto", "none"):
        return t
    try:
        v = float(t)
    except ValueError:
        raise FedalignError(f"{flag} must be auto, none or a number in [0, 1], got {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise FedalignError(f"{flag} must be in [0, 1], got {v}")
    return v


def parse_alpha(text, flag: str = "--alpha") -> float | None:
    """Dirichlet α of a partition: ``none`` (or ``inf``) → None (domain shift only), else a
    positive number of a magnitude in [:data:`OPTION_MIN_MAGNITUDE`,
    :data:`OPTION_MAX_MAGNITUDE`], as every number option (:func:`check_number`): numpy's
    Dirichlet sampler gives all-zero fractions for α = 1e308, which read as empty clients."""
    if text is None or str(text).strip().lower() in ("none", "inf"):
        return None
    try:
        a = float(text)
    except ValueError:
        raise FedalignError(f"{flag} must be a positive number or 'none', got {text!r}") from None
    if not a > 0 or not math.isfinite(a):
        raise FedalignError(f"{flag} must be a positive number or 'none', got {text!r}")
    if not OPTION_MIN_MAGNITUDE <= a <= OPTION_MAX_MAGNITUDE:
        raise FedalignError(f"{flag} must be in [{OPTION_MIN_MAGNITUDE:g}, "
                            f"{OPTION_MAX_MAGNITUDE:g}] (or 'none': domain shift only, the "
                            f"limit of a large α), got {text!r}")
    return a

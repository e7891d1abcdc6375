"""Options several commands share, declared once, and the parsers of option text.

The declarations return typer ``OptionInfo`` objects, their defaults taken from
:mod:`fedalign.defaults` (the library's constants), so ``--threads``, ``--seeds``, ``--json``,
``-o``, ``--chunk-rows`` and ``--tau`` read the same in every command. The parsers turn option
text into values (``0-4`` → seeds, ``METHOD.KEY=VALUE`` → parameters, ``auto|none|VALUE`` →
shrinkage, ``none|VALUE`` → Dirichlet α); their errors name the flag, the library's name its
parameters. Nothing here imports numpy: ``fedalign --help`` stays fast.
"""

from __future__ import annotations

import math

import typer

from fedalign import defaults
from fedalign.errors import FedalignError

# --------------------------------------------------------------------------------------------
# Shared declarations
# --------------------------------------------------------------------------------------------


def output_option(help: str, *, required: bool = True, default=None):
    """``-o/--output FILE``: required, or optional (``required=False``) with ``default``."""
    if required and default is None:
        return typer.Option(..., "-o", "--output", help=help)
    return typer.Option(default, "-o", "--output", help=help)


def json_option(help: str = "Write the report (JSON)."):
    """``--json FILE``: the command's report."""
    return typer.Option(None, "--json", help=help)


def seeds_option(help: str = "Seeds: 0,1,2 or 0-4."):
    """``--seeds`` (repeatable; parsed by :func:`parse_seeds`), default 0."""
    return typer.Option(["0"], "--seeds", help=help)


def threads_option(help: str = "Torch and BLAS threads (1 is fastest for these small matrices "
                               "on a busy machine)."):
    """``--threads N`` ≥ 1, default :data:`fedalign.defaults.THREADS`."""
    return typer.Option(defaults.THREADS, "--threads", min=1, help=help)


def chunk_rows_option(help: str = "Rows per streamed chunk (memory ∝ chunk_rows·d)."):
    """``--chunk-rows N`` ≥ 1, default :data:`fedalign.defaults.CHUNK_ROWS`."""
    return typer.Option(defaults.CHUNK_ROWS, "--chunk-rows", min=1, help=help)


def tau_option(help: str = "Geodesic time τ ∈ [0, 1]: 0 keeps features, 1 maps fully onto the "
                           "reference."):
    """``--tau T``, default :data:`fedalign.defaults.TAU`."""
    return typer.Option(defaults.TAU, "--tau", help=help)


# --------------------------------------------------------------------------------------------
# Parsers of option text
# --------------------------------------------------------------------------------------------


def parse_seeds(values, flag: str = "--seeds") -> list:
    """``["0,1,2"]``, ``["0-4"]`` or ``["0", "1"]`` → sorted unique ints."""
    seeds = []
    for v in values or []:
        for tok in filter(None, (t.strip() for t in str(v).split(","))):
            try:
                if "-" in tok[1:]:
                    lo, hi = tok.split("-", 1) if tok[0] != "-" else (tok, tok)
                    seeds.extend(range(int(lo), int(hi) + 1))
                else:
                    seeds.append(int(tok))
            except ValueError:
                raise FedalignError(f"{flag}: expected integers like 0,1,2 or 0-4, got {tok!r}") from None
    if not seeds:
        raise FedalignError(f"{flag}: give at least one seed")
    return sorted(set(seeds))


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
    positive number."""
    if text is None or str(text).strip().lower() in ("none", "inf"):
        return None
    try:
        a = float(text)
    except ValueError:
        raise FedalignError(f"{flag} must be a positive number or 'none', got {text!r}") from None
    if not a > 0 or not math.isfinite(a):
        raise FedalignError(f"{flag} must be a positive number or 'none', got {text!r}")
    return a

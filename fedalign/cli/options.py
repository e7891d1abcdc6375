"""Options several commands share, declared once, and the parsers of option text.

The declarations return typer ``OptionInfo`` objects, their defaults taken from
:mod:`fedalign.defaults` (the library's constants), so ``--threads``, ``--seeds``, ``--json``,
``-o``, ``--chunk-rows`` and ``--tau`` read the same in every command. The parsers turn option
text into values (``0-4`` → seeds, ``METHOD.KEY=VALUE`` → parameters, ``auto|none|VALUE`` →
shrinkage, ``none|VALUE`` → Dirichlet α); their errors name the flag, the library's name its
parameters. Nothing here imports numpy: ``fedalign --help`` stays fast.
"""

from __future__ import annotations


import typer

from fedalign import defaults
from fedalign.errors import FedalignError
from fedalign.grammar import parse_alpha, parse_params, parse_seeds, parse_shrinkage  # noqa: F401  (re-exported)

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


def _choices(choices) -> tuple:
    """The words of a choice option: a tuple (or dict: its keys), or ``"module:NAME"`` of the
    library's constant, imported only when a value other than the default is checked (so
    ``fedalign --help`` imports no numpy)."""
    if isinstance(choices, str):
        import importlib

        module, _, name = choices.partition(":")
        choices = getattr(importlib.import_module(module), name)
    return tuple(choices)


def check_choice(value, choices, flag: str) -> None:
    """``value`` must be one of ``choices`` (see :func:`_choices`); None (an optional option
    left out) passes. The one check of every choice option (:func:`choice_option`)."""
    words = _choices(choices)
    if value is not None and value not in words:
        raise FedalignError(f"{flag} must be one of {', '.join(words)}, got {value!r}")


def choice_option(default, flag: str, choices, help: str, *decls):
    """``--flag WORD``, one of ``choices`` (a tuple, or ``"module:NAME"`` of the library's
    constant: :func:`_choices`), checked by the parser before the command runs: a word that is
    not a choice (``--strategy banana``) is one ``error:`` line naming the flag and its choices,
    never silently accepted. The help text stays the command's own."""

    def check(ctx: typer.Context, value):
        if value is None or value == default or ctx.resilient_parsing:
            return value
        try:
            check_choice(value, choices, flag)
        except FedalignError as e:
            from fedalign.cli.app import _click_exc   # typer's click, or the real one

            raise _click_exc.UsageError(str(e), ctx=ctx) from None
        return value

    return typer.Option(default, flag, *decls, help=help, callback=check)


def tau_option(help: str = "Geodesic time τ ∈ [0, 1]: 0 keeps features, 1 maps fully onto the "
                           "reference."):
    """``--tau T`` ∈ [0, 1] (declared: the parser checks it), default
    :data:`fedalign.defaults.TAU`."""
    return typer.Option(defaults.TAU, "--tau", min=0, max=1, help=help)


# --------------------------------------------------------------------------------------------
# Parsers of option text
# --------------------------------------------------------------------------------------------



"""The typer application: the root group, the ``command`` decorator every subcommand is
registered with, ``--version`` and the process entry point.

The pieces live in their own modules: the plain-text help (:mod:`fedalign.cli.help`), how a
command runs (:mod:`fedalign.cli.runtime`: output checks, one transaction, one ``error:``
line, signals) and where it prints (:mod:`fedalign.cli.console`). Command modules import only
typer/rich at module level; library imports (and so torch) happen inside the command
functions, which keeps ``fedalign --help`` fast.
"""

from __future__ import annotations

import os
import sys

import typer
from typer.core import TyperCommand, TyperGroup

from fedalign.cli.console import _console, err, fold_notes, out, progress_bar  # noqa: F401
from fedalign.cli.help import HELP_WIDTH, HelpGroup, PlainHelp, help_meta, plain_help  # noqa: F401
from fedalign.cli.runtime import (check_finite, error_line, fail, guard_outputs,  # noqa: F401
                                  guarded, os_error_message)
from fedalign.errors import FedalignError

try:  # typer ≥ 0.2x carries its own copy of click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as _click_exc


class FedalignGroup(PlainHelp, TyperGroup):
    """The root command group: parser errors (``--tau abc``, a missing or unknown option) are
    one ``error:`` line and exit code 2, like every other bad input."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except _click_exc.NoArgsIsHelpError as e:
            e.show()
            code = e.exit_code
        except _click_exc.ClickException as e:
            hint = ""
            ctx = getattr(e, "ctx", None)
            if ctx is not None:
                hint = f" (see '{ctx.command_path} --help')"
            typer.echo(error_line(e.format_message() + hint), err=True)
            code = e.exit_code
        except typer.Abort:
            typer.echo(error_line("aborted"), err=True)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    cls=FedalignGroup,
    name="fedalign",
    help=(
        "Federated feature alignment with optimal transport.\n\n"
        "A federation is a pipeline of file transforms: extract → stats → barycenter → align → "
        "evaluate (SLOT-Align), and fit-gmm → dadil-round → dadil-evaluate (DeFed-GMM-DaDiL). "
        "Every command reads files and writes files; `fedalign COMMAND --help` shows its "
        "options and an example."
    ),
    epilog=(
        "Example: fedalign align --tau 0.5 client3.h5 ref.npz -o client3.aligned.h5\n"
        "Your own features in: fedalign import features.npz -o client3.h5"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help (see PlainHelp); nothing rewrites the help text
    context_settings=dict(max_content_width=HELP_WIDTH),
)


def command(*args, typer_app=None, outputs=(), folders=(), **kwargs):
    """Register a subcommand that fails cleanly and writes all its outputs or none
    (:func:`fedalign.cli.runtime.guarded`), with fedalign's plain help
    (:mod:`fedalign.cli.help`).

    ``outputs`` / ``folders``: names of the parameters that are output files / folders;
    every other path parameter is an input. ``typer_app`` registers on a command group
    (e.g. ``fedalign plot ...``) instead of the root.
    """

    def decorate(fn):
        wrapper = guarded(fn, outputs, folders)
        wrapper._fedalign_help = help_meta(fn)
        kwargs["cls"] = plain_help(kwargs.get("cls") or TyperCommand)
        return (typer_app or app).command(*args, **kwargs)(wrapper)

    return decorate


def version_callback(value: bool):
    if value:
        from fedalign.version import __version__

        typer.echo(f"fedalign {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=version_callback, is_eager=True, help="Show the version."
    ),
):
    """Federated feature alignment with optimal transport."""


def main():  # pragma: no cover - exercised through subprocess tests
    # POT loads every array backend it finds (torch alone costs ~1.5 s); the CLI hands it numpy
    # arrays only, so its processes skip them (set any of these to "" to re-enable)
    for key in ("PYTORCH", "JAX", "TENSORFLOW", "CUPY"):
        os.environ.setdefault(f"POT_BACKEND_DISABLE_{key}", "1")
    # numpy's BLAS on one thread unless OPENBLAS_NUM_THREADS says otherwise: the pipeline's
    # matrices (d ≈ 1000) are too small for its thread pool, which on 2 cores costs 2–3× the
    # CPU time for no shorter run (4× when another job shares the cores). numpy is not
    # imported yet, so the variable is read when it is. torch keeps its threads (extract,
    # --threads), but they sleep while they wait instead of spinning: with another job on the
    # cores a spinning pool costs extract 2–3× the CPU time of one thread, a sleeping one none.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # POT without its optional scikit-learn / networkx integrations (~0.5 s of every DaDiL
    # command): see fedalign.dadil.distances.emd_plan
    os.environ.setdefault("FEDALIGN_POT_LEAN", "1")
    try:
        app()
    except FedalignError as e:  # raised outside a command (should not happen)
        typer.echo(error_line(e), err=True)
        sys.exit(2)

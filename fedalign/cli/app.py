"""The typer application and the ``command`` decorator every subcommand uses.

Command modules import only typer/rich at module level; library imports (and so torch)
happen inside the command functions, which keeps ``fedalign --help`` fast.
"""

from __future__ import annotations

import functools
import os
import sys

import typer
from rich.console import Console

from fedalign.errors import FedalignError

app = typer.Typer(
    name="fedalign",
    help=(
        "Federated feature alignment with optimal transport.\n\n"
        "A federation is a pipeline of file transforms: extract → stats → barycenter → align → "
        "evaluate (SLOT-Align), and fit-gmm → dadil-round → evaluate (DeFed-GMM-DaDiL).\n\n"
        "Example: fedalign align --tau 0.5 client3.h5 ref.npz -o client3.aligned.h5"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

#: Logs, progress bars and convergence records go to stderr; tables go to stdout.
err = Console(stderr=True)
out = Console()


def fail(message: str, code: int = 2):
    """Print one readable error line on stderr and exit with ``code``."""
    line = " ".join(str(message).split())
    typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


def command(*args, typer_app=None, **kwargs):
    """Register a subcommand whose :class:`FedalignError` becomes one line + exit code 2.

    ``typer_app`` registers on a command group (e.g. ``fedalign plot ...``) instead of the root.
    """

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            try:
                return fn(*a, **kw)
            except FedalignError as e:
                fail(str(e))
            except KeyboardInterrupt:
                typer.echo("interrupted", err=True)
                raise typer.Exit(130)

        return (typer_app or app).command(*args, **kwargs)(wrapper)

    return decorate


def version_callback(value: bool):
    if value:
        from fedalign import __version__

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
    try:
        app()
    except FedalignError as e:  # raised outside a command (should not happen)
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)
        sys.exit(2)


class progress_bar:
    """Rich progress bar on stderr; call the returned object with the number of items done.

    Disabled automatically when stderr is not a terminal-like console (CI logs stay clean)
    unless ``force`` is set.
    """

    def __init__(self, total: int, description: str, unit: str = "rows"):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self._p = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn(f"{{task.speed:>8.0f}} {unit}/s" if False else "{task.fields[rate]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=False,
            disable=not err.is_terminal,
        )
        self._unit = unit
        self._task = self._p.add_task(description, total=total, rate="")

    def __enter__(self):
        self._p.__enter__()
        return self

    def __call__(self, k: int = 1):
        self._p.advance(self._task, k)
        t = self._p.tasks[0]
        if t.speed:
            self._p.update(self._task, rate=f"{t.speed:,.0f} {self._unit}/s")

    def __exit__(self, *exc):
        self._p.__exit__(*exc)

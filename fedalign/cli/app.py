"""The typer application and the ``command`` decorator every subcommand uses.

Command modules import only typer/rich at module level; library imports (and so torch)
happen inside the command functions, which keeps ``fedalign --help`` fast.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from typer.core import TyperGroup

from fedalign.errors import FedalignError

try:  # typer ≥ 0.2x carries its own copy of click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as _click_exc


def _one_line(message) -> str:
    return " ".join(str(message).split())


class FedalignGroup(TyperGroup):
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
            typer.echo(f"error: {_one_line(e.format_message())}{hint}", err=True)
            code = e.exit_code
        except typer.Abort:
            typer.echo("error: aborted", err=True)
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
    typer.echo(f"error: {_one_line(message)}", err=True)
    raise typer.Exit(code)


def os_error_message(e: OSError) -> str:
    """``<file>: <reason>`` of an OS error (permission denied, a folder where a file was
    expected, a full disk, an HDF5 library error, …)."""
    reason = e.strerror or (str(e).splitlines()[0] if str(e) else type(e).__name__)
    return f"{e.filename}: {reason}" if e.filename else reason


def _paths(value) -> list:
    if isinstance(value, Path):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, Path)]
    return []


def guard_outputs(inputs=(), files=(), folders=(), allow=()) -> None:
    """Check outputs before any work (see :mod:`fedalign.files`): every output file's folder
    exists and is writable and it is not a folder; every output folder is a folder or can be
    created; no output is one of the ``inputs`` (except the in-place ``allow`` ones). Also
    removes the temporaries killed runs left for these outputs."""
    from fedalign.files import check_output_file, check_output_folder, check_outputs

    files = [Path(p) for p in files if p is not None]
    for p in files:
        check_output_file(p)
    for p in folders:
        if p is not None:
            check_output_folder(p)
    check_outputs(inputs, files, allow)


def require(flag: str, value, minimum=None, *, above=None):
    """Option check in the CLI's words: ``flag`` must be ≥ ``minimum`` (or > ``above``).

    (Options declared with typer's ``min=`` are checked by the parser already.)
    """
    if value is None:
        return value
    if minimum is not None and not value >= minimum:
        raise FedalignError(f"{flag} must be ≥ {minimum}, got {value}")
    if above is not None and not value > above:
        raise FedalignError(f"{flag} must be > {above}, got {value}")
    return value


def _flags(fn) -> dict:
    """{parameter name: long flag} of a command's options whose names hold an underscore."""
    import inspect

    flags = {}
    for name, p in inspect.signature(fn).parameters.items():
        decls = getattr(p.default, "param_decls", None)
        if "_" not in name or decls is None or type(p.default).__name__ != "OptionInfo":
            continue
        long = [d for d in decls if d.startswith("--")]
        flags[name] = long[0] if long else "--" + name.replace("_", "-")
    return flags


def cli_words(message: str, flags: dict) -> str:
    """Library messages name parameters (``chunk_rows must be ≥ 1``); the CLI names its flags
    (``--chunk-rows must be ≥ 1``). Only whole words outside paths are replaced."""
    import re

    for name, flag in flags.items():
        message = re.sub(rf"(?<![\w/.\-]){re.escape(name)}(?![\w/.\-])", flag, message)
    return message


def command(*args, typer_app=None, outputs=(), folders=(), **kwargs):
    """Register a subcommand that fails cleanly and writes all its outputs or none.

    - ``outputs`` / ``folders``: names of the parameters that are output files / folders;
      every other path parameter is an input. Before the command runs, the outputs are
      checked (:func:`guard_outputs`): writable folder, not a folder (not a file), not an
      input (also through symlinks, ``./`` spellings and hard links).
    - Everything the command writes through :func:`fedalign.files.atomic_output` is one
      transaction: renamed into place together when the command returns, removed on failure.
    - :class:`FedalignError` and OS errors (permissions, full disk, HDF5) → one ``error:``
      line and exit code 2; SIGINT → 130, SIGTERM → 143 (:mod:`fedalign.interrupt`), with
      no output and no temporary file left. Other exceptions are bugs and keep their
      traceback.

    ``typer_app`` registers on a command group (e.g. ``fedalign plot ...``) instead of the root.
    """

    def decorate(fn):
        flags = _flags(fn)

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            from fedalign import interrupt
            from fedalign.files import atomic_outputs

            with interrupt.handlers():
                try:
                    with atomic_outputs():
                        skip = set(outputs) | set(folders)
                        guard_outputs([p for k, v in kw.items() if k not in skip for p in _paths(v)],
                                      [kw.get(k) for k in outputs], [kw.get(k) for k in folders])
                        rv = fn(*a, **kw)
                    interrupt.check()
                    return rv
                except FedalignError as e:
                    fail(cli_words(str(e), flags))
                except KeyboardInterrupt as e:
                    fail(f"interrupted ({interrupt.signal_name(e)})",
                         interrupt.exit_code(e))
                except OSError as e:
                    fail(os_error_message(e))

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

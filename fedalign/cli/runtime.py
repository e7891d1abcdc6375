"""How a command runs: its outputs checked first, written as one transaction, any bad input
one ``error:`` line, signals honoured.

:func:`guarded` wraps a command function (the ``command`` decorator of :mod:`fedalign.cli.app`
applies it to every subcommand):

- the outputs are checked before any work (:func:`guard_outputs`), and every number option
  must be finite and of a sane magnitude (:func:`check_finite`);
- everything the command writes through :func:`fedalign.files.atomic_output` is one
  transaction: renamed into place together when the command returns, removed on failure;
- :class:`~fedalign.errors.FedalignError`, OS errors (permissions, full disk, HDF5) and
  running out of memory (an option that asks for billions of atoms) → one ``error:`` line
  and exit code 2; SIGINT → 130, SIGTERM → 143 (:mod:`fedalign.interrupt`),
  with no output and no temporary file left. Other exceptions are bugs and keep their
  traceback.

The library names parameters, the command line its flags: an error's ``param`` is shown as
the command's flag for it (:func:`error_message`), and while the command runs the library's
:func:`fedalign.errors.spell` spells its parameters as the command's flags (``--skip-bad``,
``--label-base 1``). Nothing rewrites a message's text.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from pathlib import Path

import typer

from fedalign.errors import FedalignError, spelling


def error_line(message) -> str:
    """``error: <message>`` on one line."""
    return "error: " + " ".join(str(message).split())


def fail(message: str, code: int = 2):
    """Print one readable error line on stderr and exit with ``code``."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)


def os_error_message(e: OSError) -> str:
    """``<file>: <reason>`` of an OS error (permission denied, a folder where a file was
    expected, a full disk, an HDF5 library error, …)."""
    reason = e.strerror or (str(e).splitlines()[0] if str(e) else type(e).__name__)
    return f"{e.filename}: {reason}" if e.filename else reason


# --------------------------------------------------------------------------------------------
# A command's parameters: the library's names, the command's flags
# --------------------------------------------------------------------------------------------


def option_flags(fn) -> dict:
    """{parameter name: long flag} of a command function's options (``chunk_rows`` →
    ``--chunk-rows``; ``labels_file`` declared ``--labels`` → ``--labels``)."""
    flags = {}
    for name, p in inspect.signature(fn).parameters.items():
        decls = getattr(p.default, "param_decls", None)
        if decls is None or type(p.default).__name__ != "OptionInfo":
            continue
        long = [d for d in decls if d.startswith("--")]
        flags[name] = long[0] if long else "--" + name.replace("_", "-")
    return flags


def _switches(fn) -> set:
    """Names of the options that are switches (their default is True or False)."""
    return {name for name, p in inspect.signature(fn).parameters.items()
            if isinstance(getattr(p.default, "default", None), bool)}


def flag_speller(flags: dict, switches=()):
    """The command line's :func:`fedalign.errors.spell`: ``--flag`` (a switch given True, or
    no value), ``--flag VALUE``; None for a parameter the command does not have."""

    def speller(param, value):
        flag = flags.get(param)
        if flag is None:
            return None
        if value is None or (value is True and param in switches):
            return flag
        return f"{flag} {value}"

    return speller


def error_message(e: FedalignError, flags: dict) -> str:
    """The message of ``e`` in the command's words: its ``param`` shown as the flag
    (``tau must be in [0, 1]`` → ``--tau must be in [0, 1]``; a message that does not start
    with the parameter's name gets ``--tau:`` before it). Without a ``param`` of the command,
    the message as it is."""
    message = str(e)
    flag = flags.get(e.param) if e.param else None
    if flag is None:
        return message
    rest = message[len(e.param):]
    if message.startswith(e.param) and rest[:1] in (" ", ":"):
        return flag + rest
    return f"{flag}: {message}"


# --------------------------------------------------------------------------------------------
# Checks before any work
# --------------------------------------------------------------------------------------------


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


def check_finite(kwargs: dict, flags: dict) -> None:
    """No number option may be infinite or NaN (``--tol inf`` reached scikit-learn, ``--lr
    inf`` wrote a state whose next round was refused), nor so large or so small that its
    square leaves float64 (``--clip 1e308``, ``--dp-epsilon 1e-300``): a float option's value,
    or any of a list option's, must be 0 or of a magnitude in [1e-150, 1e150]. No option of
    fedalign gives infinity, or a value beyond those, a meaning. (Ranges, such as ``--seed``
    ≥ 0, are declared with the options and checked by the parser.)"""
    from fedalign.grammar import check_number

    for name, value in kwargs.items():
        flag = flags.get(name, "--" + name.replace("_", "-"))
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, float):
                check_number(v, flag)


# --------------------------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def held_warnings():
    """Hold the warnings a command's libraries emit (numpy's ``RuntimeWarning: overflow``,
    scikit-learn's) until it ends: shown as before when it succeeds (or fails with a bug's
    traceback), dropped when the caller clears the list because the command failed on bad
    input — whose report is one ``error:`` line, not the warnings on the way to it."""
    import warnings

    held: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            held = caught
            yield held
    finally:
        for w in held:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


def guarded(fn, outputs=(), folders=()):
    """``fn`` run as a command that fails cleanly and writes all its outputs or none.

    ``outputs`` / ``folders``: names of the parameters that are output files / folders;
    every other path parameter is an input (also through symlinks, ``./`` spellings and hard
    links: an output may be none of them).
    """
    flags = option_flags(fn)
    speller = flag_speller(flags, _switches(fn))
    skip = set(outputs) | set(folders)

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        from fedalign import interrupt
        from fedalign.files import atomic_outputs

        with interrupt.handlers(), spelling(speller), held_warnings() as held:
            try:
                check_finite(kw, flags)
                with atomic_outputs():
                    guard_outputs([p for k, v in kw.items() if k not in skip for p in _paths(v)],
                                  [kw.get(k) for k in outputs], [kw.get(k) for k in folders])
                    rv = fn(*a, **kw)
                interrupt.check()
                return rv
            except (FedalignError, KeyboardInterrupt, OSError, MemoryError) as e:
                held.clear()   # the one error line, not the warnings on the way to it
                fail(*_failure(e, flags))

    return wrapper


def _failure(e: BaseException, flags: dict) -> tuple:
    """(error line, exit code) of a command that failed cleanly (:func:`guarded`): bad input
    (:class:`~fedalign.errors.FedalignError`), a signal, an OS error, or out of memory."""
    from fedalign import interrupt

    if isinstance(e, FedalignError):
        return error_message(e, flags), 2
    if isinstance(e, KeyboardInterrupt):
        return f"interrupted ({interrupt.signal_name(e)})", interrupt.exit_code(e)
    if isinstance(e, OSError):
        return os_error_message(e), 2
    return ("out of memory: the inputs or an option (a count, a size) ask for more memory "
            "than this machine has; give smaller values", 2)

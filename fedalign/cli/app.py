"""The typer application and the ``command`` decorator every subcommand uses.

Command modules import only typer/rich at module level; library imports (and so torch)
happen inside the command functions, which keeps ``fedalign --help`` fast.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from fedalign.errors import FedalignError

try:  # typer ≥ 0.2x carries its own copy of click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as _click_exc


def _one_line(message) -> str:
    return " ".join(str(message).split())


# --------------------------------------------------------------------------------------------
# Help: rendered from the declarations as written
# --------------------------------------------------------------------------------------------
#
# typer's rich/markdown help formatters rewrite help text (markdown drops ``<domain>`` as an
# HTML tag and ``*`` as emphasis; rich markup eats ``[tag]``s) and print a type label for
# every parameter (``<bool>``, ``<list[Path]>``). fedalign's help is plain text: paragraphs of
# the docstring are re-wrapped (click's ``\b`` keeps one verbatim), every help string is
# printed as written, options show a click-style metavar (PATH, INT, FLOAT, TEXT; none for
# flags; ``...`` for options that take several values), and the epilog (the examples) is
# printed verbatim, one command per line, so it can be pasted.

#: Help width: the terminal's, at most this many columns.
HELP_WIDTH = 100

_METAVARS = {"Path": "PATH", "int": "INT", "float": "FLOAT", "str": "TEXT"}


def _annotation_metavar(annotation) -> tuple:
    """(metavar, is_list) of a parameter annotation: ``Optional[List[Path]]`` → ("PATH", True)."""
    import typing

    is_list = False
    for _ in range(3):  # unwrap Optional[...] and List[...]
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        origin = typing.get_origin(annotation)
        if origin in (list, tuple) or origin is typing.Union and len(args) == 1:
            is_list = is_list or origin in (list, tuple)
            annotation = args[0] if args else str
        else:
            break
    name = getattr(annotation, "__name__", str(annotation))
    return _METAVARS.get(name, name.upper()), is_list


def _help_meta(fn) -> dict:
    """{parameter name: dict(metavar, is_list, min, max)} from a command function's signature
    (the metavar the author gave wins)."""
    import typing

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # pragma: no cover - an annotation typing cannot resolve
        hints = {}
    meta = {}
    for name, p in inspect.signature(fn).parameters.items():
        info = p.default
        metavar, is_list = _annotation_metavar(hints.get(name, str))
        meta[name] = dict(metavar=getattr(info, "metavar", None) or metavar, is_list=is_list,
                          min=getattr(info, "min", None), max=getattr(info, "max", None),
                          help=getattr(info, "help", None))
    return meta


def _greedy_options(cmd) -> set:
    """Options that take every value up to the next option (``evaluate --train a b c``): the
    ``GREEDY_OPTIONS`` of the module whose command class rewrites the arguments."""
    for klass in type(cmd).__mro__:
        if "parse_args" in vars(klass):
            names = getattr(sys.modules.get(klass.__module__), "GREEDY_OPTIONS", None)
            if names:
                return set(names)
    return set()


def _range_text(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"{lo} ≤ x ≤ {hi}"
    if lo is not None:
        return f"≥ {lo}"
    return f"≤ {hi}" if hi is not None else ""


def _default_text(p) -> str:
    if p.required or getattr(p, "show_default", True) is False:
        return ""
    if isinstance(getattr(p, "show_default", None), str):
        return p.show_default
    d = p.default
    # (click ≥ 8.3 marks "no default" with its UNSET sentinel)
    if d is None or callable(d) or type(d).__name__ == "Sentinel" or (
            getattr(p, "is_flag", False) and d is False):
        return ""
    if isinstance(d, (list, tuple)):
        return " ".join(map(str, d)) if d else ""
    return "" if getattr(p, "is_flag", False) and d is True and not p.secondary_opts else str(d)


def _wrap(text: str, width: int) -> list:
    """Lines of ``text`` wrapped to ``width``: paragraphs (blank-line separated) re-flowed
    without breaking words or hyphenated names (``--var-floor-rel``, ``SLOT-Align``); a
    paragraph that starts with click's ``\\b`` line is kept verbatim."""
    import re
    import textwrap

    wrapper = textwrap.TextWrapper(max(width, 20), break_on_hyphens=False, break_long_words=False)
    lines = []
    for i, para in enumerate(text.split("\n\n")):
        if i:
            lines.append("")
        if para.startswith("\b"):
            lines.extend(para.split("\n")[1:])
        else:
            lines.extend(wrapper.wrap(re.sub(r"[ \t\n\r\f\v]+", " ", para).strip()) or [""])
    return [line.replace("\u00a0", " ") for line in lines]  # no-break spaces: see _records


def _write_dl(formatter, rows, col_max: int = 30, spacing: int = 2) -> None:
    indent = formatter.current_indent
    first = min(max(len(a) for a, _ in rows), col_max) + spacing
    for name, text in rows:
        lines = _wrap(text, formatter.width - indent - first) if text else []
        if len(name) > first - spacing:  # too long: the help starts on the next line
            formatter.write(" " * indent + name + "\n")
            pad = " " * (indent + first)
            for line in lines:
                formatter.write((pad + line).rstrip() + "\n")
            continue
        head = " " * indent + name.ljust(first)
        formatter.write((head + (lines[0] if lines else "")).rstrip() + "\n")
        for line in lines[1:]:
            formatter.write((" " * (indent + first) + line).rstrip() + "\n")


class PlainHelp:
    """Mixin for typer commands and groups: the plain-text help described above."""

    def format_help_text(self, ctx, formatter) -> None:
        text = inspect.cleandoc(self.help or "").partition("\f")[0]
        if text:
            formatter.write_paragraph()
            indent = formatter.current_indent + 2
            for line in _wrap(text, formatter.width - indent):
                formatter.write((" " * indent + line).rstrip() + "\n")

    def _param_meta(self) -> dict:
        return getattr(self.callback, "_fedalign_help", None) or {}

    def _argument_name(self, p) -> str:
        name = p.metavar or p.name.upper()
        return name + ("..." if p.nargs == -1 and not name.endswith("...") else "")

    def _is_group(self) -> bool:
        return hasattr(self, "list_commands")

    def format_usage(self, ctx, formatter) -> None:
        params = self.get_params(ctx)
        pieces = ["[OPTIONS]"] if any(p.param_type_name == "option" for p in params) else []
        for p in params:
            if p.param_type_name == "argument":
                name = self._argument_name(p)
                pieces.append(name if p.required else f"[{name}]")
        if self._is_group():
            pieces.append("COMMAND [ARGS]...")
        formatter.write_usage(ctx.command_path, " ".join(pieces))

    def _records(self, ctx) -> tuple:
        meta, greedy = self._param_meta(), _greedy_options(self)
        arguments, options = [], []
        for p in self.get_params(ctx):
            if getattr(p, "hidden", False):
                continue
            m = meta.get(p.name, {})
            default = _default_text(p)
            extra = [f"default: {default}" if default else ""]
            extra.append(_range_text(m.get("min"), m.get("max")))
            if p.required and p.param_type_name == "option":
                extra.append("required")
            extra = "; ".join(e for e in extra if e)
            # (no-break spaces keep "[default: 5; ≥ 1]" on one line)
            # (an argument's help from its declaration: typer < 0.21 on click ≥ 8.3 drops it)
            text = (p.help or m.get("help") or "") + \
                (" [" + extra.replace(" ", "\u00a0") + "]" if extra else "")
            if p.param_type_name == "argument":
                arguments.append((self._argument_name(p), text))
                continue
            flag = getattr(p, "is_flag", False) or getattr(p, "count", False)
            metavar = "" if flag else " " + (p.metavar or m.get("metavar") or "TEXT")
            if not flag and set(p.opts) & greedy:
                metavar += "..."
            names = ", ".join(p.opts) + metavar
            if p.secondary_opts:
                names += " / " + ", ".join(p.secondary_opts)
            options.append((names, text))
        return arguments, options

    def format_help(self, ctx, formatter) -> None:
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        arguments, options = self._records(ctx)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    _write_dl(formatter, rows)
        if self._is_group():
            self.format_commands(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_commands(self, ctx, formatter) -> None:
        """Subcommands with the first sentence of their help, wrapped (never cut)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or getattr(cmd, "hidden", False):
                continue
            text = " ".join((cmd.short_help or cmd.help or "").split("\n\n")[0].split())
            head, dot, _ = text.partition(". ")
            rows.append((name, head + "." if dot else text))
        if rows:
            with formatter.section("Commands"):
                _write_dl(formatter, rows)

    def format_epilog(self, ctx, formatter) -> None:
        """The epilog verbatim (examples stay one command per line)."""
        if not self.epilog:
            return
        formatter.write_paragraph()
        for line in self.epilog.strip("\n").splitlines():
            formatter.write(" " * (formatter.current_indent + 2) + line + "\n" if line.strip() else "\n")


_HELP_CLASSES: dict = {}


def plain_help(cls):
    """``cls`` (a typer command or group class) with :class:`PlainHelp` mixed in."""
    if issubclass(cls, PlainHelp):
        return cls
    if cls not in _HELP_CLASSES:
        _HELP_CLASSES[cls] = type(cls.__name__, (PlainHelp, cls), {"__module__": cls.__module__})
    return _HELP_CLASSES[cls]


class HelpGroup(PlainHelp, TyperGroup):
    """A command group (``fedalign plot``) with fedalign's plain help."""


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


def _console(stderr: bool = False, soft_wrap: bool = False) -> Console:
    """A console whose tables fit the terminal, or 200 columns when the output is not a
    terminal (a file, a pipe, CI logs) and COLUMNS does not say otherwise; with ``soft_wrap``
    it never folds a line it prints (a terminal wraps long lines itself, and a log file keeps
    paths whole)."""
    c = Console(stderr=stderr, soft_wrap=soft_wrap)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c.width = 200
    return c


#: Logs, progress and convergence records go to stderr (one line each, never folded);
#: tables go to stdout.
err = _console(stderr=True, soft_wrap=True)
out = _console()


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


def check_finite(kwargs: dict, flags: dict) -> None:
    """No number option may be infinite or NaN (``--tol inf`` reached scikit-learn, ``--lr
    inf`` wrote a state whose next round was refused): a float option's value, or any of a
    list option's, must be finite. No option of fedalign gives infinity a meaning. A
    ``--seed`` must be ≥ 0 (numpy's generators raise on a negative one)."""
    import math

    for name, value in kwargs.items():
        flag = flags.get(name, "--" + name.replace("_", "-"))
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, float) and not math.isfinite(v):
                raise FedalignError(f"{flag} must be a finite number, got {v}")
        if name == "seed" and isinstance(value, int) and value < 0:  # numpy takes no negative seed
            raise FedalignError(f"{flag} must be ≥ 0, got {value}")


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
    """{parameter name: long flag} of a command's options."""
    import inspect

    flags = {}
    for name, p in inspect.signature(fn).parameters.items():
        decls = getattr(p.default, "param_decls", None)
        if decls is None or type(p.default).__name__ != "OptionInfo":
            continue
        long = [d for d in decls if d.startswith("--")]
        flags[name] = long[0] if long else "--" + name.replace("_", "-")
    return flags


def cli_words(message: str, flags: dict, words: dict | None = None) -> str:
    """Library messages name parameters (``chunk_rows must be ≥ 1``, ``use unlabeled=True``);
    the CLI names its flags (``--chunk-rows must be ≥ 1``, ``use --unlabeled``). Replaced:
    whole words outside paths of parameter names that hold an underscore, and ``name=True``
    of any parameter (a flag); ``words`` ({library name: flag}, a command's ``words=``) adds
    library parameter names that are plain words (``alpha``) or that the command spells
    otherwise (``labels_file`` → ``--labels``), replaced as whole words too."""
    import re

    for name, flag in flags.items():
        message = re.sub(rf"(?<![\w/.\-]){re.escape(name)}=True\b", flag, message)
        if "_" in name:
            message = re.sub(rf"(?<![\w/.\-]){re.escape(name)}(?![\w/.\-=])", flag, message)
    for name, flag in (words or {}).items():
        message = re.sub(rf"(?<![\w/.\-]){re.escape(name)}(?![\w/.\-=])", flag, message)
    return message


def command(*args, typer_app=None, outputs=(), folders=(), words=None, **kwargs):
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
    ``words``: {library parameter name: flag} for :func:`cli_words` beyond the command's own
    parameter names.
    """

    def decorate(fn):
        flags = _flags(fn)

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            from fedalign import interrupt
            from fedalign.files import atomic_outputs

            with interrupt.handlers():
                try:
                    check_finite(kw, flags)
                    with atomic_outputs():
                        skip = set(outputs) | set(folders)
                        guard_outputs([p for k, v in kw.items() if k not in skip for p in _paths(v)],
                                      [kw.get(k) for k in outputs], [kw.get(k) for k in folders])
                        rv = fn(*a, **kw)
                    interrupt.check()
                    return rv
                except FedalignError as e:
                    fail(cli_words(str(e), flags, words))
                except KeyboardInterrupt as e:
                    fail(f"interrupted ({interrupt.signal_name(e)})",
                         interrupt.exit_code(e))
                except OSError as e:
                    fail(os_error_message(e))

        wrapper._fedalign_help = _help_meta(fn)
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
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)
        sys.exit(2)


def progress_bar(total, description: str, unit: str = "rows"):
    """Progress of a long step on stderr (:class:`fedalign.progress.Progress`): a rich bar on
    a terminal, a plain line every few seconds otherwise; call it with the items done."""
    from fedalign.progress import Progress

    return Progress(total, description, unit, console=err)


def fold_notes(method: str, notes) -> list:
    """Notes that differ only in their subject, folded into one line each.

    ``["client 0 class 3: a single sample, no GMM fitted", "client 1 class 5: a single
    sample, no GMM fitted"]`` → ``["fedpft: a single sample, no GMM fitted (2): client 0
    class 3, client 1 class 5"]``; other notes stay one line each, prefixed by the method.
    """
    groups: dict = {}
    for note in notes:
        subject, sep, message = str(note).rpartition(": ")
        key = message if sep else note
        groups.setdefault(key, []).append(subject if sep else None)
    lines = []
    for message, subjects in groups.items():
        subjects = [s for s in subjects if s]
        if len(subjects) > 1:
            lines.append(f"{method}: {message} ({len(subjects)}): {', '.join(subjects)}")
        elif subjects:
            lines.append(f"{method}: {subjects[0]}: {message}")
        else:
            lines.append(f"{method}: {message}")
    return lines

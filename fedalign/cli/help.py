"""Help: every command's ``--help`` rendered from its declarations as written.

typer's rich/markdown help formatters rewrite help text (markdown drops ``<domain>`` as an
HTML tag and ``*`` as emphasis; rich markup eats ``[tag]``s) and print a type label for
every parameter (``<bool>``, ``<list[Path]>``). fedalign's help is plain text: paragraphs of
the docstring are re-wrapped (click's ``\\b`` keeps one verbatim), every help string is
printed as written, options show a click-style metavar (PATH, INT, FLOAT, TEXT; none for
flags; ``...`` for options that take several values) and their default and range
(``[default: 5; ≥ 1]``), and the epilog (the examples) is printed verbatim, one command per
line, so it can be pasted.

:func:`plain_help` mixes :class:`PlainHelp` into a typer command class (the ``command``
decorator of :mod:`fedalign.cli.app` does it for every subcommand); :func:`help_meta` is what
it reads from a command function's signature. Imports only typer: ``fedalign --help`` stays
fast.
"""

from __future__ import annotations

import inspect
import sys

from typer.core import TyperGroup

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


def help_meta(fn) -> dict:
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
        return getattr(self.callback, "_fedalign_help", None) or {}  # (see help_meta)

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

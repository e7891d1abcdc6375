"""Where commands print: logs, progress and convergence records on stderr (:data:`err`, one
line each, never folded), tables on stdout (:data:`out`), progress bars, and notes folded
into one line per message. Imports only rich: ``fedalign --help`` stays fast."""

from __future__ import annotations

import os

from rich.console import Console


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

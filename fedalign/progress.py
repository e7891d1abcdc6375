"""Progress of long work, on stderr: a live bar on a terminal, plain lines otherwise.

Every long step of the CLI (extract, stats, align, barycenter, evaluate, import) reports
through :class:`Progress`:

- on a terminal, a rich progress bar (description, bar, done/total, rate, elapsed, time left,
  and a note such as the barycenter's current residual);
- when stderr is not a terminal (a Makefile, ``nohup``, CI logs, ``2> log``), one plain line
  every ``every`` seconds (default 5, or ``FEDALIGN_PROGRESS_EVERY``) while the work runs —
  also while nothing advances (a model loading, a first slow batch) — and a closing line if
  any was printed. Short steps print nothing.

Only rich (already a dependency of the CLI) is imported, and only when a bar is shown.
"""

from __future__ import annotations

import os
import threading
import time

#: Seconds between two plain progress lines (overridden by ``FEDALIGN_PROGRESS_EVERY``).
DEFAULT_EVERY = 5.0


def _every() -> float:
    try:
        return max(0.05, float(os.environ.get("FEDALIGN_PROGRESS_EVERY", DEFAULT_EVERY)))
    except ValueError:
        return DEFAULT_EVERY


def format_seconds(s: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``1 h 02 min``."""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


class Progress:
    """Progress of one long step.

    Use as a context manager; call the object with the number of items just finished, or
    :meth:`update` with an absolute count and/or a note::

        with Progress(n, "align client3.h5", unit="rows") as bar:
            for block in blocks:
                ...
                bar(len(block))

    Parameters
    ----------
    total : int or None
        Items in all; None when unknown (e.g. fixed-point iterations until convergence).
    description : str
        What runs (first words of every line).
    unit : str
        Name of the items (``rows``, ``img``, ``runs``, ``it``).
    console : rich Console, optional
        Where to print (default: a console on stderr).
    plain : bool, optional
        Force plain lines (True) or a bar (False); default: a bar exactly when the console is a
        terminal.
    every : float, optional
        Seconds between plain lines (default: ``FEDALIGN_PROGRESS_EVERY`` or 5).
    """

    def __init__(self, total, description: str, unit: str = "rows", console=None,
                 plain: bool | None = None, every: float | None = None):
        self.total = None if total is None else int(total)
        self.description = description
        self.unit = unit
        self.console = console if console is not None else _stderr_console()
        self.plain = (not self.console.is_terminal) if plain is None else bool(plain)
        self.every = _every() if every is None else float(every)
        self.done = 0
        self.note = ""
        self.lines = 0  # plain lines printed
        self._t0 = None
        self._bar = self._task = None
        self._stop = threading.Event()
        self._thread = None

    # -- the three ways to report --------------------------------------------------------------

    def __call__(self, k: int = 1) -> None:
        """``k`` more items are finished."""
        self.update(completed=self.done + int(k))

    def update(self, completed: int | None = None, total: int | None = None,
               note: str | None = None) -> None:
        """Set the absolute count, the total or the note shown after the counts."""
        if completed is not None:
            self.done = int(completed)
        if total is not None:
            self.total = int(total)
        if note is not None:
            self.note = note
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, total=self.total,
                             note=self.note, rate=self._rate_text())

    def log(self, message: str) -> None:
        """Print a message line (above the bar on a terminal)."""
        self.console.print(message, markup=False, highlight=False)

    # -- what is shown ------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return 0.0 if self._t0 is None else time.perf_counter() - self._t0

    def _rate(self) -> float:
        e = self.elapsed
        return self.done / e if e > 0 else 0.0

    def _rate_text(self) -> str:
        r = self._rate()
        if not r:
            return ""
        return f"{r:,.0f} {self.unit}/s" if r >= 10 else f"{r:.2f} {self.unit}/s"

    def line(self) -> str:
        """The plain progress line: ``align c3.h5: 40,960/100,000 rows (41 %), 8,100 rows/s,
        5.1 s elapsed, ~7.3 s left``."""
        parts = []
        if self.total:
            pct = 100 * self.done / self.total
            parts.append(f"{self.done:,}/{self.total:,} {self.unit} ({pct:.0f} %)")
        else:
            parts.append(f"{self.done:,} {self.unit}")
        if self.note:
            parts.append(self.note)
        rate = self._rate_text()
        if rate:
            parts.append(rate)
        parts.append(f"{format_seconds(self.elapsed)} elapsed")
        r = self._rate()
        if self.total and r and self.done < self.total:
            parts.append(f"~{format_seconds((self.total - self.done) / r)} left")
        return f"{self.description}: " + ", ".join(parts)

    def _print_line(self) -> None:
        self.lines += 1
        self.console.print(self.line(), markup=False, highlight=False)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.every):
            self._print_line()

    # -- context manager ----------------------------------------------------------------------

    def __enter__(self):
        self._t0 = time.perf_counter()
        if self.plain:
            self._thread = threading.Thread(target=self._heartbeat, name="fedalign-progress",
                                            daemon=True)
            self._thread.start()
        else:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"), console=self.console, transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total, rate="",
                                            note=self.note)
            if self.done:
                self.update()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self.lines and exc[0] is None:
                self._print_line()  # the closing line, when the step was long enough for any
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None
        return False

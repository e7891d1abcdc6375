"""SIGINT and SIGTERM as exceptions that cannot be lost.

The CLI installs :func:`handlers` around every command. A signal then

1. is recorded (:func:`pending`), and
2. raises :class:`KeyboardInterrupt` (SIGINT) or :class:`Terminated` (SIGTERM) in the main
   thread, so ``with``/``finally`` blocks remove temporary files on the way out.

An exception raised inside a callback that swallows exceptions (HDF5 and h5py run some Python
code in such places) would be lost; the record is not: :func:`check` raises again, and the
readers, the writers and every commit of an output call it, so an interrupted command never
publishes its outputs. Inside :func:`deferred` (the renames of a commit) signals are only
recorded, then raised when the block ends.

Exit codes: 130 for SIGINT, 143 for SIGTERM (128 + the signal number).
"""

from __future__ import annotations

import contextlib
import signal
import threading

_state = {"pending": None, "defer": 0}


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM."""

    signum = signal.SIGTERM


def _exception(signum) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _handler(signum, frame):
    _state["pending"] = signum
    if not _state["defer"]:
        raise _exception(signum)


def pending():
    """The signal number received since :func:`handlers` was entered, or None."""
    return _state["pending"]


def check() -> None:
    """Raise the exception of a signal that was received (and possibly swallowed) earlier."""
    if _state["pending"] is not None and not _state["defer"]:
        raise _exception(_state["pending"])


def exit_code(exc: BaseException | None = None) -> int:
    """128 + signal number: 143 for SIGTERM, 130 for SIGINT (and any other interrupt)."""
    signum = getattr(exc, "signum", None) or _state["pending"] or signal.SIGINT
    return 128 + int(signum)


def signal_name(exc: BaseException | None = None) -> str:
    return "SIGTERM" if exit_code(exc) == 128 + signal.SIGTERM else "SIGINT"


@contextlib.contextmanager
def handlers():
    """Install the SIGINT/SIGTERM handlers for the duration of a command (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _state["pending"] = None
    for s in previous:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        _state["pending"] = None


@contextlib.contextmanager
def deferred():
    """Record signals without raising inside the block; raise the recorded one at its end."""
    _state["defer"] += 1
    try:
        yield
    finally:
        _state["defer"] -= 1
    check()

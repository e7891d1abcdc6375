"""The one exception type for bad input, and how its messages name parameters.

Library code raises :class:`FedalignError` for anything a user can fix (a missing file, a wrong
file kind, NaN features, an option out of range). The CLI turns it into one readable line on
stderr and exit code 2; any other exception is a bug and keeps its traceback.

A message names parameters in the library's words (``chunk_rows``, ``skip_bad=True``); a front
end that spells them otherwise (the CLI: ``--chunk-rows``, ``--skip-bad``) gets its own words
without rewriting the message:

- the parameter an error is *about* is its ``param``, and the message starts with its name:
  ``FedalignError("tau must be in [0, 1], got 1.5", param="tau")``; the CLI shows
  ``--tau must be in [0, 1], got 1.5`` (a message that starts otherwise gets ``--tau:``
  before it);
- a parameter a message (or a note) tells the user to give is written with :func:`spell`:
  ``f"… or use {spell('skip_bad', True)} to leave bad images out"`` reads ``skip_bad=True``
  from the library and ``--skip-bad`` in ``fedalign extract``, whose runtime says how it
  spells its parameters (:func:`spelling`) while a command runs.

A message that shows the array it got shows it with :func:`short_array`: a few values, on one
line (the CLI prints one ``error:`` line).

Pure Python, importing nothing of fedalign (:func:`short_array` imports numpy when called, with
an array in hand).
"""

from __future__ import annotations

import contextlib
import contextvars
import re


class FedalignError(Exception):
    """Bad input: reported as ``error: <message>`` and exit code 2 by the CLI.

    Parameters
    ----------
    message : what is wrong, in one sentence (and how to fix it)
    param : the library parameter the error is about (``"tau"``, ``"n_atoms"``), or None; the
        message starts with its name
    """

    def __init__(self, message: str = "", *, param: str | None = None):
        super().__init__(message)
        self.param = param


#: How the running front end spells parameters: a function (param, value) → text, or None
#: for a parameter it does not have (set by :func:`spelling`).
_SPELLER: contextvars.ContextVar = contextvars.ContextVar("fedalign_speller", default=None)


def spell(param: str, value=None) -> str:
    """Parameter ``param`` (given ``value``) as the caller spells it, for a message that tells
    the user what to give: ``spell("label_base", 1)`` is ``label_base 1`` and
    ``spell("unlabeled", True)`` ``unlabeled=True`` from the library; ``--label-base 1`` and
    ``--unlabeled`` while a ``fedalign`` command with those options runs."""
    speller = _SPELLER.get()
    text = speller(param, value) if speller is not None else None
    if text is not None:
        return text
    if value is None:
        return param
    return f"{param}={value}" if isinstance(value, bool) else f"{param} {value}"


@contextlib.contextmanager
def spelling(speller):
    """Within the block, :func:`spell` asks ``speller(param, value)`` first (None: the
    library's spelling)."""
    token = _SPELLER.set(speller)
    try:
        yield
    finally:
        _SPELLER.reset(token)


def short_array(a, threshold: int = 5, precision: int | None = None) -> str:
    """An array for a one-line message: numpy's text of ``a``, summarised and on one line.

    Parameters
    ----------
    a : array-like
    threshold : most values shown in full; a larger array (of more than six) shows its first
        and last three around ``...`` (numpy's ``threshold``, ``edgeitems=3``)
    precision : digits of a float (None: numpy's print options, 8)

    Returns
    -------
    str without a line break: ``[0.25 0.25]``, ``[3 0 0 ... 0 0 1]``; the rows of a 2-D
    array follow each other (``[[1 2] [3 4]]``)
    """
    import numpy as np

    text = np.array2string(np.asarray(a), threshold=threshold, precision=precision,
                           max_line_width=1000)
    return re.sub(r"\n\s*", " ", text)

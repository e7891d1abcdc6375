"""The one exception type for bad input.

Library code raises :class:`FedalignError` for anything a user can fix (a missing file, a wrong
file kind, NaN features, an option out of range). The CLI turns it into one readable line on
stderr and exit code 2; any other exception is a bug and keeps its traceback.
"""


class FedalignError(Exception):
    """Bad input: reported as ``error: <message>`` and exit code 2 by the CLI."""

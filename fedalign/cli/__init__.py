"""Command-line interface: ``fedalign <subcommand>``.

Each subcommand lives in its own module and is registered on import below. Keep these modules
free of heavy imports (numpy is fine; torch, timm, sklearn, ot only inside functions).
"""

from fedalign.cli.app import app, main  # noqa: F401

# Subcommand registrations (one module each).
from fedalign.cli import gaussian_cmds  # noqa: F401,E402  stats, barycenter, align

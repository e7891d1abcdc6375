"""Command-line interface: ``fedalign <subcommand>``.

Each subcommand lives in its own module and is registered on import below. Keep these modules
free of heavy imports (numpy is fine; torch, timm, sklearn, ot only inside functions).
"""

from fedalign.cli.app import app, main  # noqa: F401

# Subcommand registrations (one module each).
from fedalign.cli import gaussian_cmds  # noqa: F401,E402  stats, barycenter, align
from fedalign.cli import extract_cmds  # noqa: F401,E402  extract
from fedalign.cli import fl_cmds  # noqa: F401,E402  partition, evaluate
from fedalign.cli import dadil_cmds  # noqa: F401,E402  dadil-round, consensus, dadil-evaluate
from fedalign.cli import simulate_cmds  # noqa: F401,E402  dadil-simulate
from fedalign.cli import envelope_cmds  # noqa: F401,E402  dadil-envelope
from fedalign.cli import gmm_cmds  # noqa: F401,E402  fit-gmm
from fedalign.cli import plot_cmds  # noqa: F401,E402  plot embedding|accuracy|reconstruction
from fedalign.cli import demo_cmds  # noqa: F401,E402  demo-data
from fedalign.cli import report_cmds  # noqa: F401,E402  report
from fedalign.cli import import_cmds  # noqa: F401,E402  import

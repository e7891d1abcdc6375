"""fedalign — federated feature alignment with optimal transport.

A federation is scripted as a pipeline of file transforms (see ``fedalign --help``).
Every subcommand is a thin layer over the library modules of this package:

- :mod:`fedalign.files`      every file kind (features, stats, reference, map, gmm, atoms, state, report)
- :mod:`fedalign.linalg`     symmetric matrix functions by eigendecomposition
- :mod:`fedalign.stats`      streaming moments and Ledoit–Wolf shrinkage
- :mod:`fedalign.gaussian`   Bures–Wasserstein distance, OT maps, barycenters (SLOT-Align)
- :mod:`fedalign.align`      applying Gaussian OT maps to feature files

Importing :mod:`fedalign` never imports torch.
"""

__version__ = "0.1.0"

from fedalign.errors import FedalignError  # noqa: E402,F401

"""fedalign — federated feature alignment with optimal transport.

A federation is scripted as a pipeline of file transforms (see ``fedalign --help``).
Every subcommand is a thin layer over the library modules of this package:

- :mod:`fedalign.files`      every file kind (features, stats, reference, map, gmm, atoms, state, report)
- :mod:`fedalign.linalg`     symmetric matrix functions by eigendecomposition
- :mod:`fedalign.stats`      streaming moments and Ledoit–Wolf shrinkage
- :mod:`fedalign.gaussian`   Bures–Wasserstein distance, OT maps, barycenters (SLOT-Align)
- :mod:`fedalign.align`      applying Gaussian OT maps to feature files
- :mod:`fedalign.dadil`      DeFed-GMM-DaDiL (a subpackage, one module per concept)
- :mod:`fedalign.estimators` scikit-learn / skada estimators (``fedalign.SLOTAlign``,
  ``fedalign.GMMDaDiLClassifier``)

Every room, what it holds and what it may import: ``docs/architecture.md``.

Importing :mod:`fedalign` never imports torch.
"""

from fedalign.version import __version__  # noqa: E402,F401

from fedalign.errors import FedalignError  # noqa: E402,F401

#: scikit-learn / skada estimators (:mod:`fedalign.estimators`), imported on first use so that
#: ``import fedalign`` (and ``fedalign --help``) loads neither scikit-learn nor torch.
_ESTIMATORS = ("SLOTAlign", "GMMDaDiLClassifier")


def __getattr__(name):
    if name in _ESTIMATORS:
        from fedalign import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'fedalign' has no attribute {name!r}")

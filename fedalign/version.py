"""The package's version, in a module that imports nothing (the package face's lazy
``__getattr__`` reaches the estimators; the readers and writers that stamp files with the
version import it from here)."""

__version__ = "0.1.0"

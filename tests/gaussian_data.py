"""Shared helpers of the Gaussian-core tests: random SPD matrices of a given condition number,
the relative max error, and the fixed point's numpy kernels for one 2 × 2 client."""

import contextlib

import numpy as np


def spd(d, rng, cond=100.0):
    """A random SPD (d, d) matrix: a random rotation of geomspace(1, cond, d), scaled."""
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (Q * np.geomspace(1, cond, d) * rng.uniform(0.5, 2)) @ Q.T


def rel(a, b):
    """max |a − b| / max |b|."""
    return np.abs(a - b).max() / np.abs(b).max()


@contextlib.contextmanager
def numpy_kernels():
    """The numpy adapter the fixed point's kernels run on (:mod:`fedalign.backend`; its
    Cholesky, eye, … were ``_NumpyKernels``'s)."""
    from fedalign.backend import get_backend

    yield get_backend("numpy")

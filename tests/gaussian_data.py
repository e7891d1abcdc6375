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
    """:class:`fedalign._bures_fixed_point._NumpyKernels` of one 2 × 2 identity client, closed
    on exit."""
    from fedalign._bures_fixed_point import _NumpyKernels

    kern = _NumpyKernels([np.eye(2)], np.ones(1), 1)
    try:
        yield kern
    finally:
        kern.close()

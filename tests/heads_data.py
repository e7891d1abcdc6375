"""Shared toy data of the head tests: C Gaussian classes in D dimensions, three clients of
different sizes and shifts (sizes differ from D, C and every K so a raw-row array would show
up by its length)."""

import numpy as np
import pytest

C, D = 4, 6


def blobs(n, seed, shift=0.0, classes=C):
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).normal(size=(C, D)) * 3
    y = rng.integers(0, classes, n)
    X = centers[y] + rng.normal(size=(n, D)) @ rng.normal(size=(D, D)) * 0.5 + shift
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def clients():
    return [blobs(53, 1), blobs(71, 2, shift=0.7), blobs(37, 3, shift=-0.4)]


def pooled(clients):
    return np.concatenate([c[0] for c in clients]), np.concatenate([c[1] for c in clients])

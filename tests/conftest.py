"""Shared test fixtures: generated feature files (tests never touch ../shared/data)."""

from __future__ import annotations

import os

# One BLAS / OpenMP thread, and idle threads that sleep, in the test process and in every
# fedalign process it starts (set before numpy or torch loads): the tests' matrices are small,
# and on 2 cores a thread pool spin-waits whenever another job (or another xdist worker) holds
# a core, for several times the CPU time of one thread. A variable already set wins.
for _var, _value in (("OPENBLAS_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"),
                     ("OMP_NUM_THREADS", "1"), ("OMP_WAIT_POLICY", "PASSIVE")):
    os.environ.setdefault(_var, _value)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fedalign.files import write_features


def _cache_typer_commands():
    """Build each typer app's click command once per test process, not once per
    ``CliRunner.invoke``: typer rebuilds the whole command tree (every command's signature and
    type hints, ~15 ms for fedalign's) on every call, which was ~15 of the suite's CPU-seconds
    over its ~960 in-process invocations. A built command keeps no state between ``main``
    calls (each call makes its own click context), and no test adds commands to an app after
    building it, so the cached tree is the one a fresh build gives. A real ``fedalign``
    process builds it once, as before."""
    import functools

    import typer.main
    import typer.testing

    if hasattr(typer.testing, "_get_command"):
        typer.testing._get_command = functools.lru_cache(maxsize=None)(typer.main.get_command)


_cache_typer_commands()


def make_features(path, n=200, d=8, n_classes=3, seed=0, shift=0.0, scale=1.0, unlabeled=False):
    """Write a small labeled features file with class-dependent means; return (X, y)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=n)
    centers = rng.normal(size=(n_classes, d)) * 3
    L = rng.normal(size=(d, d)) / np.sqrt(d)
    X = (centers[y] + rng.normal(size=(n, d)) @ L.T * scale + shift).astype(np.float32)
    labels = np.full(n, -1) if unlabeled else y
    write_features(path, X, labels, [f"img{i:05d}.png" for i in range(n)],
                   class_names=[f"c{c}" for c in range(n_classes)],
                   provenance={"producer": "tests"})
    return X, y


@pytest.fixture
def feature_file(tmp_path):
    """Factory fixture: ``feature_file(name, **kw) -> (path, X, y)``."""

    def _make(name="f.h5", **kw):
        p = tmp_path / name
        X, y = make_features(p, **kw)
        return p, X, y

    return _make


@pytest.fixture
def one_thread():
    """Small matrices: one torch/BLAS thread avoids spin-waiting on a loaded machine."""
    import torch
    from threadpoolctl import threadpool_limits

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(n)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (e.g. the subprocess kill tests of test_faults.py) run only when
    asked for: ``pytest -m slow`` (or any ``-m`` expression naming them)."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

"""Thread counts of numpy's BLAS and torch for the rest of the process.

DaDiL rounds, consensus and evaluation work on small matrices (K ≈ 50 components): on a
machine shared by several processes, multi-threaded BLAS and torch spin-wait on each other and
a step becomes ~10× slower than with one thread (``benchmarks/bench_dadil.py``).
"""

from __future__ import annotations

from fedalign import defaults
from fedalign.errors import FedalignError

#: Threads of the commands that work on small matrices (``--threads``).
DEFAULT_THREADS = defaults.THREADS


def limit_threads(n: int = DEFAULT_THREADS) -> None:
    """Use ``n`` threads in torch and in numpy's BLAS (threadpoolctl) from now on.

    torch is not imported here: when it is not loaded yet, ``OMP_NUM_THREADS`` tells it the
    count when it is.
    """
    import os
    import sys

    from threadpoolctl import threadpool_limits

    if int(n) < 1:
        raise FedalignError(f"threads must be ≥ 1, got {n}")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(n))
    else:  # read by torch when it is imported (not imported here: bad input fails fast)
        os.environ["OMP_NUM_THREADS"] = str(int(n))
    threadpool_limits(limits=int(n))

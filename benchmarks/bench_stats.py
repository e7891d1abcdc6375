"""`stats` (streaming Ledoit–Wolf) vs scikit-learn's LedoitWolf().fit on in-memory data.

Both sides see the same float32 array (n × d). scikit-learn computes in the input's float32;
fedalign accumulates float64 moments, so agreement is also checked against scikit-learn on a
float64 copy (should be ~1e-10 relative or better). A second part writes an HDF5 file larger
than the array and reports the peak RSS of `compute_stats` on it (streaming: peak memory does
not grow with n).

Usage: python benchmarks/bench_stats.py [--n 100000] [--d 768] [--file-rows 400000]
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--file-rows", type=int, default=400_000, help="rows of the on-disk file (0 = skip)")
    ap.add_argument("--repeats", type=int, default=4)
    a = ap.parse_args()
    from sklearn.covariance import LedoitWolf

    from fedalign.stats import Moments, shrunk_covariance

    rng = np.random.default_rng(0)
    X = (rng.normal(size=(a.n, a.d)).astype(np.float32) * rng.uniform(0.5, 2, a.d).astype(np.float32)
         + np.float32(3.0))

    def ours():
        m = Moments(a.d)
        for i in range(0, a.n, 8192):
            m.update(X[i : i + 8192])
        return m, shrunk_covariance(m)

    def sk():
        return LedoitWolf().fit(X)

    t_ours, t_sk = np.inf, np.inf
    for _ in range(a.repeats):  # interleaved, best of each (timings here are noisy)
        t_ours = min(t_ours, _timed(ours)[0])
        t_sk = min(t_sk, _timed(sk)[0])
    m, (C, s) = ours()
    lw32 = sk()
    lw64 = LedoitWolf().fit(X.astype(np.float64))
    print(f"n={a.n} d={a.d}: fedalign {t_ours:.2f}s, sklearn LedoitWolf {t_sk:.2f}s "
          f"→ speed-up {t_sk / t_ours:.2f}x")
    print(f"agreement vs sklearn(float64 copy): covariance {_rel(C, lw64.covariance_):.1e}, "
          f"shrinkage {abs(s - lw64.shrinkage_):.1e}, mean {_rel(m.mean, lw64.location_):.1e}")
    print(f"agreement vs sklearn(float32 input, its own float32 arithmetic): covariance "
          f"{_rel(C, lw32.covariance_):.1e}")
    if a.file_rows:
        _file_memory(a.file_rows, a.d)


def _timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def _file_memory(rows, d):
    from fedalign.files import FeatureWriter, atomic_output

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        path = os.path.join(tmp, "big.h5")
        rng = np.random.default_rng(1)
        with atomic_output(path) as t, FeatureWriter(t, d, chunk_rows=4096) as w:
            for i in range(0, rows, 50_000):
                m = min(50_000, rows - i)
                w.append(rng.normal(size=(m, d)).astype(np.float32), np.zeros(m), [""] * m)
        size = os.path.getsize(path) / 2**30
        # peak RSS from /proc (VmHWM): getrusage's ru_maxrss survives exec and would report the
        # RSS of this (large) parent process at fork time
        code = ("import re,time;from fedalign.stats import compute_stats;t=time.time();"
                f"s=compute_stats({path!r});"
                "h=int(re.search(r'VmHWM:\\s*(\\d+)',open('/proc/self/status').read()).group(1));"
                "print(time.time()-t, h/2**20)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        t, peak = map(float, out.stdout.split())
        print(f"file {rows}×{d} float32 = {size:.2f} GiB: compute_stats {t:.1f}s, "
              f"peak RSS {peak:.2f} GiB ({peak / size:.2f}× the file)")


if __name__ == "__main__":
    main()

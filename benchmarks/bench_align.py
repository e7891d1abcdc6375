"""`align` throughput vs a plain chunked HDF5 read + write copy of the same file (goal ≥ 0.5).

The copy anchor reads the features in the same chunks and writes them with the same
FeatureWriter (so it includes HDF5 I/O and the ids/labels), without the affine map.

Usage: python benchmarks/bench_align.py [--n 100000] [--d 1280]
"""

import argparse
import os
import tempfile
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=1280)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    from fedalign.align import AffineMap, align_file
    from fedalign.files import FeatureWriter, atomic_output, open_features, write_features

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        src = os.path.join(tmp, "src.h5")
        write_features(src, rng.normal(size=(a.n, a.d)).astype(np.float32), np.zeros(a.n),
                       [f"img/{i:07d}.png" for i in range(a.n)])
        B = rng.normal(size=(a.d, a.d)) / np.sqrt(a.d)
        amap = AffineMap(B @ B.T + np.eye(a.d), rng.normal(size=a.d), {})

        def copy():
            with open_features(src) as ff, atomic_output(os.path.join(tmp, "copy.h5")) as t:
                ids = ff.ids
                with FeatureWriter(t, ff.d, ff.class_names, ff.provenance, chunk_rows=4096,
                                   expected_rows=ff.n) as w:
                    for s, X, y in ff.iter_chunks(8192, with_labels=True):
                        w.append(X, y, ids[s : s + len(X)])

        def align():
            align_file(src, os.path.join(tmp, "aligned.h5"), amap, tau=0.4)

        # interleaved repeats, best of each: writes to the page cache are noisy here
        t_copy, t_align = np.inf, np.inf
        for _ in range(a.repeats):
            t_copy = min(t_copy, _timed(copy))
            t_align = min(t_align, _timed(align))
        mb = a.n * a.d * 4 / 2**20
        print(f"n={a.n} d={a.d} ({mb:.0f} MiB): copy {t_copy:.2f}s ({mb / t_copy:.0f} MiB/s), "
              f"align {t_align:.2f}s ({mb / t_align:.0f} MiB/s) → throughput ratio "
              f"{t_copy / t_align:.2f} (goal ≥ 0.5)")


def _timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()

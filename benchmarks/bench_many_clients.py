"""The server at cross-device scale: K small clients' statistics, one barycenter.

Three parts (each prints its figures; timings are this machine's, see README Performance):

``make``   K generated clients (n rows each, heterogeneous feature scales, d features) written
           as stats files (``--compact``: format_version 2) through the library, in one
           process. The barycenter's peak memory is then measured on the real command:

               /usr/bin/time -v fedalign barycenter DIR/*.stats.npz -o ref.npz --max-iter 2

``cost``   per-client-iteration cost of the fixed point (one root (Lᵀ Σ_k L)^{1/2} each) with
           the clients held factored (c I + W Wᵀ) and dense, for K clients at d: a capped
           number of iterations, timed and divided (an extrapolation to a full run is
           printed as such), one BLAS thread; CPU seconds of the process (process_time),
           which a shared machine's load inflates far less than wall time.

``f32``    the barycenter's error when every client's covariance travels in float32
           (``stats --dtype float32``: each rounded to float32, read back as float64),
           against the float64 barycenter.

``pot``    the ratio to POT's ``ot.gaussian.bures_wasserstein_barycenter`` at K clients
           (both run to convergence at POT's default eps; residuals printed).

Usage:
    python benchmarks/bench_many_clients.py make DIR --K 1000 --d 1280 --n 50
    python benchmarks/bench_many_clients.py cost --K 10 100 1000 --d 512 1280 --iters 2
    python benchmarks/bench_many_clients.py pot --K 100 --d 256
    python benchmarks/bench_many_clients.py f32 --K 10 --d 1280
"""

import argparse
import resource
import time
from pathlib import Path

import numpy as np


def client_rows(k, n, d, seed=0):
    rng = np.random.default_rng([seed, k])
    scales = np.random.default_rng(seed).uniform(0.2, 3.0, size=d)  # shared feature scales
    return (rng.normal(size=(n, d)) * scales * rng.uniform(0.7, 1.4, size=d)
            + rng.normal(size=d)).astype(np.float32)


def client_stats(k, n, d, seed=0):
    from fedalign.stats import GaussianStats, Moments, shrunk_covariance

    m = Moments(d).update(client_rows(k, n, d, seed)).finalize()
    C, s = shrunk_covariance(m, "auto")
    return GaussianStats(m.n, m.mean, C, s, m, [])


def make(a):
    from fedalign.stats import save_stats

    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for k in range(a.K):
        save_stats(out / f"client{k:04d}.stats.npz", client_stats(k, a.n, a.d),
                   dict(producer="bench_many_clients", client=f"c{k}", domain="gen"),
                   compact=True)
    print(f"wrote {a.K} stats files (d={a.d}, n={a.n}, format_version 2) in "
          f"{time.perf_counter() - t0:.1f}s → {out}")


def _factored(k, n, d):
    from fedalign.align import compact_covariance

    return compact_covariance(client_stats(k, n, d))


def cost(a):
    from threadpoolctl import threadpool_limits

    from fedalign.gaussian import bures_barycenter

    with threadpool_limits(limits=1):
        for d in a.d:
            for K in a.K:
                covs = [_factored(k, a.n, d) for k in range(K)]
                mem = sum(C.nbytes for C in covs)
                t, c0 = time.perf_counter(), time.process_time()
                B = bures_barycenter(covs, max_iter=a.iters, workers=1)
                dt, cpu = time.perf_counter() - t, time.process_time() - c0
                per = cpu / (K * B.iterations)
                print(f"factored d={d:5d} K={K:5d}: {B.iterations} iterations in {dt:8.1f}s wall,"
                      f" {cpu:8.1f}s CPU → {1e3 * per:7.1f} ms CPU per client-iteration; covariances held "
                      f"{mem / 2**20:8.1f} MiB (dense: {K * d * d * 8 / 2**20:8.1f} MiB); "
                      f"extrapolated to {a.full} iterations: {per * K * a.full / 60:6.1f} min",
                      flush=True)
                if K * d * d * 8 <= a.dense_limit * 2**30:
                    dense = [C.dense() for C in covs]
                    c0 = time.process_time()
                    Bd = bures_barycenter(dense, max_iter=a.iters, workers=1)
                    dtd = time.process_time() - c0
                    rel = (np.linalg.norm(Bd.covariance - B.covariance)
                           / np.linalg.norm(Bd.covariance))
                    print(f"dense    d={d:5d} K={K:5d}: {Bd.iterations} iterations in "
                          f"{dtd:8.1f}s CPU → {1e3 * dtd / (K * Bd.iterations):7.1f} ms CPU per "
                          f"client-iteration (dense/factored {dtd / cpu:.2f}x; "
                          f"same iterate to {rel:.1e})", flush=True)
                del covs
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


def pot(a):
    import ot
    from threadpoolctl import threadpool_limits

    from fedalign.gaussian import bures_barycenter, fixed_point_residual

    with threadpool_limits(limits=1):
        for d in a.d:
            for K in a.K:
                covs = [_factored(k, a.n, d) for k in range(K)]
                dense = [C.dense() for C in covs]
                w = np.full(K, 1.0 / K)
                t = time.process_time()
                _, Sp, log = ot.gaussian.bures_wasserstein_barycenter(
                    np.zeros((K, d)), np.array(dense), w, log=True)
                tp = time.process_time() - t
                rp = fixed_point_residual(Sp, dense, w)
                t = time.process_time()
                B = bures_barycenter(covs, w, tol=rp, workers=1)
                tf = time.process_time() - t
                t = time.process_time()
                B10 = bures_barycenter(covs, w, workers=1)
                tf10 = time.process_time() - t
                print(f"d={d} K={K} (CPU seconds, one thread): POT {tp:.1f}s ({log['num_iter']} iterations, residual "
                      f"{rp:.1e}); fedalign factored at POT's residual {tf:.1f}s "
                      f"({B.iterations} it.) → {tp / tf:.1f}x; at tol 1e-10 {tf10:.1f}s "
                      f"({B10.iterations} it., residual {B10.residual:.1e}) → {tp / tf10:.1f}x",
                      flush=True)


def f32(a):
    from threadpoolctl import threadpool_limits

    from fedalign.files import pack_symmetric, unpack_symmetric
    from fedalign.gaussian import bures_barycenter

    with threadpool_limits(limits=1):
        for d in a.d:
            for K in a.K:
                dense = [client_stats(k, a.n, d).covariance for k in range(K)]
                rounded = [unpack_symmetric(pack_symmetric(C, "float32")) for C in dense]
                B = bures_barycenter(dense, workers=1)
                B32 = bures_barycenter(rounded, workers=1)
                inp = max(np.linalg.norm(C - R) / np.linalg.norm(C)
                          for C, R in zip(dense, rounded))
                out = (np.linalg.norm(B32.covariance - B.covariance)
                       / np.linalg.norm(B.covariance))
                print(f"d={d} K={K}: float32 inputs (max rel. rounding {inp:.1e}) move the "
                      f"barycenter by {out:.1e} (relative Frobenius); residuals "
                      f"{B.residual:.1e} / {B32.residual:.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    for p in (m,):
        p.add_argument("--K", type=int, default=1000)
        p.add_argument("--d", type=int, default=1280)
    for name in ("cost", "pot", "f32"):
        p = sub.add_parser(name)
        p.add_argument("--K", type=int, nargs="+", default=[10, 100, 1000])
        p.add_argument("--d", type=int, nargs="+", default=[512, 1280])
        p.add_argument("--iters", type=int, default=2)
        p.add_argument("--full", type=int, default=13, help="iterations of a full run (extrapolation)")
        p.add_argument("--dense-limit", type=float, default=2.0, help="GiB: also time dense up to this")
    for p in sub.choices.values():
        p.add_argument("--n", type=int, default=50, help="rows per client")
    a = ap.parse_args()
    {"make": make, "cost": cost, "pot": pot, "f32": f32}[a.cmd](a)


if __name__ == "__main__":
    main()

"""Barycenter speed and accuracy: fedalign vs POT's bures_wasserstein_barycenter.

Both sides run in this process on the same K random SPD covariances. Accuracy is the exact
fixed-point residual ‖Σ_k w_k A_k⁻¹ − I‖_F/√d of each returned matrix (0 at the barycenter).
fedalign runs at its default tolerance (residual ≤ 1e-10) and again stopped at POT's residual
(equal accuracy). POT runs with its defaults (method="fixed_point", eps=1e-7) twice: with the BLAS threads as
configured, and with BLAS limited to one thread (its batched eigh is often faster so on
small, busy machines); the ratio is reported against the faster POT run.

Usage: python benchmarks/bench_barycenter.py [--d 512] [--K 10] [--big 2048] [--skip-pot]
"""

import argparse
import time

import numpy as np
from threadpoolctl import ThreadpoolController

from fedalign.gaussian import bures_barycenter, fixed_point_residual


def random_covs(K, d, seed=0):
    """K random SPD covariances with heterogeneous per-feature scales."""
    rng = np.random.default_rng(seed)
    covs = []
    for _ in range(K):
        Z = rng.normal(size=(2 * d, d)) * rng.uniform(0.2, 3.0, size=d)
        covs.append(Z.T @ Z / (2 * d) + 1e-3 * np.eye(d))
    return covs


def _time(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--big", type=int, default=2048, help="also time d=BIG (0 to skip)")
    ap.add_argument("--skip-pot", action="store_true")
    a = ap.parse_args()
    ctl = ThreadpoolController()

    covs = random_covs(a.K, a.d)
    w = np.full(a.K, 1.0 / a.K)
    bures_barycenter(covs[:2], w[:2] * 5, max_iter=1)  # warm-up: first-call imports (scipy BLAS)
    t_ours, B = _time(lambda: bures_barycenter(covs, w, tol=1e-10))
    S = B.covariance
    with ctl.limit(limits=1, user_api="blas"):
        r_ours = fixed_point_residual(S, covs, w)
    print(f"fedalign   d={a.d} K={a.K}: {t_ours:8.2f}s  iterations={B.iterations}  "
          f"residual={r_ours:.2e}", flush=True)
    if not a.skip_pot:
        import ot

        pot = lambda: ot.gaussian.bures_wasserstein_barycenter(  # noqa: E731
            np.zeros((a.K, a.d)), np.array(covs), w, log=True)
        with ctl.limit(limits=1, user_api="blas"):
            t1, (_, Sp, log) = _time(pot)
            r_pot = fixed_point_residual(Sp, covs, w)
        print(f"POT 1-BLAS d={a.d} K={a.K}: {t1:8.2f}s  iterations={log['num_iter']}  "
              f"residual={r_pot:.2e}", flush=True)
        t2, _ = _time(pot)
        print(f"POT        d={a.d} K={a.K}: {t2:8.2f}s  (BLAS threads as configured)", flush=True)
        t_pot = min(t1, t2)
        print(f"speed-up vs faster POT run: {t_pot / t_ours:.1f}x; accuracy: fedalign residual "
              f"{r_ours:.1e} {'<=' if r_ours <= r_pot else '>'} POT residual {r_pot:.1e}")
        print(f"‖S_fedalign − S_POT‖_F/‖S_fedalign‖_F = {np.linalg.norm(S - Sp) / np.linalg.norm(S):.1e}")
        # equal accuracy: stop as soon as our (exact) residual is at most POT's
        t_eq, B_eq = _time(lambda: bures_barycenter(covs, w, tol=r_pot))
        print(f"fedalign at tol = POT's residual: {t_eq:.2f}s  iterations={B_eq.iterations}  "
              f"residual={B_eq.residual:.2e} → speed-up {t_pot / t_eq:.1f}x at equal accuracy")
    if a.big:
        covs = random_covs(a.K, a.big, seed=1)
        for tol in (1e-10, 1e-9):
            t, B = _time(lambda: bures_barycenter(covs, w, tol=tol))
            print(f"fedalign   d={a.big} K={a.K} tol={tol:.0e}: {t:8.2f}s  "
                  f"iterations={B.iterations}  residual={B.residual:.2e}  "
                  f"({t / B.iterations:.1f}s per iteration; goal: < 120 s)", flush=True)


if __name__ == "__main__":
    main()

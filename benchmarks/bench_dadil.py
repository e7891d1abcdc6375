"""DeFed-GMM-DaDiL round cost at Office-Caltech10 scale.

d = 1280, C = 10 classes × 5 components (K = 50), A = 3 atoms, 4 clients (3 labeled sources,
1 unlabeled target), synthetic GMMs. Reports, per client and round:

- one local Adam step (source SMW2², target MW2²) and E of them;
- the aggregation (3 labeled barycenters of 3 versions) and the replacement;
- state + atoms file I/O;
- the barycenter's fixed point in its Gram form against the same iteration in feature space
  (``direct_plans``, the form before it): the ratio, and whether the plans are the same;
- a whole in-process federation of 4 clients × R rounds (``fedalign.dadil.simulation.simulate``), the
  same files the CLI writes, and one ``fedalign dadil-round`` subprocess (import included).

Usage: python benchmarks/bench_dadil.py [--rounds 50] [--local-steps 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def synthetic_gmms(folder, d=1280, C=10, k=5, n_clients=4, seed=0):
    from fedalign.gmm import GMM, save_gmm

    rng = np.random.default_rng(seed)
    K = C * k
    base = rng.normal(size=(K, d)) * 0.5
    paths = {}
    for i in range(n_clients):
        m = base + 0.1 * i + rng.normal(size=(K, d)) * 0.05
        v = rng.uniform(0.05, 0.2, (K, d))
        labels = None if i == n_clients - 1 else np.eye(C)[np.arange(K) // k]
        name = "target" if labels is None else f"source{i}"
        save_gmm(Path(folder) / f"{name}.gmm.npz",
                 GMM(np.full(K, 1 / K), m, v, labels, [f"c{c}" for c in range(C)]))
        paths[name] = Path(folder) / f"{name}.gmm.npz"
    return paths


def direct_plans(alpha, M, S, L, KB, tol=1e-6, max_iter=50):
    """The fixed point of :func:`fedalign.dadil.barycenter.barycenter_plans` with B held as
    (K_B, d) means and stds and its cost formed in feature space every iteration."""
    from fedalign.dadil.barycenter import project
    from fedalign.dadil.distances import emd_plan, sq_dist

    A, K, d = M.shape
    X = np.concatenate([M, S], -1).reshape(A * K, 2 * d)
    idx = np.arange(KB) % K
    mB, sB = np.einsum("a,ajd->jd", alpha, M[:, idx]), np.einsum("a,ajd->jd", alpha, S[:, idx])
    LB = np.eye(L.shape[2])[np.arange(KB) % L.shape[2]]
    last = None
    for _ in range(max_iter):
        XB = np.concatenate([mB, sB], -1)
        cost = np.maximum(sq_dist(X, XB), 0).reshape(A, K, KB)
        plans = np.stack([emd_plan(np.full(K, 1 / K), np.full(KB, 1 / KB),
                                   cost[a] + cost[a].max() * sq_dist(L[a], LB))
                          for a in range(A)])
        if last is not None and np.array_equal(plans, last):
            break
        m2, s2, L2 = project(alpha, plans, M, S, L, KB)
        num = ((m2 - mB) ** 2).sum() + ((s2 - sB) ** 2).sum() + ((L2 - LB) ** 2).sum()
        den = (m2**2).sum() + (s2**2).sum() + (L2**2).sum()
        mB, sB, LB, last = m2, s2, L2, plans
        if np.sqrt(num / den) <= tol:
            break
    return plans


def bench_fixed_point(st) -> None:
    """Gram form (:func:`~fedalign.dadil.barycenter.barycenter_plans`) against
    :func:`direct_plans` on one client's atoms, one after the other in this process."""
    from fedalign.dadil.barycenter import barycenter_plans, softmax

    M, S, L = st.means, np.sqrt(st.variances), softmax(st.label_logits)
    alpha, KB = st.alpha, M.shape[1]
    t_gram = timeit(lambda: barycenter_plans(alpha, M, S, L, KB), repeat=5)
    t_direct = timeit(lambda: direct_plans(alpha, M, S, L, KB), repeat=5)
    same = np.array_equal(barycenter_plans(alpha, M, S, L, KB)[0], direct_plans(alpha, M, S, L, KB))
    print(f"  barycenter fixed point: Gram form {t_gram * 1e3:.1f} ms, feature-space form "
          f"{t_direct * 1e3:.1f} ms (ratio {t_direct / t_gram:.2f}×; same plans: {same})")


def timeit(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    from fedalign.threads import limit_threads

    limit_threads(a.threads)
    from fedalign.dadil.gossip import aggregate_atoms, communicate, local_update
    from fedalign.dadil.simulation import simulate
    from fedalign.dadil.state import PublishedAtoms, init_client, save_atoms, save_state
    from fedalign.gmm import load_gmm

    tmp = Path(tempfile.mkdtemp(prefix="bench_dadil_"))
    paths = synthetic_gmms(tmp)
    src, tgt = load_gmm(paths["source0"]), load_gmm(paths["target"])
    st_s = init_client("source0", src, n_atoms=3, seed=0)
    st_t = init_client("target", tgt, n_atoms=3, seed=0)
    local_update(st_s, src, 1)  # warm-up (imports, allocator)
    t_src = timeit(lambda: local_update(st_s, src, 1))
    t_tgt = timeit(lambda: local_update(st_t, tgt, 1))
    rng = np.random.default_rng(1)
    peers = [PublishedAtoms(st_s.means + rng.normal(size=st_s.means.shape) * 0.01, st_s.variances,
                            st_s.label_logits, 1, f"p{i}") for i in range(3)]
    t_agg = timeit(lambda: aggregate_atoms([(st_s.means, st_s.variances, st_s.label_logits)]
                                           + [(p.means, p.variances, p.label_logits) for p in peers[:2]]))
    t_rep = timeit(lambda: communicate(st_s, peers, "replacement"))
    t_io = timeit(lambda: (save_state(tmp / "s.npz", st_s), save_atoms(tmp / "a.npz", st_s.published())))
    E = a.local_steps
    print(f"Office-Caltech10 scale: d=1280, K=50 (10 classes × 5), A=3, torch+BLAS threads={a.threads}")
    print(f"  local step: source {t_src * 1e3:.0f} ms, target {t_tgt * 1e3:.0f} ms")
    print(f"  aggregation (3 barycenters of 3 versions): {t_agg * 1e3:.0f} ms; "
          f"replacement {t_rep * 1e3:.2f} ms; state+atoms I/O {t_io * 1e3:.0f} ms")
    bench_fixed_point(st_s)
    per_round = {s: E * (3 * t_src + t_tgt) / 4 + t_io + c
                 for s, c in (("aggregation", t_agg), ("replacement", t_rep), ("none", 0.0))}
    for s, v in per_round.items():
        print(f"  estimated round per client, E={E}, {s}: {v:.2f} s "
              f"(4 clients × {a.rounds} rounds ≈ {4 * a.rounds * v / 60:.1f} min)")

    for strat in ("aggregation", "replacement"):
        t0 = time.perf_counter()
        simulate(paths, tmp / f"fed_{strat}", a.rounds, strat, E, keep_history=False, n_atoms=3,
                 seed=0)
        el = time.perf_counter() - t0
        print(f"  measured federation, 4 clients × {a.rounds} rounds, E={E}, {strat}: {el:.0f} s "
              f"= {el / 60:.1f} min ({el / (4 * a.rounds):.2f} s per round per client; "
              f"limit 10 min: {'OK' if el < 600 else 'EXCEEDED'})")

    # one CLI round: process start + imports + file reads + the round
    st = tmp / "fed_aggregation" / "state" / "source0.state.npz"
    prev = sorted((tmp / "fed_aggregation" / f"round_{a.rounds:03d}").glob("*.atoms.npz"))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "fedalign", "dadil-round", "--state", str(st),
                        "--strategy", "aggregation", "--local-steps", str(E), "-o",
                        str(tmp / "cli.atoms.npz"), *map(str, prev)], capture_output=True, text=True)
    el = time.perf_counter() - t0
    print(f"  one CLI round (subprocess, aggregation, E={E}): {el:.1f} s "
          f"({'ok' if r.returncode == 0 else r.stderr.strip()})")


if __name__ == "__main__":
    main()

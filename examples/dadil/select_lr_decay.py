"""How the fedalign preset's lr_decay was chosen: on the quick-start demo set, never on a
reported benchmark (see the ``fedalign.dadil.dictionary`` module docstring for the rule and figures).

    fedalign demo-data demo --per-domain 300 --size 32      # then extract each domain
    python select_lr_decay.py --features FEATS --out WORK --decays 0,0.02,0.05,0.1

For every decay, strategy, target domain and seed: fit the GMMs (k = 5; target unlabeled on its
80 % adaptation split), simulate R = 50 rounds × E = 3 local steps with ``lr_decay``, and
report the linear head's accuracy on the target's 20 % test split and the consensus ratio
M(R)/M(0) (``fedalign.dadil.consensus``, 10 weight vectors). Prints one table.
"""
import argparse
import collections
import json
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")


def job(args):
    feats, out, doms, decay, strat, T, seed, rounds, steps = args
    from fedalign.dadil import (accuracy, client_barycenter, consensus_history, gmm_classifier,
                                limit_threads, simulate)
    from fedalign.files import read_features
    from fedalign.gmm import fit_gmm, save_gmm
    from fedalign.partition import stratified_split

    limit_threads(1)
    g = Path(out) / f"gmm_{T}_s{seed}"
    g.mkdir(parents=True, exist_ok=True)
    gp = {}
    for d in doms:
        X, y, info = read_features(Path(feats) / f"{d}.h5")
        X, C = X.astype(np.float64), len(info["class_names"])
        p = g / f"{d}.gmm.npz"
        if d == T:
            tr, te = stratified_split(y, 0.2, np.random.default_rng([seed, 17]))
            Xte, yte = X[te], y[te]
            if not p.exists():
                save_gmm(p, fit_gmm(X[tr], None, 5, n_classes=C, seed=seed))
        elif not p.exists():
            save_gmm(p, fit_gmm(X, y, 5, n_classes=C, seed=seed))
        gp[d] = p
    fed = Path(out) / f"fed_{decay}_{strat}_{T}_{seed}"
    t0 = time.perf_counter()
    st = simulate(gp, fed, rounds, strat, steps, keep_history=True, n_atoms=3, seed=seed,
                  preset="fedalign", lr_decay=decay)
    h = consensus_history([fed], 10, 0, rounds)
    acc = accuracy(gmm_classifier(client_barycenter(st[T]), "linear", 500, seed), Xte, yte)
    shutil.rmtree(fed, ignore_errors=True)
    return dict(decay=decay, strat=strat, T=T, seed=seed, acc=acc,
                ratio=h["max"][-1] / h["max"][0], seconds=time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--domains", default="ink,neon,blocky")
    ap.add_argument("--decays", default="0,0.02,0.05,0.1")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--local-steps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    doms = a.domains.split(",")
    jobs = [(a.features, a.out, doms, float(dc), s, T, int(sd), a.rounds, a.local_steps)
            for dc in a.decays.split(",") for s in ("aggregation", "replacement")
            for T in doms for sd in a.seeds.split(",")]
    with ProcessPoolExecutor(a.workers) as ex:
        res = list(ex.map(job, jobs))
    Path(a.out, "select_lr_decay.json").write_text(json.dumps(res, indent=1))
    by = collections.defaultdict(dict)
    for r in res:
        by[(r["strat"], r["decay"])][(r["T"], r["seed"])] = r
    print("| strategy | lr_decay | accuracy % | paired change vs 0 (± SE) | worst M(R)/M(0) |")
    print("|---|---|---|---|---|")
    for (s, dc), runs in sorted(by.items()):
        base = by.get((s, 0.0), runs)
        diff = [100 * (runs[k]["acc"] - base[k]["acc"]) for k in runs]
        se = np.std(diff, ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else 0.0
        print(f"| {s} | {dc:g} | {100 * np.mean([r['acc'] for r in runs.values()]):.1f} | "
              f"{np.mean(diff):+.1f} ± {se:.1f} | {max(r['ratio'] for r in runs.values()):.3f} |")


if __name__ == "__main__":
    main()

"""Leave-one-domain-out sweep of DeFed-GMM-DaDiL against its baselines (in-process simulation).

For every target domain T and seed s (and fraction of missing target classes m):

0. (``--standardize``) every domain is z-scored with its own statistics; ``--subsample N``
   keeps a stratified N rows per domain (fixed across seeds).
1. T is split into a stratified 80% adaptation part and a 20% test part (seeded); the test
   part is never used for adaptation. m · C classes (floor, seeded) are removed from the
   adaptation part only.
2. GMMs: every source labeled on all its rows (``fit_gmm``, k components per class); the target
   unlabeled on its adaptation part (C·k components).
3. Methods, all scored on T's test part:
   - source-only: logistic regression on the pooled labeled source features;
   - centralized GMM-DaDiL: ``learn_dictionary`` on all GMMs in one process;
   - DeFed replacement / DeFed aggregation: ``fedalign.gossip.simulate`` (the same files as
     ``fedalign dadil-round``), every client a domain, R rounds × E local steps.
   Classifier: linear head on 500 samples per class of B(α_T; atoms) (the MAP rule is
   recorded too).

Results go to OUT/results/*.json (one per target, seed, m; existing ones are skipped, so
the sweep can be resumed). ``make_results.py`` turns them into RESULTS.md and plots.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np


def load_domain(path, subsample: int | None, standardize: bool = False, seed: int = 0):
    from fedalign.files import read_features
    from fedalign.partition import stratified_split

    X, y, info = read_features(path)
    if subsample and len(y) > subsample:
        # stratified subsample, fixed across seeds
        _, keep = stratified_split(y, subsample / len(y), np.random.default_rng(seed))
        X, y = X[keep], y[keep]
    X = X.astype(np.float64)
    if standardize:  # each domain z-scored with its own statistics (local preprocessing)
        X = (X - X.mean(0)) / (X.std(0) + 1e-3)
    return X, y, info["class_names"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", required=True, help="folder with <domain>.h5")
    ap.add_argument("--domains", required=True, help="comma list")
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets", default=None, help="comma list (default: all domains)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--missing", default="0", help="comma list of fractions of target classes removed")
    ap.add_argument("--methods", default="source-only,centralized,replacement,aggregation")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--central-iters", type=int, default=100)
    ap.add_argument("--n-atoms", type=int, default=3)
    ap.add_argument("--k", type=int, default=5, help="components per class")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--subsample", type=int, default=0)
    ap.add_argument("--standardize", action="store_true",
                    help="z-score every domain with its own mean/std (Amazon review: raw features ~1e-2)")
    ap.add_argument("--consensus", action="store_true",
                    help="keep every round of the DeFed runs of the first seed and compute M_ij(t)")
    ap.add_argument("--consensus-points", type=int, default=6)
    ap.add_argument("--consensus-target", default=None, help="only this target (default: all)")
    ap.add_argument("--consensus-every", type=int, default=1)
    a = ap.parse_args(argv)

    from fedalign.gossip import limit_threads

    limit_threads(1)
    from fedalign.consensus import consensus_history
    from fedalign.gmm import fit_gmm, load_gmm, save_gmm
    from fedalign.gossip import (accuracy, centralized_classifier,
                                 simulate, source_only_classifier, target_classifier)
    from fedalign.partition import stratified_split

    feats, out = Path(a.features), Path(a.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    domains = a.domains.split(",")
    targets = a.targets.split(",") if a.targets else domains
    seeds = [int(s) for s in a.seeds.split(",")]
    missing = [float(m) for m in a.missing.split(",")]
    methods = a.methods.split(",")
    data = {d: load_domain(feats / f"{d}.h5", a.subsample or None, a.standardize) for d in domains}
    C = len(data[domains[0]][2]) or int(max(v[1].max() for v in data.values())) + 1

    for seed in seeds:
        gdir = out / "gmms" / f"s{seed}"
        gdir.mkdir(parents=True, exist_ok=True)
        src_gmm = {}
        for d in domains:
            p = gdir / f"{d}.labeled.gmm.npz"
            if not p.exists():
                X, y, names = data[d]
                save_gmm(p, fit_gmm(X, y, a.k, n_classes=C, seed=seed, class_names=names))
            src_gmm[d] = p
        for T in targets:
            for m in missing:
                res_path = out / "results" / f"{T}_s{seed}_m{int(round(100 * m)):02d}.json"
                if res_path.exists():
                    continue
                rng = np.random.default_rng([seed, 17])
                X, y, names = data[T]
                tr, te = stratified_split(y, 0.2, rng)
                dropped = sorted(rng.choice(C, size=int(np.floor(m * C + 1e-9)), replace=False).tolist())
                tr = tr[~np.isin(y[tr], dropped)]
                tp = gdir / f"{T}.target_m{int(round(100 * m)):02d}.gmm.npz"
                t0 = time.perf_counter()
                if not tp.exists():
                    save_gmm(tp, fit_gmm(X[tr], None, a.k, n_classes=C, seed=seed, class_names=names))
                res = dict(target=T, seed=seed, missing=m, dropped_classes=dropped,
                           n_adapt=int(len(tr)), n_test=int(len(te)), acc={}, acc_map={},
                           time={}, settings=vars(a), gmm_fit_s=time.perf_counter() - t0)
                Xte, yte = X[te], y[te]
                sources = [d for d in domains if d != T]
                if "source-only" in methods:
                    t0 = time.perf_counter()
                    Xs = np.concatenate([data[d][0] for d in sources])
                    ys = np.concatenate([data[d][1] for d in sources])
                    res["acc"]["source-only"] = accuracy(source_only_classifier(Xs, ys, seed), Xte, yte)
                    res["time"]["source-only"] = time.perf_counter() - t0
                if "centralized" in methods:
                    t0 = time.perf_counter()
                    gs = [load_gmm(src_gmm[d]) for d in sources] + [load_gmm(tp)]
                    pred, hist = centralized_classifier(gs, len(gs) - 1, a.n_atoms, a.central_iters,
                                                        a.lr, seed)
                    res["acc"]["centralized"] = accuracy(pred, Xte, yte)
                    res["time"]["centralized"] = time.perf_counter() - t0
                    res["centralized_loss"] = [hist["loss"][0], hist["loss"][-1]]
                for strat in ("replacement", "aggregation"):
                    if strat not in methods:
                        continue
                    fed = out / "fed" / f"{T}_s{seed}_m{int(round(100 * m)):02d}_{strat}"
                    keep = (a.consensus and seed == seeds[0] and m == missing[0]
                            and a.consensus_target in (None, T))
                    gp = {d: (src_gmm[d] if d != T else tp) for d in domains}
                    t0 = time.perf_counter()
                    states = simulate(gp, fed, a.rounds, strat, a.local_steps, a.n_atoms, seed,
                                      a.lr, keep_history=keep)
                    el = time.perf_counter() - t0
                    st = states[T]
                    res["acc"][f"DeFed {strat}"] = accuracy(target_classifier(st, "linear", 500, seed), Xte, yte)
                    res["acc_map"][f"DeFed {strat}"] = accuracy(target_classifier(st, "map"), Xte, yte)
                    res["time"][f"DeFed {strat}"] = el
                    res["time"][f"DeFed {strat} per round per client"] = el / (a.rounds * len(domains))
                    res[f"alpha_{strat}"] = st.alpha.tolist()
                    res[f"target_loss_{strat}"] = [st.records[0]["losses"][0] if st.records[0]["losses"] else None,
                                                   st.records[-1]["losses"][-1] if st.records[-1]["losses"] else None]
                    if keep:
                        h = consensus_history([fed], a.consensus_points, 0, a.consensus_every)
                        res[f"consensus_{strat}"] = dict(rounds=h["rounds"].tolist(),
                                                         mean=h["mean"].tolist(), max=h["max"].tolist())
                    shutil.rmtree(fed, ignore_errors=True)
                res_path.write_text(json.dumps(res, indent=1))
                print(f"{T} seed={seed} m={m}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in res["acc"].items())
                      + " | " + ", ".join(f"{k} {v:.1f}s" for k, v in res["time"].items()), flush=True)


if __name__ == "__main__":
    main()

"""Stand-ins of the ``auto`` head's rule, scored on a tuning set the tables do not report.

The rule (:func:`fedalign.dadil.target_head.choose_head`) lets every source play the target:
its rows are halved (seeded), a stand-in for B(α_T) is built from half A, and the ``lda`` and
``linear`` heads are scored on half B. This script compares stand-ins on missing-class jobs of
targets whose missing-class study RESULTS.md does not report (the tuning set of stop 39:
Digits mnist; Office-Caltech10 amazon and caltech10), none of which the rule may look at:

- ``own`` — the first rule (stop 35): a labeled GMM of half A (the source's own fit options);
- ``relabeled`` — the same GMM, each component relabeled by the LDA of the other sources'
  class statistics (the half's own geometry, labels from elsewhere: how B(α_T) gets them);
- ``unlabeled`` — an *unlabeled* GMM of half A (C·k components, as the target's), labeled the
  same way (one more GMM fit per source);

and the rules made of them: each alone, and each head's mean score over ``own`` and one of
the others (``own+relabeled`` is the library's rule since stop 39,
:func:`fedalign.dadil.target_head.choose_head`, which computes ``own`` and ``relabeled``).

For every job it reads the heads' accuracies on the target's test split from the job's result
(``run_lodo.run_job``: the DeFed runs and every head, as the reproduction's missing-class jobs)
and prints, per target, the accuracy the ``auto`` head reaches under each stand-in and under
the better head of every job. The rule never reads a target label; only this comparison does,
on targets the tables do not report.

    python tune_head_rule.py --features FEATS/digits --domains mnist,usps,mnistm \\
        --targets mnist --out WORK/tune/digits
    python tune_head_rule.py --features FEATS/office_caltech10 \\
        --domains amazon,caltech10,dslr,webcam --targets amazon,caltech10 --out WORK/tune/office

Stop 39's figures (seeds 0–2, 15/30/45 % removed, both DeFed strategies; mean accuracy % of
the chosen head, mnist / amazon / caltech10): own 72.1 / 94.7 / 91.0; unlabeled 78.7 / 94.1 /
90.7; own+unlabeled 78.7 / 94.7 / 91.0; own+relabeled 77.4 / 94.7 / 91.1; the better head of
every job 78.7 / 95.1 / 91.6.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import run_lodo

RULES = ("own", "relabeled", "unlabeled", "own+relabeled", "own+unlabeled")


def run_missing_job(a, T: str, seed: int, m: float) -> dict:
    """The reproduction's missing-class job (target T, seed, fraction m), cached as JSON."""
    name = f"missing_{T}_s{seed}_m{int(round(100 * m)):02d}"
    path = Path(a.out) / "results" / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    res = run_lodo.run_job(a, dict(kind="missing", target=T, seed=seed, missing=m, name=name))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, default=run_lodo._jsonable))
    tmp.replace(path)
    return json.loads(path.read_text())


def unlabeled_scores(rows, gmms, sources, seed: int) -> dict:
    """The ``unlabeled`` stand-in's scores: per source, (lda, linear) on half B."""
    from fedalign.dadil import target_head as th
    from fedalign.gmm import refit_gmm

    C, (ridge, to) = rows.n_classes, rows.shrinkage
    lda, lin = [], []
    for i, (g, (X, y)) in enumerate(zip(gmms, sources)):
        X, y = np.asarray(X, np.float64), np.asarray(y)
        a, b = th.rule_halves(len(y), seed, i)
        others = [msg for j, msg in enumerate(rows.messages) if j != i]
        u = refit_gmm(g, X[a], None, n_classes=C)                  # unlabeled, C·k components
        ld, li = th.stand_in_scores(th.relabeled(u, others, ridge, to), others, X[a], X[b],
                                    y[b], C, ridge, to, 500, seed)
        lda.append(ld)
        lin.append(li)
    return dict(lda=lda, linear=lin)


def score_job(args) -> dict:
    """Run (or read) one job and every stand-in's choice for it."""
    a, T, seed, m = args
    from fedalign.dadil import target_head as th
    from fedalign.gmm import load_gmm

    res = run_missing_job(a, T, seed, m)
    C = res["n_classes"]
    X, y, (tr, _, _), sources, src = run_lodo.aligned_job_data(a, T, seed, m, C)
    tag = f"m{int(round(100 * m)):02d}"
    gmms = [load_gmm(Path(a.out) / "gmms" / f"s{seed}" / f"{d}.to_{T}_{tag}.labeled.gmm.npz")
            for d in sources]
    srcs = [src[d] for d in sources]
    rows = th.target_rows(X[tr], srcs, C)
    th.choose_head(rows, gmms, srcs, seed=seed)
    rec = rows.record["head_rule"]["stand_ins"]
    scores = dict(own=rec["own labels"], relabeled=rec["transferred"],
                  unlabeled=unlabeled_scores(rows, gmms, srcs, seed))
    for a_, b_ in (("own", "relabeled"), ("own", "unlabeled")):
        scores[f"{a_}+{b_}"] = {h: [np.mean(v) for v in zip(scores[a_][h], scores[b_][h])]
                                for h in ("lda", "linear")}
    pick = {n: ("lda" if np.mean(scores[n]["lda"]) >= np.mean(scores[n]["linear"]) else "linear")
            for n in RULES}
    assert pick["own+relabeled"] == rows.choice                # the library's rule
    acc = {s: {h: res["result"]["accuracy"][s][h][0] for h in ("lda", "linear")}
           for s in ("DeFed replacement", "DeFed aggregation")}
    return dict(target=T, seed=seed, missing=m, pick=pick, acc=acc,
                absent=res["label_shift"]["absent"])


def main(argv=None):
    import sys

    ap = run_lodo.parser()
    ap.description = __doc__.splitlines()[0]
    argv = list(sys.argv[1:] if argv is None else argv)
    a = run_lodo.parse_study(ap, argv + ["--no-peers"])       # the DeFed runs and heads only
    a.missing = [m for m in a.missing if m > 0]                 # the missing-class jobs
    a.seeds = a.missing_seeds
    jobs = [(a, T, s, m) for T in a.targets for s in a.seeds for m in a.missing]
    with ProcessPoolExecutor(a.workers, initializer=run_lodo._worker_init) as ex:
        out = list(ex.map(score_job, jobs))
    (Path(a.out) / "head_rule_tuning.json").write_text(json.dumps(out, indent=1))
    print("| target | jobs | " + " | ".join(RULES) + " | better head of each job |")
    print("|---|---|" + "---|" * (len(RULES) + 1))
    for T in a.targets:
        mine = [r for r in out if r["target"] == T]
        cells = [100 * np.mean([v[r["pick"][n]] for r in mine for v in r["acc"].values()])
                 for n in RULES]
        best = 100 * np.mean([max(v.values()) for r in mine for v in r["acc"].values()])
        picks = [sum(r["pick"][n] == "lda" for r in mine) for n in RULES]
        print(f"| {T} | {len(mine)} | " + " | ".join(f"{c:.1f} (lda {p}/{len(mine)})"
                                                     for c, p in zip(cells, picks))
              + f" | {best:.1f} |")


if __name__ == "__main__":
    main()

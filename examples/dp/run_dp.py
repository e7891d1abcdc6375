"""The DP grid in one process pool: accuracy against the privacy budget ε of SLOT + FedCGS and
SLOT + Fed3R, every (dataset, ε, map statistics, seed) one in-memory federation
(:func:`fedalign.federation.run_federation` with :class:`fedalign.federation.FederationDP`).

    python run_dp.py --features /work/cache/features -o /tmp/fedalign-dp/grid --jobs 2
    python make_results.py /tmp/fedalign-dp/grid -o RESULTS.md --plot dp_accuracy.png

Protocol of one run (dataset, ε, seed s): the SLOT grid's partition (α = 0.1, M = 1 client per
domain, partition seed = head seed = s), a fixed τ (0.4, the SLOT-Align reference's label-free
default: validation-based τ selection would release the same rows a second time), and every
client's total budget (ε, δ) per run split by μ² between its statistics (half) and its head
message (half); at τ = 0 (no SLOT) only the head message is sent and it gets all of it. The
maps are built from the released statistics (``--map-stats released``, the case the guarantee
covers) and, for comparison, from each client's exact statistics (``exact``: the head message
is then not covered, which the reports say). ε = inf is the non-private run.

δ = 1e-6 by default: below 1/n² for every client of these datasets (make_results.py checks it
against the largest domain's training rows, a public number). C: by default the median row
norm of the public quick-start demo features (``--clip-from``, the cached
``/work/cache/features/demo/*.h5``: the `fedalign demo-data` images through the same encoder),
never the private data; or ``--clip C``. The rule and its value are recorded in every report.

Writes ``<out>/<dataset>/eps<ε>_<map>_s<seed>.json`` (kind ``report``; ``epsinf_s<seed>.json``
for ε = inf), skips runs whose report exists (an interrupted grid resumes), and appends each
run's wall time to ``<out>/timing.jsonl``.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per worker: the jobs share the cores

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slot"))
import run_grid  # noqa: E402  the SLOT grid's domain lists and feature loading

HEADS = ["fedcgs", "fed3r"]
DEMO = Path("/work/cache/features/demo")


def clip_from_public(folder: Path, percentile: float) -> tuple[float, dict]:
    """C = the ``percentile``-th percentile of the row norms of the public features in
    ``folder`` (*.h5), and the record of the rule."""
    import numpy as np

    from fedalign.files import read_features, sha256_file

    paths = sorted(Path(folder).glob("*.h5"))
    if not paths:
        raise SystemExit(f"error: no public features (*.h5) in {folder}: give --clip C, or "
                         "--clip-from a folder of `fedalign demo-data` images extracted with the "
                         "same encoder")
    norms, info = [], {}
    for p in paths:
        X, _, meta = read_features(p)
        norms.append(np.linalg.norm(X.astype(np.float64), axis=1))
        info[p.stem] = dict(rows=int(len(X)), model=meta["provenance"].get("model"),
                            sha256=sha256_file(p))
    C = float(np.percentile(np.concatenate(norms), percentile))
    return C, dict(rule=f"{percentile:g}th percentile of the row norms of public features",
                   source=str(folder), files=info, clip=C)


def _alpha(text):
    from fedalign.grammar import parse_alpha  # the command line's reading of α

    return parse_alpha(text)


def eps_label(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


def report_path(out: Path, dataset: str, eps: float, map_stats: str, seed: int) -> Path:
    name = f"epsinf_s{seed}.json" if math.isinf(eps) else f"eps{eps:g}_{map_stats}_s{seed}.json"
    return Path(out) / dataset / name


def run_one(job):
    """One federation → its report file; returns (job, seconds)."""
    from fedalign.dp import make_spec
    from fedalign.federation import FederationDP, run_federation
    from fedalign.files import write_report

    features, out, dataset, eps, map_stats, seed, a = job
    t0 = time.perf_counter()
    domains, info = run_grid.load(Path(features), dataset)
    dp = None
    if not math.isinf(eps):
        dp = FederationDP(make_spec(eps, a["delta"], a["clip"], a["mechanism"]),
                          stats_share=a["stats_share"], map_stats=map_stats)
    result, parts = run_federation(domains, a["alpha"], seed, [a["tau"]], a["heads"],
                                   clients_per_domain=1, dp=dp, selection=False)
    result.update(dataset=dataset, features=info, epsilon=eps_label(eps),
                  map_stats=None if dp is None else map_stats, clip_rule=a["clip_rule"],
                  delta=a["delta"], tau=a["tau"])
    path = report_path(Path(out), dataset, eps, map_stats, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_report(path, result)
    return job, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", type=Path, required=True, help="folder with <dataset>/<domain>.h5")
    ap.add_argument("-o", "--output", type=Path, required=True, help="reports folder (outside the repo)")
    ap.add_argument("--datasets", nargs="+", default=["office_caltech10", "digits"])
    ap.add_argument("--epsilons", nargs="+", type=float, default=[0.5, 1, 2, 4, 8, math.inf])
    ap.add_argument("--seeds", nargs="+", default=["0-4"])
    ap.add_argument("--alpha", type=_alpha, default=0.1,
                    help="Dirichlet α of the label shift, or none (each client keeps all of its "
                         "domain's training rows)")
    ap.add_argument("--tau", type=float, default=0.4)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--clip", type=float, default=None, help="C (default: from --clip-from)")
    ap.add_argument("--clip-from", type=Path, default=DEMO, help="public features for the C rule")
    ap.add_argument("--clip-percentile", type=float, default=50.0)
    ap.add_argument("--mechanism", default="analytic", choices=["analytic", "zcdp"])
    ap.add_argument("--stats-share", type=float, default=0.5, help="share of μ² for the statistics")
    ap.add_argument("--map-stats", nargs="+", default=["released", "exact"], choices=["released", "exact"])
    ap.add_argument("--heads", nargs="+", default=HEADS)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--domains", nargs="+", default=[], metavar="DATASET=a,b,c",
                    help="a dataset's domain files <features>/DATASET/<a>.h5 …, in this order")
    args = ap.parse_args()
    for spec in args.domains:
        name, _, doms = spec.partition("=")
        run_grid.DOMAINS[name] = [d for d in doms.replace(",", " ").split() if d]
    if args.clip is not None:
        clip, rule = args.clip, dict(rule="given (--clip)", clip=args.clip)
    else:
        clip, rule = clip_from_public(args.clip_from, args.clip_percentile)
    shared = dict(alpha=args.alpha, tau=args.tau, delta=args.delta, clip=clip, clip_rule=rule,
                  mechanism=args.mechanism, stats_share=args.stats_share, heads=args.heads)
    seeds = run_grid.parse_seeds(args.seeds)
    jobs = []
    for s in seeds:
        for ds in args.datasets:
            for eps in args.epsilons:
                for ms in (["released"] if math.isinf(eps) else args.map_stats):
                    jobs.append((str(args.features), str(args.output), ds, eps, ms, s, shared))
    todo = [j for j in jobs if not report_path(args.output, j[2], j[3], j[4], j[5]).exists()]
    print(f"dp grid: {len(jobs)} runs, {len(jobs) - len(todo)} done already, {len(todo)} to run on "
          f"{args.jobs} workers; C = {clip:.4g} ({rule['rule']}), δ = {args.delta:g}", flush=True)
    run_grid.run_jobs(run_one, todo, args.jobs, args.output, _drain, "dp grid")


def _drain(results, n, log, t0):
    with open(log, "a") as f:
        for i, (job, sec) in enumerate(results, 1):
            _, _, ds, eps, ms, s, _ = job
            f.write(json.dumps(dict(dataset=ds, epsilon=eps_label(eps), map_stats=ms, seed=s,
                                    seconds=round(sec, 1))) + "\n")
            f.flush()
            print(f"[{i}/{n} {time.perf_counter() - t0:6.0f}s] {ds} ε={eps_label(eps)} {ms} "
                  f"seed={s}: {sec:.0f}s", flush=True)


if __name__ == "__main__":
    main()

"""The SLOT-Align grid in one process pool: every (dataset, M, α, seed) is one in-memory
federation (:func:`fedalign.federation.run_federation`) that reuses its statistics, barycenter
and maps across τ; no process starts per step.

    python run_grid.py --features /work/cache/features -o /tmp/fedalign-slot/grid --jobs 2

writes one report per run, ``<out>/<dataset>/M<M>_a<alpha>_s<seed>.json`` (kind ``report``,
producer ``fedalign federation``; identical bytes for the same inputs), skips runs whose report
exists (so an interrupted grid resumes), and appends the wall time of every run to
``<out>/timing.jsonl`` (the only non-deterministic output). ``make_results.py`` turns the
reports into RESULTS.md.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per worker: the jobs share the cores

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

DOMAINS = {"office_caltech10": ["amazon", "caltech10", "dslr", "webcam"],
           "digits": ["mnist", "usps", "mnistm"]}

_DATA: dict = {}


def features_info(paths) -> dict:
    """What each domain file is (from its provenance): rows, d, encoder, weights, input size."""
    from fedalign.files import open_features, sha256_file

    out = {}
    for p in paths:
        with open_features(p) as ff:
            prov = ff.provenance
            dc = prov.get("data_config") or {}
            w = prov.get("weights") or {}
            out[Path(p).stem] = dict(rows=int(ff.n), d=int(ff.d), model=prov.get("model"),
                                     weights=w.get("weights") if isinstance(w, dict) else w,
                                     input_size=dc.get("input_size"), source=prov.get("source"),
                                     sha256=sha256_file(p))
    return out


def load(features: Path, dataset: str):
    if dataset not in _DATA:
        from fedalign.partition import load_domains

        folder = features / dataset
        names = DOMAINS.get(dataset) or sorted(p.stem for p in folder.glob("*.h5"))
        paths = [folder / f"{n}.h5" for n in names]
        _DATA[dataset] = (load_domains(paths), features_info(paths))
    return _DATA[dataset]


def report_path(out: Path, dataset: str, M: int, alpha, seed: int) -> Path:
    return out / dataset / f"M{M}_a{alpha}_s{seed}.json"


def run_one(job):
    """One federation → its report file; returns (job, seconds, parts)."""
    from fedalign.federation import run_federation
    from fedalign.files import write_report
    from fedalign.grammar import parse_alpha  # the command line's reading of α

    features, out, dataset, M, alpha, seed, taus, heads, tol = job
    t0 = time.perf_counter()
    domains, info = load(Path(features), dataset)
    result, parts = run_federation(domains, parse_alpha(alpha), seed, taus, heads, clients_per_domain=M,
                                   tol=tol)
    result.update(dataset=dataset, features=info)
    path = report_path(Path(out), dataset, M, alpha, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_report(path, result)
    return job, time.perf_counter() - t0, parts


def parse_seeds(text):
    from fedalign.grammar import parse_seeds as ps  # the command line's reading of seeds

    return ps(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", type=Path, required=True, help="folder with <dataset>/<domain>.h5")
    ap.add_argument("-o", "--output", type=Path, required=True, help="reports folder")
    ap.add_argument("--datasets", nargs="+", default=["office_caltech10", "digits"])
    ap.add_argument("--alphas", nargs="+", default=["0.5", "0.1", "0.05"])
    ap.add_argument("--seeds", nargs="+", default=["0-4"])
    ap.add_argument("--taus", nargs="+", type=float, default=[0, 0.2, 0.4, 0.6, 0.8, 1])
    ap.add_argument("--clients-per-domain", "-M", nargs="+", type=int, default=[1])
    ap.add_argument("--heads", nargs="+", default=None,
                    help="head labels method[:variant] (default: every head in both variants)")
    ap.add_argument("--tol", type=float, default=1e-6, help="barycenter tolerance (relative change)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--domains", nargs="+", default=[], metavar="DATASET=a,b,c",
                    help="a dataset's domain files <features>/DATASET/<a>.h5 …, in this order "
                         "(default: the built-in lists, else every .h5 of the folder, sorted)")
    args = ap.parse_args()
    for spec in args.domains:
        name, _, doms = spec.partition("=")
        names = [d for d in doms.replace(",", " ").split() if d]
        if not name or not names:
            ap.error(f"--domains {spec!r}: expected DATASET=a,b,c")
        DOMAINS[name] = names
    missing = [str(args.features / ds / f"{d}.h5") for ds in args.datasets
               for d in DOMAINS.get(ds, [])
               if not (args.features / ds / f"{d}.h5").is_file()]
    missing += [f"{args.features / ds}/*.h5" for ds in args.datasets
                if ds not in DOMAINS and not any((args.features / ds).glob("*.h5"))]
    if missing:
        ap.error("missing features file(s): " + ", ".join(missing))

    seeds = parse_seeds(args.seeds)
    jobs = [(str(args.features), str(args.output), ds, M, a, s, args.taus, args.heads, args.tol)
            for s in seeds for ds in args.datasets for M in args.clients_per_domain for a in args.alphas]
    todo = [j for j in jobs if not report_path(args.output, j[2], j[3], j[4], j[5]).exists()]
    # the costliest runs first so the pool's last jobs are short
    todo.sort(key=lambda j: (-j[3], j[2] != "digits"))
    print(f"grid: {len(jobs)} runs, {len(jobs) - len(todo)} done already, {len(todo)} to run "
          f"on {args.jobs} workers", flush=True)
    run_jobs(run_one, todo, args.jobs, args.output, _drain, "grid")


def run_jobs(run_one, todo: list, jobs: int, output: Path, drain, label: str) -> None:
    """Run ``run_one`` over ``todo`` in ``jobs`` forked workers (in process when one job or
    one worker), hand the results as they come to ``drain(results, n, log, t0)``, then append
    the grid's wall time to ``output/timing.jsonl`` (also used by examples/dp/run_dp.py)."""
    output.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log = output / "timing.jsonl"
    if jobs > 1 and len(todo) > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(jobs) as pool:
            drain(pool.imap_unordered(run_one, todo), len(todo), log, t0)
    else:
        drain(map(run_one, todo), len(todo), log, t0)
    wall = time.perf_counter() - t0
    with open(log, "a") as f:
        f.write(json.dumps(dict(grid_wall_s=round(wall, 1), runs=len(todo), jobs=jobs,
                                cpus=os.cpu_count())) + "\n")
    print(f"{label}: {len(todo)} runs in {wall:.0f} s wall", flush=True)


def _drain(results, n, log, t0):
    with open(log, "a") as f:
        for i, (job, sec, parts) in enumerate(results, 1):
            _, _, ds, M, a, s, *_ = job
            rec = dict(dataset=ds, M=M, alpha=a, seed=s, seconds=round(sec, 1),
                       parts={k: round(v, 1) for k, v in parts.items()})
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(f"[{i}/{n} {time.perf_counter() - t0:6.0f}s] {ds} M={M} α={a} seed={s}: {sec:.0f}s",
                  flush=True)


if __name__ == "__main__":
    main()

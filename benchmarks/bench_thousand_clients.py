"""The whole SLOT-Align pipeline with many clients: wall time and peak memory of each step.

partition → stats (every client) → barycenter → align (every client's train file with its
map, every domain's test file with its domain map) → evaluate (FedCGS and Fed3R heads on
all aligned client files). Each step runs as one child process (a per-client command runs
all its clients in that process, through the real CLI, one after another) and its wall time
and peak RSS (``os.wait4``) are printed, with the per-client cost and the ratio of each step
to the whole.

Sources: ``--source gen`` generates D domains of labelled Gaussian rows (d features, shifted
and scaled per domain); ``--source DIR`` partitions DIR/*.h5 (e.g.
/work/cache/features/digits: 3 × 1,000 rows at d = 1,280, so at most a few hundred clients
with a handful of rows each).

Usage:
    python benchmarks/bench_thousand_clients.py --source gen --clients 1000 --d 128 --rows 20000
    python benchmarks/bench_thousand_clients.py --source /work/cache/features/digits --clients 300
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DRIVER = """
import json, sys
from typer.testing import CliRunner
from fedalign.cli import app
r = CliRunner()
for args in json.load(open(sys.argv[1])):
    res = r.invoke(app, args)
    if res.exit_code != 0:
        print(" ".join(args), res.output, file=sys.stderr)
        sys.exit(1)
"""


def _child(argv, env):
    """(wall s, peak RSS GiB) of one child process."""
    argv = [str(a) for a in argv]
    t = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
        _, status, ru = os.wait4(p.pid, 0)
        log.seek(0)
        err = log.read().decode(errors="replace")
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv[:6]))} … failed:\n{err[-3000:]}")
    return time.perf_counter() - t, ru.ru_maxrss / 2**20


def _many(commands, work, name, env):
    f = work / f"{name}.json"
    f.write_text(json.dumps([[str(a) for a in c] for c in commands]))
    return _child([sys.executable, "-c", DRIVER, str(f)], env)


def _generate(work, n_domains, rows, d, classes, seed=0):
    from fedalign.files import write_features

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, d)) * 3
    paths = []
    for k in range(n_domains):
        y = rng.integers(0, classes, size=rows)
        A = np.eye(d) + 0.3 * rng.normal(size=(d, d)) / np.sqrt(d)
        X = (centers[y] + rng.normal(size=(rows, d))) @ A + rng.normal(size=d) * 2
        p = work / f"dom{k}.h5"
        write_features(p, X.astype(np.float32), y, [f"{k}_{i}" for i in range(rows)],
                       class_names=[f"c{c}" for c in range(classes)])
        paths.append(p)
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default="gen")
    ap.add_argument("--clients", type=int, default=1000, help="K (split evenly over domains)")
    ap.add_argument("--domains", type=int, default=3)
    ap.add_argument("--rows", type=int, default=20000, help="rows per generated domain")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--work", default=None)
    ap.add_argument("--stats-opts", default="", help="e.g. '--compact' or '--dtype float32'")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="fedalign-k-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    fed = [sys.executable, "-m", "fedalign"]
    if a.source == "gen":
        doms = _generate(work, a.domains, a.rows, a.d, a.classes)
    else:
        doms = sorted(Path(a.source).glob("*.h5"))
    M = max(1, a.clients // len(doms))
    steps = {}
    cl = work / "clients"
    steps["partition"] = _child(fed + ["partition", *doms, "-o", cl, "--alpha", "none",
                                       "--clients-per-domain", M, "--min-client-size", 3,
                                       "--exclude-small-clients"], env)
    trains = sorted(cl.glob("*.train.h5"))
    K = len(trains)
    st = work / "stats"
    st.mkdir(exist_ok=True)
    stats = [st / (p.name.replace(".train.h5", ".stats.npz")) for p in trains]
    steps["stats"] = _many([["stats", p, "-o", s, *a.stats_opts.split()]
                            for p, s in zip(trains, stats)], work, "stats", env)
    ref = work / "ref.npz"
    steps["barycenter"] = _child(fed + ["barycenter", *stats, "-o", ref], env)
    al = work / "aligned"
    al.mkdir(exist_ok=True)
    cmds = [["align", "--tau", "0.5", p, ref, "--stats", s, "-o", al / p.name]
            for p, s in zip(trains, stats)]
    for t in sorted(cl.glob("*.test.h5")):
        dom = t.name.split(".")[0]
        mine = [s for s in stats if s.name.split(".")[0] == dom]
        cmds.append(["align", "--tau", "0.5", t, ref, *[x for s in mine for x in ("--stats", s)],
                     "-o", al / t.name])
    steps["align"] = _many(cmds, work, "align", env)
    steps["evaluate"] = _child(fed + ["evaluate", "--method", "fedcgs", "--method", "fed3r",
                                      "--train", *sorted(al.glob("*.train.h5")),
                                      "--test", *sorted(al.glob("*.test.h5")),
                                      "--json", work / "report.json"], env)
    total = sum(t for t, _ in steps.values())
    d = json.loads((work / "report.json").read_text())
    print(f"K={K} clients over {len(doms)} domains (source {a.source}), work folder {work}")
    print(f"{'step':<11} {'wall s':>8} {'per client ms':>14} {'share':>6} {'peak RSS GiB':>13}")
    for name, (t, rss) in steps.items():
        print(f"{name:<11} {t:8.1f} {1e3 * t / K:14.1f} {t / total:6.0%} {rss:13.2f}")
    print(f"{'total':<11} {total:8.1f} {1e3 * total / K:14.1f}")
    for m, r in d["methods"].items():
        print(f"{m}: macro accuracy {r['summary']['macro']['mean']:.3f}")
    size = sum(s.stat().st_size for s in stats) / K
    print(f"stats file per client: {size / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()

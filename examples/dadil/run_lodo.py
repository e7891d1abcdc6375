"""Leave-one-domain-out reproduction of DeFed-GMM-DaDiL (Montesuma et al., ICASSP 2025).

For every dataset, target domain T and seed s (and fraction m of target classes removed):

0. ``--subsample N`` keeps a stratified N rows per domain (fixed across seeds). No feature
   is standardised: the fedalign preset is scale-free (see ``fedalign.dadil.dictionary``).
1. T is split into a stratified 80 % adaptation part and a 20 % test part (seed s); the test
   part is never used for adaptation. round(m·C) classes (seeded) are removed from the
   adaptation part only.
2. ``--align-to-target`` (on with the ``fedalign`` preset, off with ``reference``): every
   source's rows are first mapped onto the target's Gaussian (the target's mean and
   Ledoit–Wolf covariance of its adaptation part as the reference, τ = 1: the target sends
   (μ_T, Σ_T) once, as in SLOT-Align; ``fedalign stats`` → ``barycenter`` of that one file →
   ``align --tau 1``), and everything below uses the mapped sources except the source-only
   baseline and the peers, which see the sources as they are.
   GMMs (``fedalign.gmm.fit_gmm``, its defaults): every source labeled on all its rows
   (k components per class); the target unlabeled on its adaptation part (C·k components);
   the oracle: the target's adaptation part WITH its labels.
3. Rows, all scored on T's test part by ``fedalign.dadil.evaluation.evaluate_target`` (the one
   evaluation path of ``fedalign evaluate -m dadil`` and ``fedalign dadil-evaluate``), each
   GMM-based row with the linear head (500 samples per class of the barycenter) and MAP:
   source-only (C by leave-one-source-domain-out CV; the same model for every seed, so fitted
   once per target and worker process: :func:`source_only_fit`), oracle labeled-target GMM, centralized
   GMM-DaDiL (``learn_dictionary``, R·E steps), DeFed replacement and DeFed aggregation
   (``fedalign.dadil.simulation.simulate`` in memory: the files of ``fedalign dadil-round``,
   byte for byte, written after the last round),
   every domain one client, R rounds × E local steps, each client from its own random start.
4. Consensus (``--consensus-target``, seed of the first main job): every round kept and
   M(t) computed every ``--consensus-every`` rounds (``fedalign.dadil.consensus``).
5. Envelope (``--envelope``): a federation of the sources only (aggregation); the first
   source's atoms fixed; α_T fitted alone on the full and on the reduced (m = max missing)
   target GMM (``fedalign.dadil.envelope``).

Jobs run in ``--workers`` processes (one BLAS thread each); results go to
OUT/results/<job>.json (existing ones are skipped: resumable). ``make_results.py`` turns them
into RESULTS.md and plots; it reads the protocol from the results themselves.

Several studies in one pool: ``run_lodo.py ARGS… --and ARGS… --and ARGS…`` parses every group
as its own study (its own features, domains and OUT) and runs all their jobs in one pool of
``--workers`` processes, in the order given, so that no worker waits idle between two studies
(the reproduction's Makefile runs Office-Caltech10, Digits and Amazon review so). Every study's
OUT/run_cpu.json then records the pool's wall clock and CPU time, and names the studies that
shared it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np


def parse_list(s, cast=str):
    if s is None or s == "":
        return []
    out = []
    for part in str(s).split(","):
        if "-" in part and cast is int:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(cast(part))
    return out


@functools.lru_cache(maxsize=None)
def load_domain(path: str, subsample: int):
    from fedalign.files import read_features
    from fedalign.partition import stratified_split

    X, y, info = read_features(path)
    if subsample and len(y) > subsample:   # stratified subsample, fixed across seeds
        _, keep = stratified_split(y, subsample / len(y), np.random.default_rng(0))
        X, y = X[np.sort(keep)], y[np.sort(keep)]
    return X.astype(np.float64), y, list(info["class_names"])


@functools.lru_cache(maxsize=None)
def source_only_fit(features: str, subsample: int, domains: tuple, target: str):
    """Source-only's fitted classifier for ``target`` (every other domain, all its rows: the
    same for every seed), fitted once per worker process and target
    (:func:`fedalign.dadil.classifiers.source_only_classifier`), or None where its fit depends
    on the seed (one source)."""
    from fedalign.dadil.classifiers import source_only_classifier
    from fedalign.dadil.evaluation import seed_free_source_only

    sources = [load_domain(str(Path(features) / f"{d}.h5"), subsample)[:2]
               for d in domains if d != target]
    return source_only_classifier(sources) if seed_free_source_only(len(sources)) else None


def split_target(y, C, seed, m):
    """(adaptation rows, test rows, dropped classes) of the target for seed and fraction m."""
    from fedalign.partition import stratified_split

    rng = np.random.default_rng([seed, 17])
    tr, te = stratified_split(y, 0.2, rng)
    n_drop = int(round(m * C))
    dropped = sorted(rng.choice(C, size=n_drop, replace=False).tolist()) if n_drop else []
    return tr[~np.isin(y[tr], dropped)], te, dropped


def _gmm(path: Path, X, y, a, C, seed, names):
    from fedalign.gmm import fit_gmm, load_gmm, save_gmm

    if not path.exists():
        save_gmm(path, fit_gmm(X, y, a.k, n_classes=C, seed=seed, class_names=names))
    return load_gmm(path)


def align_to_target(sources: dict, X_target, n_classes: int, shrinkage="auto") -> tuple:
    """({domain: (X mapped onto the target's reference, y)}, label-shift record).

    The reference: the target's mean and Ledoit–Wolf covariance, completed by the classes its
    rows lack (:func:`fedalign.label_shift.onto_target`: Saerens' EM on an LDA of the
    sources' class statistics; unchanged when no class looks absent); each source's own map
    at τ = 1 (what ``stats --per-class``, ``target-reference`` and ``align --tau 1`` do).
    ``shrinkage`` other than "auto" (``--map-shrinkage``, stop 42's tried variant) replaces
    Ledoit–Wolf in the target's and every source's Gaussian."""
    from fedalign.label_shift import onto_target

    mapped, rec = onto_target(list(sources.values()), X_target, n_classes, shrinkage)
    return {d: (Xm, y) for (d, (_, y)), Xm in zip(sources.items(), mapped)}, rec


def load_all(a) -> dict:
    """{domain: (X, y, class names)} of every domain of the study."""
    return {d: load_domain(str(Path(a.features) / f"{d}.h5"), a.subsample) for d in a.domains}


def job_data(a, data: dict, T: str, seed: int, m: float, C: int) -> tuple:
    """One job's inputs: (X, y of the target, its split (adaptation, test, dropped classes), the
    source names, {source: (X, y)} — mapped onto the target's reference when :func:`aligned` —
    and the label-shift record of that mapping, or None)."""
    X, y, _ = data[T]
    split = split_target(y, C, seed, m)
    sources = [d for d in a.domains if d != T]
    raw = {d: data[d][:2] for d in sources}
    if not aligned(a):
        return X, y, split, sources, raw, None
    src, label_shift = align_to_target(raw, X[split[0]], C, a.map_shrinkage)
    return X, y, split, sources, src, label_shift


def aligned_job_data(a, T: str, seed: int, m: float, C: int) -> tuple:
    """What a tuning script (``tune_head_rule.py``) rebuilds of a job,
    as :func:`run_job` makes it: :func:`job_data` without the label-shift record."""
    return job_data(a, load_all(a), T, seed, m, C)[:5]


def aligned(a) -> bool:
    return a.align_to_target == "on" or (a.align_to_target == "auto" and a.preset == "fedalign")


def init_options(a, seed):
    return dict(n_atoms=a.n_atoms, seed=seed, preset=a.preset)


def run_job(a, job):
    """One (target, seed, m) job → its result dict."""
    from fedalign.dadil import (PRESETS, Optim, consensus_history, evaluate_target, limit_threads,
                                load_state, simulate)

    limit_threads(1)
    started = time.time()
    T, seed, m, kind = job["target"], job["seed"], job["missing"], job["kind"]
    out = Path(a.out)
    data = load_all(a)
    names = data[a.domains[0]][2]
    C = len(names) or int(max(v[1].max() for v in data.values())) + 1
    gdir = out / "gmms" / f"s{seed}"
    gdir.mkdir(parents=True, exist_ok=True)
    tag = f"m{int(round(100 * m)):02d}"
    # the sources moved onto the target's Gaussian (its adaptation rows) when aligned(a)
    X, y, (tr, te, dropped), sources, src, label_shift = job_data(a, data, T, seed, m, C)
    gname = f"{{}}.to_{T}_{tag}.labeled.gmm.npz" if aligned(a) else "{}.labeled.gmm.npz"
    raw = {d: data[d][:2] for d in sources}     # as they are: source-only and the peers
    src_gmm = {d: _gmm(gdir / gname.format(d), *src[d], a, C, seed, names) for d in sources}
    tgt_path = gdir / f"{T}.target_{tag}.gmm.npz"
    tgt = _gmm(tgt_path, X[tr], None, a, C, seed, names)
    res = dict(job=job, target=T, seed=seed, missing=m, dropped_classes=dropped,
               n_adapt=int(len(tr)), n_test=int(len(te)), time={}, n_classes=C,
               protocol=dict(vars(a), preset_settings=PRESETS[a.preset]),
               label_shift=label_shift)
    t_all = time.perf_counter()
    states, alpha_traj, consensus = {}, {}, {}
    if kind in ("main", "missing"):
        gp = {d: gdir / gname.format(d) for d in sources}
        gp[T] = tgt_path
        keep = job.get("consensus", False)
        for strat in ("replacement", "aggregation"):
            fed = out / "fed" / f"{T}_s{seed}_{tag}_{strat}"
            t0 = time.perf_counter()
            st = simulate(gp, fed, a.rounds, strat, a.local_steps, keep_history=keep,
                          in_memory=True, **init_options(a, seed))
            res["time"][f"DeFed {strat}"] = time.perf_counter() - t0
            states[f"DeFed {strat}"] = load_state(fed / "state" / f"{T}.state.npz")
            if a.keep_states:
                (out / "states").mkdir(exist_ok=True)
                shutil.copyfile(fed / "state" / f"{T}.state.npz",
                                out / "states" / f"{job['name']}_{strat}.state.npz")
            alpha_traj[strat] = [h.get("alpha_received", h["alpha"][-1]) for h in st[T].history]
            res.setdefault("source_alpha", {})[strat] = {d: st[d].alpha.tolist() for d in sources}
            res.setdefault("target_loss", {})[strat] = [st[T].history[0]["losses"][0],
                                                        st[T].history[-1]["losses"][-1]]
            if keep:
                t0 = time.perf_counter()
                h = consensus_history([fed], a.consensus_weights, 0, a.consensus_every)
                consensus[strat] = dict(rounds=h["rounds"].tolist(), mean=h["mean"].tolist(),
                                        max=h["max"].tolist())
                res["time"][f"consensus {strat}"] = time.perf_counter() - t0
            shutil.rmtree(fed, ignore_errors=True)
    kw = {}
    if kind == "main":
        pre = PRESETS[a.preset]
        Xl, yl, _ = data[T]
        oracle = _gmm(gdir / f"{T}.oracle.gmm.npz", Xl[tr], yl[tr], a, C, seed, names)
        kw = dict(sources=[raw[d] for d in sources], oracle_gmm=oracle,
                  source_only=source_only_fit(a.features, a.subsample, tuple(a.domains), T),
                  source_gmms=[src_gmm[d] for d in sources], target_gmm=tgt,
                  dictionary_kwargs=dict(n_atoms=a.n_atoms, n_iter=a.rounds * a.local_steps,
                                         init=pre["init"], var_floor_rel=pre["var_floor_rel"],
                                         optim=Optim(pre["optimizer"], pre["lr"],
                                                     pre["alpha_rule"], pre["lr_alpha"],
                                                     pre["min_var"] or 1e-6)))
    if kind in ("main", "missing"):
        t0 = time.perf_counter()
        if a.heads:
            kw["classifiers"] = a.heads.split(",")
        r = evaluate_target(X[te], y[te], n_classes=C, domain=T, seeds=[seed], states=states,
                            n_per_class=a.n_per_class, target_adapt=X[tr],
                            head_sources=[src[d] for d in sources],
                            head_source_gmms=[src_gmm[d] for d in sources],
                            cem_iter=a.cem_iter, **kw)
        res["time"]["evaluate"] = time.perf_counter() - t0
        if kind == "main" and a.peers:  # the shallow DA peers, on the sources as they are
            from fedalign.peers import add_peer_rows, evaluate_peers

            t0 = time.perf_counter()
            add_peer_rows(r, evaluate_peers([raw[d] for d in sources], X[tr], X[te], y[te],
                                            C=r.records["source-only"]["C"], seeds=[seed],
                                            y_adapt=y[tr]))
            res["time"]["peers"] = time.perf_counter() - t0
        res["result"] = r.to_json()
        res["alpha_trajectory"] = alpha_traj
        res["consensus"] = consensus
    if kind == "envelope":
        res["envelope"] = envelope_job(a, job, data, sources, src_gmm, gdir, X, y, tr, te, C,
                                       names, seed, gname)
    res["time"]["total"] = time.perf_counter() - t_all
    res["started_epoch"] = started
    return res


def envelope_job(a, job, data, sources, src_gmm, gdir, X, y, tr, te, C, names, seed, gname):
    from fedalign.dadil import envelope_study, load_dictionary, simulate

    out = Path(a.out)
    fed = out / "fed" / f"envelope_{job['target']}_s{seed}"
    gp = {d: gdir / gname.format(d) for d in sources}
    simulate(gp, fed, a.rounds, "aggregation", a.local_steps, keep_history=False,
             in_memory=True, **init_options(a, seed))
    atoms, _ = load_dictionary(fed / f"round_{a.rounds:03d}" / f"{sources[0]}.atoms.npz")
    m = max(a.missing)
    tr_r, _, dropped = split_target(y, C, seed, m)
    full = _gmm(gdir / f"{job['target']}.target_m00.gmm.npz", X[tr], None, a, C, seed, names)
    red = _gmm(gdir / f"{job['target']}.target_m{int(round(100 * m)):02d}.gmm.npz", X[tr_r],
               None, a, C, seed, names)
    rep = envelope_study(atoms, {"full": full, f"reduced (m={m:g})": red}, X[te], y[te],
                         seeds=(seed,), n_per_class=a.n_per_class)
    shutil.rmtree(fed, ignore_errors=True)
    return dict(report=rep, atoms_of=sources[0], dropped_classes=dropped)


def jobs_for(a):
    jobs = []
    for seed in a.seeds:
        for T in a.targets:
            jobs.append(dict(kind="main", target=T, seed=seed, missing=0.0,
                             consensus=(T == a.consensus_target and seed == a.seeds[0])))
    for seed in a.missing_seeds:
        for T in a.missing_targets:
            for m in a.missing:
                if m > 0:
                    jobs.append(dict(kind="missing", target=T, seed=seed, missing=m))
    if a.envelope:
        for seed in a.missing_seeds:
            for T in a.missing_targets:
                jobs.append(dict(kind="envelope", target=T, seed=seed, missing=0.0))
    for j in jobs:
        j["name"] = f"{j['kind']}_{j['target']}_s{j['seed']}_m{int(round(100 * j['missing'])):02d}"
    # consensus jobs and main jobs first (longest), then the rest
    return sorted(jobs, key=lambda j: (not j.get("consensus"), j["kind"] != "main"))


def _jsonable(o):
    import dataclasses

    if dataclasses.is_dataclass(o):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(o).items()}
    if hasattr(o, "tolist"):
        return o.tolist()
    return o if isinstance(o, (int, float, str, list, dict, type(None))) else str(o)


def _worker_init():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fedalign.threads import limit_threads

    limit_threads(1)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Several studies in one pool of workers: ARGS --and ARGS --and ARGS "
               "(module docstring).")
    ap.add_argument("--features", required=True, help="folder with <domain>.h5")
    ap.add_argument("--domains", required=True, help="comma list")
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets", default=None, help="comma list (default: all domains)")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--local-steps", type=int, default=3)
    ap.add_argument("--n-atoms", type=int, default=3)
    ap.add_argument("--k", type=int, default=5, help="components per class")
    ap.add_argument("--preset", default="fedalign")
    ap.add_argument("--align-to-target", default="auto", choices=("auto", "on", "off"),
                    help="map the sources onto the target's Gaussian first (auto: with the "
                         "fedalign preset)")
    ap.add_argument("--map-shrinkage", default="auto",
                    help="covariance shrinkage of the Gaussians of the map onto the target's "
                         "(auto: Ledoit-Wolf; or a value in [0, 1])")
    ap.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                    help="the shallow DA peers of fedalign.peers in every main job (needs skada)")
    ap.add_argument("--heads", default="", help="heads of the GMM rows (default: linear,map,lda)")
    ap.add_argument("--n-per-class", type=int, default=500)
    ap.add_argument("--subsample", type=int, default=0)
    ap.add_argument("--missing", default="0,0.15,0.3,0.45")
    ap.add_argument("--missing-targets", default="", help="comma list (empty: no missing study)")
    ap.add_argument("--missing-seeds", default="0-2")
    ap.add_argument("--envelope", action="store_true")
    ap.add_argument("--consensus-target", default=None)
    ap.add_argument("--consensus-every", type=int, default=5)
    ap.add_argument("--consensus-weights", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep-states", action="store_true",
                    help="copy the target's final states to OUT/states/ (for pictures)")
    from fedalign.defaults import CEM_ITER

    ap.add_argument("--cem-iter", type=int, default=CEM_ITER,
                    help="relabelings of the lda head by classification EM (the library's "
                         f"default, {CEM_ITER}: one pass; stop 40's variant run: 10)")
    return ap


def parse_study(ap, argv):
    a = ap.parse_args(argv)
    a.domains = parse_list(a.domains)
    a.targets = parse_list(a.targets) or a.domains
    a.seeds = parse_list(a.seeds, int)
    a.missing = parse_list(a.missing, float)
    a.missing_targets = parse_list(a.missing_targets)
    a.missing_seeds = parse_list(a.missing_seeds, int)
    missing = [str(Path(a.features) / f"{d}.h5") for d in a.domains
               if not (Path(a.features) / f"{d}.h5").is_file()]
    if missing:
        ap.error("missing features file(s): " + ", ".join(missing))
    from fedalign.errors import FedalignError
    from fedalign.grammar import parse_shrinkage

    try:
        a.map_shrinkage = parse_shrinkage(a.map_shrinkage, "--map-shrinkage")
    except FedalignError as e:
        ap.error(str(e))
    if a.cem_iter < 0:
        ap.error(f"--cem-iter must be >= 0, got {a.cem_iter}")
    return a


def split_groups(argv) -> list:
    """argv split at every ``--and``: one argument list per study."""
    groups, cur = [], []
    for tok in argv:
        if tok == "--and":
            groups.append(cur)
            cur = []
        else:
            cur.append(tok)
    return groups + [cur]


def main(argv=None):
    import sys

    ap = parser()
    studies = [parse_study(ap, g) for g in split_groups(sys.argv[1:] if argv is None else argv)]
    outs = [str(Path(a.out).resolve()) for a in studies]
    if len(set(outs)) != len(outs):
        ap.error("two studies write to the same --out")
    workers = studies[0].workers
    if any(a.workers != workers for a in studies):
        ap.error("the studies of one pool must agree on --workers")
    todo = []
    for a in studies:
        (Path(a.out) / "results").mkdir(parents=True, exist_ok=True)
        todo += [(a, j) for j in jobs_for(a)
                 if not (Path(a.out) / "results" / f"{j['name']}.json").exists()]
    t0, e0, load0 = time.perf_counter(), time.time(), os.getloadavg()[0]
    print(f"{len(todo)} jobs of {len(studies)} stud{'y' if len(studies) == 1 else 'ies'} on "
          f"{workers} workers → " + ", ".join(str(Path(a.out) / "results") for a in studies),
          flush=True)
    with ProcessPoolExecutor(max_workers=workers, initializer=_worker_init) as ex:
        futs = {ex.submit(run_job, a, j): (a, j) for a, j in todo}
        for k, f in enumerate(as_completed(futs), 1):
            a, j = futs[f]
            res = f.result()
            res["wall_clock_s"] = time.perf_counter() - t0
            res["started_s"] = res.pop("started_epoch") - e0
            path = Path(a.out) / "results" / f"{j['name']}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(res, indent=1, default=_jsonable))
            tmp.replace(path)
            summ = res.get("result", {}).get("summary", {})
            accs = ", ".join(f"{n} {100 * v['mean']:.1f}" for n, v in summ.items() if "map" not in n)
            print(f"[{k}/{len(todo)} {time.perf_counter() - t0:.0f}s] "
                  f"{Path(a.out).name}/{j['name']}: {accs} ({res['time']['total']:.0f}s)",
                  flush=True)
    wall = time.perf_counter() - t0
    print(f"done in {wall:.0f}s", flush=True)
    names = [Path(a.out).name for a in studies]
    for a in studies:
        write_cpu_record(Path(a.out), wall, load0, shared_with=names if len(names) > 1 else None)


def write_cpu_record(out: Path, wall: float, load0: float, shared_with=None) -> None:
    """OUT/run_cpu.json: the worker processes' CPU seconds (getrusage of the joined children),
    the wall clock and the 1-minute load average at start and end: the CPU time, not the wall
    clock, is what a quiet machine would need when other jobs share the cores. With several
    studies in one pool (``shared_with``: their OUT names) both are the whole pool's."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = dict(cpu_s=ru.ru_utime + ru.ru_stime, wall_s=wall, load_start=load0,
               load_end=os.getloadavg()[0], cores=os.cpu_count())
    if shared_with:
        rec["shared_pool"] = list(shared_with)
    (out / "run_cpu.json").write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()

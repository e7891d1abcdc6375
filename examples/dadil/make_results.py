"""Collect run_lodo.py results into RESULTS.md and the consensus plot.

Usage: python make_results.py RUNS_DIR OUT_DIR [--log run_all.log]
(RUNS_DIR/<dataset>/results/*.json). Every protocol statement below is read from the results
themselves (their ``protocol`` record, seeds, targets, dropped classes), not written by hand.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

NAMES = {"office_caltech10": "Office-Caltech10", "digits": "Digits", "amazon_review": "Amazon review"}
#: Rows in table order when present; every other (method, head) of the results follows in the
#: order the results list them (the peers of ``fedalign.peers``, ...).
_HEADS = ("linear", "map", "lda", "auto")
ROWS = [("source-only", "logreg")] + [(m, h) for m in ("oracle", "centralized", "DeFed replacement",
                                                        "DeFed aggregation") for h in _HEADS]
DEFED = [r for r in ROWS if r[0].startswith("DeFed")]
LABELS = {"source-only": "source-only (C by leave-one-source-out CV)",
          "oracle": "oracle: labeled-target GMM", "centralized": "centralized GMM-DaDiL"}


def pm(v):
    v = 100 * np.asarray(v, dtype=float)
    return f"{v.mean():.1f} ± {v.std():.1f}" if len(v) > 1 else f"{v.mean():.1f}"


def load(runs: Path) -> dict:
    out = {}
    known = [d for d in NAMES if (runs / d).is_dir()]
    others = sorted(p.name for p in runs.iterdir() if p.is_dir() and p.name not in NAMES)
    for ds in known + others:
        files = sorted((runs / ds / "results").glob("*.json"))
        if files:
            out[ds] = [json.loads(f.read_text()) for f in files]
            NAMES.setdefault(ds, ds)
    return out


def acc_of(r, method, head):
    v = r.get("result", {}).get("accuracy", {}).get(method, {}).get(head, [None])[0]
    return None if v is None or not np.isfinite(v) else v


def rows_of(res) -> list:
    """(method, head) rows of the results: :data:`ROWS` first, then the others in order."""
    seen = []
    for r in res:
        for m, heads in r.get("result", {}).get("accuracy", {}).items():
            for h in heads:
                if (m, h) not in seen:
                    seen.append((m, h))
    return [x for x in ROWS if x in seen] + [x for x in seen if x not in ROWS]


def failures(res) -> list:
    """'row on target seed s: reason' of every peer that failed (records with ``failed``)."""
    out = []
    for r in res:
        for m, rec in r.get("result", {}).get("records", {}).items():
            if isinstance(rec, dict) and rec.get("failed"):
                out.append(f"{m} on {r['target']} seed {r['seed']}: {rec['failed']}")
    return out


def main_table(res):
    main = [r for r in res if r["job"]["kind"] == "main"]
    targets = sorted({r["target"] for r in main})
    seeds = sorted({r["seed"] for r in main})
    lines = ["| method | head | " + " | ".join(targets) + " | average |",
             "|---|---|" + "---|" * (len(targets) + 1)]
    avgs = {}
    for m, h in rows_of(main):
        cells, per_seed = [], defaultdict(list)
        for t in targets:
            v = [acc_of(r, m, h) for r in main if r["target"] == t]
            v = [x for x in v if x is not None]
            cells.append(pm(v) if v else ("failed" if any(r["target"] == t for r in main) else "—"))
            for r in main:
                if r["target"] == t and acc_of(r, m, h) is not None:
                    per_seed[r["seed"]].append(acc_of(r, m, h))
        full = [np.mean(v) for s, v in sorted(per_seed.items()) if len(v) == len(targets)]
        if not full:
            if any(c != "—" for c in cells):
                lines.append(f"| {LABELS.get(m, m)} | {h} | " + " | ".join(cells) + " | — |")
            continue
        avgs[(m, h)] = float(np.mean(full))
        lines.append(f"| {LABELS.get(m, m)} | {h} | " + " | ".join(cells) + f" | **{pm(full)}** |")
    return "\n".join(lines), targets, seeds, avgs


def missing_table(res):
    mt = sorted({r["target"] for r in res if r["job"]["kind"] == "missing"})
    if not mt:
        return None, [], []
    ms_seeds = sorted({r["seed"] for r in res if r["job"]["kind"] == "missing"})
    rows = [r for r in res if r["target"] in mt and r["seed"] in ms_seeds
            and r["job"]["kind"] in ("main", "missing")]
    fracs = sorted({r["missing"] for r in rows})
    lines = ["| method | head | " + " | ".join(f"{100 * m:.0f} % removed" for m in fracs)
             + " | loss 0 → max |", "|---|---|" + "---|" * (len(fracs) + 1)]
    for m, h in DEFED:
        vals = []
        for f in fracs:
            per_seed = defaultdict(list)
            for r in rows:
                if abs(r["missing"] - f) < 1e-9 and acc_of(r, m, h) is not None:
                    per_seed[r["seed"]].append(acc_of(r, m, h))
            vals.append([np.mean(v) for v in per_seed.values() if len(v) == len(mt)])
        if not all(vals):
            continue
        drop = 100 * (np.mean(vals[0]) - np.mean(vals[-1]))
        lines.append(f"| {m} | {h} | " + " | ".join(pm(v) for v in vals) + f" | {drop:+.1f} |")
    return "\n".join(lines), mt, ms_seeds


def dropped_list(res):
    out = []
    for r in sorted(res, key=lambda r: (r["target"], r["seed"], r["missing"])):
        if r["job"]["kind"] == "missing":
            out.append(f"{r['target']} s{r['seed']} {100 * r['missing']:.0f} %: {r['dropped_classes']}")
    return out


def envelope_table(res):
    env = [r for r in res if r["job"]["kind"] == "envelope"]
    if not env:
        return None
    lines = ["| target | seed | atoms of | target GMM | α_T | MW2² | linear | map |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(env, key=lambda r: (r["target"], r["seed"])):
        rep = r["envelope"]["report"]
        for name, row in rep.get("targets", rep).items() if isinstance(rep, dict) else []:
            if not isinstance(row, dict) or "alpha" not in row:
                continue
            acc = row.get("accuracy", {})
            get = (lambda h: pm([acc[h]["mean"]]) if isinstance(acc.get(h), dict) and "mean" in acc[h]
                   else (pm(acc[h]) if h in acc else "—"))
            lines.append(f"| {r['target']} | {r['seed']} | {r['envelope']['atoms_of']} | {name} | "
                         f"({', '.join(f'{a:.2f}' for a in row['alpha'])}) | "
                         f"{row.get('loss', row.get('mw2', float('nan'))):.4g} | {get('linear')} | {get('map')} |")
    return "\n".join(lines)


def alpha_summary(res):
    """Final α_T per target (seed-averaged) and the largest L1 distance between two targets."""
    main = [r for r in res if r["job"]["kind"] == "main"]
    out = {}
    for strat in ("replacement", "aggregation"):
        per_t = defaultdict(list)
        for r in main:
            tr = r.get("alpha_trajectory", {}).get(strat)
            if tr:
                per_t[r["target"]].append((r["seed"], np.asarray(tr[-1])))
        # compare targets seed by seed (α lives in each federation's own dictionary)
        dists = []
        seeds = sorted({s for v in per_t.values() for s, _ in v})
        for s in seeds:
            al = {t: a for t, v in per_t.items() for ss, a in v if ss == s}
            ts = sorted(al)
            dists += [np.abs(al[a] - al[b]).sum() for i, a in enumerate(ts) for b in ts[i + 1:]]
        seed0 = {t: a for t, v in per_t.items() for s, a in v if s == seeds[0]} if seeds else {}
        out[strat] = dict(max_l1=float(max(dists)) if dists else None,
                          mean_l1=float(np.mean(dists)) if dists else None,
                          seed0={t: [round(float(x), 3) for x in a] for t, a in sorted(seed0.items())})
    return out


#: The targets this reproduction is held to (issue 26, "Done when"), per benchmark: the
#: default head's DeFed rows (both strategies) against source-only and the best skada peer.
#: Each: (label, compared row, offset in points, reference row or "best skada peer").
HEAD = "auto"
SKADA = ("coral", "sa", "linear-ot")
GOALS = {
    "amazon_review": [("≥ source-only + 2.5", ("source-only", "logreg"), 2.5),
                      ("≥ best skada peer − 1.0", "best skada peer", -1.0)],
    "digits": [("≥ source-only + 3.0", ("source-only", "logreg"), 3.0)],
    "office_caltech10": [("≥ source-only − 0.3", ("source-only", "logreg"), -0.3)],
}
#: Missing-class study: largest loss (points) from 0 % removed to the largest fraction.
MISSING_LOSS_MAX = 3.0
#: Consensus: M(R)/M(0) at most this, per strategy.
CONSENSUS_MAX = {"aggregation": 0.3, "replacement": 0.6}
#: Whole reproduction, wall clock, minutes.
WALL_MAX_MIN = 35.0


def per_seed_average(res, method, head, kind="main", missing=0.0) -> dict:
    """{seed: mean accuracy over targets} of one row, seeds where every target has it."""
    jobs = [r for r in res if r["job"]["kind"] == kind and abs(r["missing"] - missing) < 1e-9]
    targets = {r["target"] for r in jobs}
    per = defaultdict(list)
    for r in jobs:
        v = acc_of(r, method, head)
        if v is not None:
            per[r["seed"]].append(v)
    return {s: float(np.mean(v)) for s, v in per.items() if len(v) == len(targets)}


def missing_loss(res, method, head) -> tuple:
    """The missing-class study's loss of one row: ({seed: accuracy with nothing removed −
    accuracy at the largest fraction removed}, that fraction, the study's targets), over the
    study's targets and seeds; ({}, None, []) without the study or the row."""
    fracs = sorted({r["missing"] for r in res if r["job"]["kind"] == "missing"})
    if not fracs:
        return {}, None, []
    mt = sorted({r["target"] for r in res if r["job"]["kind"] == "missing"})
    ms = {r["seed"] for r in res if r["job"]["kind"] == "missing"}
    sub = [r for r in res if r["target"] in mt and r["seed"] in ms]
    full = per_seed_average(sub, method, head)
    last = per_seed_average(sub, method, head, "missing", fracs[-1])
    return {s: full[s] - last[s] for s in sorted(set(full) & set(last))}, fracs[-1], mt


def paired(a: dict, b: dict, offset: float = 0.0) -> tuple:
    """(mean of a − b − offset, its standard error over the common seeds, n) in points."""
    seeds = sorted(set(a) & set(b))
    d = np.array([100 * (a[s] - b[s]) for s in seeds]) - offset
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
    return float(d.mean()), se, len(d)


def _verdict(margin: float, se: float) -> str:
    if margin >= 0:
        return "met"
    return f"**not met** ({'within' if np.isfinite(se) and -margin <= se else 'beyond'} one SE)"


#: The row groups of :func:`goals_table`.
GOAL_PARTS = ("accuracy", "missing", "consensus")


def goals_table(data: dict, timing: dict, parts=GOAL_PARTS) -> str:
    """The issue's targets, each with its margin (≥ 0: met) and the paired standard error over
    seeds, generated from the runs: the row groups in ``parts`` (:data:`GOAL_PARTS`), and the
    whole run's time when ``timing`` has it."""
    lines = ["| benchmark | target | row | value | margin (points) ± SE over seeds | verdict |",
             "|---|---|---|---|---|---|"]
    for ds, goals in GOALS.items() if "accuracy" in parts else ():
        res = data.get(ds)
        if not res:
            continue
        for strat in ("DeFed replacement", "DeFed aggregation"):
            mine = per_seed_average(res, strat, HEAD)
            if not mine:
                continue
            for label, ref, offset in goals:
                if ref == "best skada peer":
                    avg = {p: per_seed_average(res, p, "logreg") for p in SKADA}
                    avg = {p: v for p, v in avg.items() if v}
                    if not avg:
                        continue
                    p = max(avg, key=lambda k: np.mean(list(avg[k].values())))
                    other, name = avg[p], f"{label} ({p} {100 * np.mean(list(avg[p].values())):.2f})"
                else:
                    other = per_seed_average(res, *ref)
                    name = f"{label} ({100 * np.mean(list(other.values())):.2f})"
                m, se, n = paired(mine, other, offset)
                lines.append(f"| {NAMES[ds]} | {name} | {strat} ({HEAD}) | "
                             f"{100 * np.mean(list(mine.values())):.2f} | {m:+.2f} ± {se:.2f} "
                             f"(n = {n}) | {_verdict(m, se)} |")
    for ds, res in data.items():
        for strat in ("DeFed replacement", "DeFed aggregation") if "missing" in parts else ():
            for head in (HEAD, "lda"):
                per_seed, frac, mt = missing_loss(res, strat, head)
                if not per_seed:
                    continue
                loss, se, n = paired(per_seed, dict.fromkeys(per_seed, 0.0))
                m = MISSING_LOSS_MAX - loss
                lines.append(f"| {NAMES[ds]} | missing classes: loss 0 → {100 * frac:.0f} % "
                             f"≤ {MISSING_LOSS_MAX:g} ({', '.join(mt)}) | {strat} ({head}) | "
                             f"loss {loss:+.2f} | {m:+.2f} ± {se:.2f} (n = {n}) | "
                             f"{_verdict(m, se)} |")
        for r in res if "consensus" in parts else ():
            for strat, c in (r.get("consensus") or {}).items():
                ratio = c["max"][-1] / c["max"][0]
                lim = CONSENSUS_MAX.get(strat)
                if lim is not None:
                    lines.append(f"| {NAMES[ds]} | consensus M({c['rounds'][-1]})/M(0) ≤ {lim:g} "
                                 f"(target {r['target']}, seed {r['seed']}) | DeFed {strat} | "
                                 f"{ratio:.2f} | {lim - ratio:+.2f} | "
                                 f"{'met' if ratio <= lim else '**not met**'} |")
    shared = [t for t in timing.values() if t.get("pool_wall")]
    if shared:
        wall = shared[0]["pool_wall"] / 60
        lines.append(f"| all | whole reproduction ≤ {WALL_MAX_MIN:g} min (2 cores) | — | "
                     f"{wall:.1f} min | {WALL_MAX_MIN - wall:+.1f} min | "
                     f"{'met' if wall <= WALL_MAX_MIN else '**not met**'} |")
    return "\n".join(lines)


def plot_consensus(data, out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    curves = [(ds, r) for ds, res in data.items() for r in res if r.get("consensus")]
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 3.6), squeeze=False)
    for ax, (ds, r) in zip(axes[0], curves):
        for strat, c in r["consensus"].items():
            ax.plot(c["rounds"], c["max"], marker="o", ms=3, label=f"{strat} (max over pairs)")
            ax.plot(c["rounds"], c["mean"], ls="--", alpha=0.7, label=f"{strat} (mean)")
        ax.set_title(f"{NAMES[ds]}, target {r['target']}, seed {r['seed']}")
        ax.set_xlabel("round")
        ax.set_ylabel("M(t): max W2 between clients' barycenters")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def auto_choices(res) -> str:
    """One protocol line: which head the ``auto`` rule chose, per target, over the main jobs."""
    got = {}
    for r in res:
        rule = r.get("result", {}).get("records", {}).get("lda head", {}).get("head_rule")
        if r["job"]["kind"] == "main" and rule:
            got.setdefault(r["target"], []).append(rule["choice"])
    if not got:
        return ""
    parts = [f"{t} " + ", ".join(f"`{h}` {c.count(h)}/{len(c)}" for h in sorted(set(c)))
             for t, c in sorted(got.items())]
    return "- The `auto` rule chose (main jobs): " + "; ".join(parts) + ".\n"


def cem_max(res) -> int:
    """The largest ``cem_iter`` the results' ``lda`` heads ran with (0 in results without the
    record: the one-pass head)."""
    return max([c.get("max_iter", 0) for r in res
                for c in r.get("result", {}).get("records", {}).get("lda head", {}).get(
                    "classification_em", {}).values()] or [0])


def cem_summary(res) -> str:
    """One protocol line: the ``lda`` head's classification EM over the DeFed rows of every job
    (relabelings, rows changed by the first, convergence)."""
    its, first, conv, n = [], [], 0, 0
    for r in res:
        recs = r.get("result", {}).get("records", {}).get("lda head", {}).get(
            "classification_em", {})
        for name, c in recs.items():
            if name.startswith("DeFed"):
                n += 1
                its.append(c["iterations"])
                conv += bool(c["converged"])
                first.append(c["changed"][0] / max(1, sum(c["label_counts"])) if c["changed"]
                             else 0.0)
    if not n:
        return ""
    if max(its) == 0 and cem_max(res) == 0:
        return "- The `lda` head: one pass (MAP pseudo-labels, no classification EM: `cem_iter = 0`).\n"
    return (f"- Classification EM of the `lda` head (DeFed rows, every job): {np.mean(its):.1f} "
            f"relabelings on average (max {max(its)}), converged in {conv}/{n}; the first "
            f"relabeling changed {100 * np.mean(first):.1f} % of the target's pseudo-labels on "
            f"average.\n")


def absent_classes(res) -> str:
    """What the label-shift EM found: main jobs (nothing removed) that flagged a class, and
    per missing-class job how many of the removed classes it found (and false alarms)."""
    recs = [(r, r.get("label_shift")) for r in res if r["job"]["kind"] in ("main", "missing")]
    recs = [(r, ls) for r, ls in recs if ls is not None]
    if not recs:
        return ""
    main = [(r, ls) for r, ls in recs if r["job"]["kind"] == "main"]
    flagged = [f"{r['target']} s{r['seed']}: {ls['absent']}" for r, ls in main if ls["absent"]]
    miss = [(r, ls) for r, ls in recs if r["job"]["kind"] == "missing"]
    hit = sum(len(set(ls["absent"]) & set(r["dropped_classes"])) for r, ls in miss)
    total = sum(len(r["dropped_classes"]) for r, _ in miss)
    false = sum(len(set(ls["absent"]) - set(r["dropped_classes"])) for r, ls in miss)
    out = (f"- Classes found absent by the label-shift EM: main jobs (nothing removed) "
           f"{len(flagged)}/{len(main)} flagged any" + (f" ({'; '.join(flagged)})" if flagged else "")
           )
    if miss:
        out += (f"; missing-class jobs: {hit} of the {total} removed classes found, "
                f"{false} present classes flagged")
    return out + ".\n"


def protocol(res, ds, seeds, targets, timing):
    p = res[0]["protocol"]
    pre = p["preset_settings"]
    sub = f"a stratified {p['subsample']} rows per domain (fixed across seeds)" if p["subsample"] \
        else "all rows"
    t = timing.get(ds)
    rows = {r["target"]: r["n_adapt"] + r["n_test"] for r in res if r["job"]["kind"] == "main"}
    return (f"- Data: {sub} of the features files given ({', '.join(f'{d} {n}' for d, n in sorted(rows.items()))} "
            f"rows); domains {', '.join(p['domains'])}; C = {res[0]['n_classes']}.\n"
            f"- Leave-one-domain-out over targets {', '.join(targets)}; seeds {', '.join(map(str, seeds))}; "
            f"the target's stratified 20 % test split (seeded) is never used for adaptation "
            f"({res[0]['n_adapt']}/{res[0]['n_test']} adaptation/test rows for {res[0]['target']}).\n"
            f"- GMMs: k = {p['k']} components per class (sources labeled, all rows; target unlabeled "
            f"C·k components on its adaptation part; oracle: the same part with its labels), "
            f"variance floor 1 % of each dimension's variance.\n"
            f"- DeFed: every domain one client, R = {p['rounds']} rounds × E = {p['local_steps']} local "
            f"steps, A = {p['n_atoms']} atoms, preset `{p['preset']}` ({', '.join(f'{k}={v}' for k, v in pre.items())}); "
            f"every client from its own seeded start. Centralized GMM-DaDiL: R·E = "
            f"{p['rounds'] * p['local_steps']} steps of the same optimiser.\n"
            + (f"- Sources mapped onto the target's Gaussian first (mean and Ledoit–Wolf covariance "
               f"of its adaptation rows, completed by the classes the target lacks: "
               f"`fedalign.label_shift`, `fedalign target-reference`; τ = 1) for the GMMs, the "
               f"dictionary and the `lda` head; source-only and the peers (`slot-to-target` "
               f"included) see the sources as they are.\n"
               if p.get("align_to_target") == "on" or (p.get("align_to_target") == "auto"
                                                       and p["preset"] == "fedalign") else "")
            + f"- Heads: `linear` = logistic regression on {p['n_per_class']} samples per class of the "
            f"barycenter; `map` = the GMM's MAP rule; `lda` = the target's adaptation rows "
            f"pseudo-labeled by the barycenter's MAP rule"
            + (f", the labels refined by classification EM (the LDA relabels the rows until "
               f"they stop changing, ≤ {cem_max(res)} times; `fedalign.dadil.classification_em`)"
               if cem_max(res) else "")
            + f", an LDA of their and the sources' class "
            f"statistics, its shrinkage chosen by leave-one-source-domain-out on the sources; "
            f"`auto` = `lda` or `linear`, chosen per target and seed by leave-one-source-domain-out "
            f"(each source plays the target: a labeled GMM of half its rows as the barycenter, "
            f"with its own labels and with labels from the other sources' LDA, both heads scored "
            f"on the other half and averaged over the two, `lda` as its one-pass head; "
            f"`fedalign.dadil.target_head.choose_head`). "
            f"Source-only: standardised logistic "
            f"regression on the pooled sources, C from a fixed grid by leave-one-source-domain-out CV.\n"
            + auto_choices(res) + cem_summary(res) + absent_classes(res)
            + (f"- Run time: {t['wall']:.0f} s wall clock on {p['workers']} worker processes "
               f"({t['cpu']:.0f} s of job time"
               + ("; from its first job's start to its last job's end, in a pool shared with "
                  + ", ".join(NAMES.get(o, o) for o in t["shared_pool"] if o != ds)
                  if t.get("shared_pool") else "") + ").\n" if t else "")
            + (f"- Process CPU time: {t['proc_cpu']:.0f} s ({t['proc_cpu'] / 60 / p['workers']:.1f} "
               f"min on {p['workers']} cores if nothing else runs)"
               + (f"; load average {t['load_start']:.1f} at the start, {t['load_end']:.1f} at "
                  "the end" if t.get("load_start") is not None else "")
               + (f" ({t['note']})" if t.get("note") else "") + ".\n"
               if t and "proc_cpu" in t and not t.get("shared_pool") else ""))


def study_timing(res) -> dict:
    """wall: from the study's first job's start to its last job's end (``started_s``; older
    results: from the pool's start); cpu: the sum of its jobs' times."""
    end = max(r["wall_clock_s"] for r in res)
    start = min((r.get("started_s", 0.0) for r in res), default=0.0)
    return dict(wall=end - max(start, 0.0), cpu=sum(r["time"]["total"] for r in res))


def whole_run(timing: dict) -> str:
    """The whole reproduction's line: one pool shared by every study (its wall clock and CPU
    once), or the studies one after the other (their sums)."""
    names = ", ".join(NAMES[ds] for ds in timing)
    shared = [t for t in timing.values() if set(t.get("shared_pool", ())) >= set(timing)]
    if shared:
        t = shared[0]
        return (f"Whole reproduction ({names}, their jobs in one pool of worker processes): "
                f"{t['pool_wall']:.0f} s ({t['pool_wall'] / 60:.1f} min) of wall clock, "
                f"{t['proc_cpu']:.0f} s of the worker processes' CPU time.")
    wall = sum(t["wall"] for t in timing.values())
    cpu = [t["proc_cpu"] for t in timing.values() if "proc_cpu" in t]
    return (f"Whole reproduction ({names}, one after the other): "
            f"{wall:.0f} s ({wall / 60:.1f} min) of wall clock"
            + (f", {sum(cpu):.0f} s of the worker processes' CPU time" if len(cpu) == len(timing)
               else "") + ".")


def variant_section(data: dict, label: str, vdata: dict) -> list:
    """Markdown lines: the DeFed rows of a variant run (same splits, one setting changed) next to
    this run's, per benchmark — main average and the missing-class loss, both heads that
    matter (``lda``, ``auto``), with the paired difference ± SE over seeds."""
    lines = [f"## Variant: {label}", "",
             "The same jobs (splits, seeds, federations) run again with one setting changed; "
             "Δ = variant − default, paired over seeds ± its standard error.", "",
             "| benchmark | row | default | variant | Δ (points) ± SE |", "|---|---|---|---|---|"]
    for ds, res in data.items():
        vres = vdata.get(ds)
        if not vres:
            continue
        for strat, head in [(s, h) for s in ("DeFed replacement", "DeFed aggregation")
                            for h in ("lda", HEAD)]:
            a_, b_ = per_seed_average(res, strat, head), per_seed_average(vres, strat, head)
            if a_ and b_:
                d, se, n = paired(b_, a_)
                lines.append(f"| {NAMES[ds]} | {strat} ({head}) | {100 * np.mean(list(a_.values())):.2f} | "
                             f"{100 * np.mean(list(b_.values())):.2f} | {d:+.2f} ± {se:.2f} (n = {n}) |")
            (l0, m, _), (l1, _, _) = missing_loss(res, strat, head), missing_loss(vres, strat, head)
            if l0 and l1:
                d, se, n = paired(l1, l0)
                lines.append(f"| {NAMES[ds]} | {strat} ({head}): loss 0 → {100 * m:.0f} % | "
                             f"{100 * np.mean(list(l0.values())):.2f} | "
                             f"{100 * np.mean(list(l1.values())):.2f} | {d:+.2f} ± {se:.2f} (n = {n}) |")
    return lines + [""]


def merged(data: dict, extra: dict) -> dict:
    """``data`` with the jobs of ``extra`` it lacks (by job name; ``data``'s copy kept)."""
    out = {}
    for ds in dict.fromkeys(list(data) + list(extra)):
        res = list(data.get(ds, []))
        have = {r["job"]["name"] for r in res}
        out[ds] = res + [r for r in extra.get(ds, []) if r["job"]["name"] not in have]
    return out


def seeds_of(data: dict, kind: str) -> list:
    return sorted({r["seed"] for res in data.values() for r in res if r["job"]["kind"] == kind})


def only_seeds(data: dict, seeds) -> dict:
    return {ds: [r for r in res if r["seed"] in set(seeds)] for ds, res in data.items()}


def more_seeds_section(data: dict, extra: dict) -> list:
    """Markdown lines: the targets table again, on the seeds of these runs and of a second run
    of the same jobs on other seeds — a check of how precise the margins above are, run after
    them; the table above stays the protocol's verdict."""
    both = merged(data, extra)
    main_s, miss_s = seeds_of(both, "main"), seeds_of(both, "missing")
    first = sorted(set(miss_s) & set(range(5)))
    lines = ["## Precision check: the targets on more seeds", "",
             f"The same jobs run on more seeds (main jobs: seeds {_span(main_s)}; missing-class "
             f"study: seeds {_span(miss_s)}; a second run, `--more-seeds`), run *after* the "
             "targets table above had been seen, to measure how precise its margins are: it "
             "changes no setting, and the table above (the protocol: 5 seeds, the missing-class "
             "study 3) stays the verdict. A row is reported on the seeds where every target of "
             "the benchmark has it (n); the peers were run on every added seed of Amazon review "
             "only.", "", goals_table(both, {}, ("accuracy", "missing")), ""]
    if len(first) > 3:
        lines += [f"The missing-class rows on seeds {_span(first)} (the issue's 5 seeds):", "",
                  goals_table(only_seeds(both, first), {}, ("missing",)), ""]
    return lines


def _span(seeds) -> str:
    seeds = sorted(seeds)
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=RUNS",
                    help="a second run of the same jobs with one setting changed, reported next "
                         "to this one (repeatable)")
    ap.add_argument("--more-seeds", type=Path, default=None, metavar="RUNS",
                    help="a second run of the same jobs on other seeds: the targets table again "
                         "on the seeds of both (a precision check)")
    a = ap.parse_args()
    variants = [(label, Path(path)) for label, _, path in   # the label may hold "="
                (spec.rpartition("=") for spec in a.variant)]
    runs = [a.runs] + ([a.more_seeds] if a.more_seeds else []) + [p for _, p in variants]
    for p in runs:
        if not p.is_dir():
            ap.error(f"no runs folder at {p}")
    if not a.out.is_dir():
        ap.error(f"the output folder {a.out} does not exist")
    data = load(a.runs)
    timing = {ds: study_timing(res) for ds, res in data.items()}
    for ds in timing:            # run_lodo.py's record of its worker processes, when present
        rec = a.runs / ds / "run_cpu.json"
        if rec.is_file():
            r = json.loads(rec.read_text())
            timing[ds].update(proc_cpu=r["cpu_s"], load_start=r["load_start"],
                              load_end=r["load_end"], note=r.get("note", ""))
            if r.get("shared_pool"):
                timing[ds].update(shared_pool=r["shared_pool"], pool_wall=r["wall_s"])
    md = ["# DeFed-GMM-DaDiL reproduction (generated by `make_results.py`)", "",
          "Regenerate: `make DATA=… FEATURES=…` in `examples/dadil/` (`run_lodo.py` sweeps, "
          "resumable; this file and the plots by `make_results.py`, from the results alone).", "",
          "Accuracy (%) on each target's held-out test split, mean ± std over seeds; "
          "*average* = mean over targets per seed, then mean ± std over seeds.", ""]
    if timing:
        md += [whole_run(timing), ""]
    goals = goals_table(data, timing)
    if goals.count("\n") > 1:
        md += ["## Targets (issue 26), from these runs", "",
               "The default head (`auto`) of both DeFed strategies against each target. Margin: "
               "the row minus the target (≥ 0: met), paired over seeds (each seed's mean over "
               "targets, the same splits on both sides); SE: its standard error over those seeds. "
               "The missing-class rows give the `lda` head too (the head `auto` picks most).", "",
               goals, ""]
    md += ["## How the defaults were chosen", "",
           "- The `lda` head's shrinkage (ridge 0.01–0.6, towards the identity or the diagonal) "
           "is chosen per target by leave-one-source-domain-out on the sources alone; its grid was "
           "fixed before any run. Source-only's C: the same rule on its own grid. The peers: skada "
           "0.6 defaults, LinearOTMapping reg 1, fixed a priori; their head takes source-only's C.",
           "- The `auto` head (`lda` or `linear`) is chosen per target by a rule on the sources "
           "alone: every source plays the target; its rows are halved (seeded), a labeled GMM of "
           "half A (the source GMMs' own fit options) stands in for B(α_T); `linear` is scored as "
           "samples of that GMM, `lda` as half A pseudo-labeled by it plus the other sources' "
           "statistics, both on half B, which neither has seen; the higher mean over sources wins "
           "(ties: `lda`; since stop 39 each head's score is its mean over two stand-ins, below). "
           "The rule was written after the oracle rows had shown that which head "
           "wins follows the benchmark (the oracle compares the heads, fitted on the target's "
           "adaptation part, on its test part, with target labels); it reads no target label. It "
           "is the `fedalign` default (`GMMDaDiLClassifier`, and `dadil-evaluate` with "
           "`--head-gmm`). Its first form (stop 34) used each source's GMM of *all* its rows, "
           "half B included, and so scored `linear` in sample: on Digits 0.77–0.87 against "
           "0.54–0.70 out of sample (seeds 0–2, every target), and it picked `linear` there, where "
           "`lda` was 5–6 points better; the out-of-sample form was checked on seeds 0–1 of Office "
           "and Amazon review (it picks what the first form picked: `linear`, `lda`) and seeds 0–2 "
           "of Digits (`lda` 8/9) before this run, with no test label. Other rules tried earlier, "
           "scored against the runs' own lda/linear rows (seed 0, or 0–1): the "
           "mixture of the *other* sources' GMMs as the pseudo-barycenter (picks `lda` on the "
           "small Office targets, where it loses up to 14.5 points: dslr seed 1, 83.9 against "
           "98.4); circular validation (an LDA or a logistic regression trained on the target's "
           "rows pseudo-labeled by each head, scored on the sources; picks `lda` on webcam, 94.8 "
           "against 98.3). Neither was adopted.",
           "- Missing target classes (adopted, the `fedalign` default): the target's Gaussian "
           "is *completed* by the classes it lacks before the sources are mapped onto it "
           "(`fedalign.label_shift`). Saerens' EM on an LDA of the sources' class statistics "
           "(ridge 0.1) in the sources' own space estimates the target's priors; a class below "
           "0.2 × its source prior is absent and is added where the sources hold it, moved by the "
           "shift of the present classes, with the sources' within-class covariance. Nothing "
           "absent: the target's Gaussian bit for bit. Both thresholds were fixed before any "
           "run; the method was chosen on a proxy (logistic regression on the mapped sources, "
           "the missing-class targets below, seeds 0–2, 0 % → 45 % removed): with the plain target "
           "Gaussian usps 73.2 → 70.7, dslr 96.8 → 92.4, webcam 97.1 → 87.4; with the completed "
           "one 73.2 → 73.0, 96.8 → 98.9, 97.1 → 95.4 (the EM found 33 of the 36 removed "
           "classes, and flagged none of the 9 full targets). So the "
           "missing-class study is not an untouched test of it. Tried before and not adopted: "
           "re-weighting every source's Gaussian to the EM's priors (estimated in the mapped "
           "space they miss the removed classes — 0.06–0.11 on usps; with the *true* priors the "
           "proxy fell to 53.5–58 on usps, the re-weighted map extrapolating badly to the "
           "classes it never saw).",
           "- No choice reads a target's labels. But the *design* — mapping the sources onto the "
           "target's Gaussian first, and the `lda` head with pseudo-labels by B(α_T)'s MAP rule — "
           "was developed while looking at seed-0/1 runs of these three benchmarks; these tables "
           "are therefore not an untouched test of it. Alternatives tried then (seed 0 or 0–1, "
           "target accuracy %, replacement / aggregation): on Amazon review with the sources as "
           "they are, a logistic regression on the target's pseudo-labeled rows alone 76.8 / 77.3, "
           "self-training 77.4 / 77.8, OT label propagation from B(α_T)'s components 78.1 / 77.4, "
           "samples of B(α_T) plus the pseudo-labeled rows 79.2 / 75.9, the pooled sources' rows "
           "plus the pseudo-labeled rows (not federated) 80.6 / 81.2; pseudo-labels from the "
           "sampled linear head instead of the MAP rule 80.3 / 80.7 (Amazon), 66.0 / 65.7 "
           "(Digits, seed 0); without the mapping onto the target's Gaussian, Digits' pooled "
           "heads stayed at 52–55.",
           "- Tried on synthetic proxies and not adopted (stop 35; no reported target's rows "
           "used), the GMM-DaDiL estimator with the `lda` head. (1) Refining the `lda` head by "
           "classification EM (the target's rows relabeled by the LDA itself, the LDA refitted, "
           "until no label changes), on the rotated-blobs federation (noise 0.5, 1.0, 1.5; 3 "
           "classes, d = 8) and on 4 random affine images of a 5-class mixture (d = 20, two "
           "strengths), seeds 0–4: mean accuracy 0.683 → 0.688 over the five families, better on "
           "two, worse on one (0.621 → 0.600), equal on two — no clear gain (tried again at "
           "stop 40 on real missing-class jobs, below: not adopted). (2) Pseudo-labeling "
           "only with the classes the label-shift EM keeps (the absent ones masked), on affine "
           "images of a 6-class mixture (three settings; 0, 2 or 3 of the target's classes "
           "removed; seeds 0–5): worse in all 9 cells (e.g. 0.875 → 0.773 with nothing removed, "
           "0.736 → 0.671 with half the classes removed), because the EM's false flags then "
           "remove a class outright.",
           "- Tried for the missing-class loss and not adopted (stop 36; no target label read), "
           "the `lda` head. (1) The LDA's class priors from the sources' counts (or uniform) "
           "instead of the pooled counts, in which a class the target lacks has fewer rows: on "
           "the synthetic affine 6-class federations (0, 2 or 3 classes removed, seeds 0–4) "
           "within ±0.003 of the pooled counts in all 9 cells; on a proxy of the sources alone "
           "(the usps jobs' sources, seeds 0–2: each source plays the target, a labeled GMM of "
           "half its rows stands in for B(α_T), 45 % of its classes removed from that half) "
           "0.5307 against 0.5317. (2) Dropping the target rows pseudo-labeled into a class "
           "the label-shift EM found absent: on three harder settings of the same federations "
           "worse in 7 of 9 cells, better in 1 (0.907 → 0.856 with nothing removed: the EM's "
           "false flags). (3) Weighting the "
           "pseudo-labeled rows' statistics ×2 or ×0.5 on the same source proxy: ×2 scored "
           "higher (0.617 / 0.558 against 0.588 / 0.532 at 0 % / 45 %) but lost as much from 0 "
           "to 45 %, and the proxy's pseudo-labels come from a labeled GMM of the same domain, "
           "cleaner than B(α_T)'s; not adopted without a proxy closer to the target's.",
           "- The `auto` rule's two stand-ins (adopted, stop 39: the `fedalign` default), chosen "
           "on a tuning set the tables do not report — missing-class jobs of Digits mnist and "
           "Office-Caltech10 amazon and caltech10 (seeds 0–2, 15/30/45 % removed, the protocol "
           "above otherwise) — against a criterion fixed before: a mean gain ≥ 0.5 points over "
           "the 27 jobs (both strategies) and no target worse by more than 0.5. There the first "
           "rule picked `linear` on 8 of 9 mnist jobs, where `lda` is 7.3 points better (78.7 "
           "against 71.4): its stand-in for B(α_T), a labeled GMM of the source's own rows, is a "
           "better GMM than the dictionary's reconstruction, which takes its labels from other "
           "domains. Tried in turn (mean accuracy of the chosen head, mnist / amazon / "
           "caltech10; the first rule 72.1 / 94.7 / 91.0, the better head of every job 78.7 / "
           "95.1 / 91.6): (1) each source playing a target that lacks the classes the EM flagged "
           "(half A without them, its GMM completed by the other sources' components of them) "
           "changed none of the 27 choices; (2) an unlabeled GMM of half A (C·k components) "
           "labeled by the other sources' LDA, alone: 78.7 / 94.1 / 90.7 (`lda` on 8 of 18 "
           "Office jobs; amazon misses the criterion); (3) each head's mean score over the "
           "labeled stand-in and (2): 78.7 / 94.7 / 91.0, met, one more GMM fit per source; "
           "(4) adopted: as (3), the second stand-in the same half-A GMM with each component "
           "relabeled by the other sources' LDA (no second fit): 77.4 / 94.7 / 91.1, met. (3) "
           "and (4) were formed after (1) and (2) had been seen on this set. "
           "`tune_head_rule.py` reruns the comparison.",
           "- Classification EM of the `lda` head (stop 40; **not adopted**: `cem_iter = 0`, "
           "`--cem-iter N` selects it). Chosen first on the tuning set above (mnist, amazon, "
           "caltech10; seeds 0–2; 0/15/30/45 % removed; both strategies, the same DeFed "
           "barycenters for every variant) against a criterion fixed before any variant was "
           "scored: mnist's loss from 0 to 45 % falls by ≥ 1.0 point, and no tuning target's "
           "mean accuracy falls by more than 0.3. What the loss is made of: with the target's "
           "*true* labels in place of the pseudo-labels the `lda` head still lost 3.5 points on "
           "mnist (the absent classes' statistics come from the sources alone), while the "
           "one-pass head's pseudo-labels of the *present* classes got worse with removal (at "
           "45 %, 78.5 against the sources-only LDA's 79.7). Variants (mnist mean / loss, amazon "
           "mean, caltech10 mean; the one-pass head 79.5 / 3.2, 94.16, 91.39): soft labels "
           "(posterior-weighted statistics) 79.6 / 2.6, 94.21, 91.56; MAP labels after Saerens' "
           "EM re-estimates the priors 79.5 / 3.2, 94.16, 91.46; both 79.3 / 3.3, 94.18, 91.59 — "
           "none met (i). Formed after those had been seen: the product of B(α_T)'s and the "
           "sources-only LDA's posteriors 79.8 / 1.7, 94.31, 90.76 (fails (ii)); one relabeling "
           "by the LDA 80.8 / 1.9, 94.21, 91.07 (fails (ii) by 0.02); classification EM to "
           "convergence (≤ 10) 81.0 / 1.3, 94.25, 91.09 (caltech10 −0.30: met, at the edge). "
           "The `auto` rule kept scoring the one-pass head (refining its stand-ins too made it "
           "pick `linear` on 7 more of the 12 mnist jobs: `auto` 74.8 against 79.9). The whole "
           "reproduction was then run with it (\"Variant\" below): Digits +1.7 / +1.4, but "
           "Amazon review −0.96 / −0.85 (every target lower, the oracle's `lda` row too — the "
           "LDA of the sources' statistics pulls the labels towards its own bias), Office's "
           "`lda` rows −0.8 / −0.9 (`auto` level), and Digits' missing-class loss worse (2.2 / "
           "3.7 → 5.7 / 4.8). The default stayed the one-pass head — a decision taken with the "
           "reported targets' results in view, so the one-pass rows are not an untouched test "
           "of it (they were not one before either: above). Classification EM had also been "
           "tried at stop 35 on synthetic proxies, with no clear gain. The tuning set held no "
           "benchmark like Amazon review (2 classes, text features), where it lost most. "
           "`tune_lda_head.py` reruns the comparison.",
           "- Tried for the missing-class loss and not adopted (stop 41; the same tuning set, "
           "the same criterion (i) and (ii), fixed before), the `lda` head's source statistics: "
           "(1) every source's statistics moved by the shift of the classes the target holds "
           "(δ_k = Σ_c n_c (μ̂_c − μ_{k,c}) / Σ_c n_c from the target's pseudo-labels, computed "
           "from the aggregates), so that a class the target lacks moves with the others: mnist "
           "79.3 / 3.4 (mean / loss), amazon 94.14, caltech10 91.80; (2) the same with one δ of "
           "the pooled sources: 79.3 / 3.4, 94.14, 91.78; (3) formed after (1) had been seen, "
           "every source's statistics weighted by the agreement of its own LDA with B(α_T)'s "
           "pseudo-labels (scaled to mean 1), so that an absent class comes mostly from the "
           "sources closest to the target: 79.3 / 3.0, 94.16, 91.44. None met (i) (the one-pass "
           "head: 79.5 / 3.2, 94.16, 91.39); with the true labels in place of the pseudo-labels "
           "(1) lost 3.3 and (3) 4.7 on mnist, against 3.5. `tune_lda_head.py` reruns them.",
           "- Tried for Amazon review's gap to LinearOTMapping and not adopted (stop 42): a map "
           "onto the target's Gaussian with more covariance shrinkage. Why: skada's "
           "LinearOTMapping with reg 1 adds I to covariances whose variances are 10⁻⁴–10⁻¹, so "
           "it is nearly a mean shift, and it beats `slot-to-target` (Ledoit–Wolf) on all three "
           "benchmarks; an LDA of the sources mapped with shrinkage s = 1 (every Gaussian "
           "tr Σ̂/d · I: one scale and a shift) scored higher on the sources alone (each source "
           "as the target, no target label: Amazon review 74.6–78.6 → 78.0–81.6) and on mnist's "
           "test split (a tuning target: 70.7 → 78.5, seeds 0–2). Criterion fixed before the "
           "DeFed runs: on the tuning set (mnist, amazon, caltech10; seeds 0–2) the `auto` mean "
           "rises ≥ 0.5, no target falls > 0.3, mnist's missing-class loss grows ≤ 0.5. (1) s = 1 "
           "for the whole pipeline (`run_lodo.py --map-shrinkage 1`): mnist's main jobs 81.7 / "
           "81.7 → 77.8 / 80.5 (replacement / aggregation), at 45 % removed 47.7 / 37.2 (a loss "
           "of 30 / 43 points: the completed reference keeps the sources' full within-class "
           "covariance for the absent classes, so the map is no longer one scale); Office's "
           "first four main jobs 92.8 / 92.6 → 93.0 / 93.6; stopped, (i) and (iii) failed. "
           "(2) formed after (1), only the `lda` head's source statistics from that isotropic "
           "map onto the completed Ledoit–Wolf reference (x ↦ μ_ref + (tr Σ_ref / tr Σ_k)^{1/2} "
           "(x − μ_k)), the dictionary and the pseudo-labels as they are (`tune_lda_head.py`, "
           "`iso`): mnist 78.8 / loss 6.2 against the one-pass head's 79.5 / 3.2; fails (ii) and "
           "(iii). The better LDA of the mapped sources does not survive the pseudo-labels and the "
           "missing classes.",
           "- Tried for the missing-class loss and not adopted (stop 43; the same tuning set and "
           "criterion (i) and (ii), fixed before; mnist first, the Office targets only if (i) "
           "held): the dictionary's own reconstruction of every class in the `lda` head. One "
           "more message beside the sources' and the target's pseudo-labeled statistics: "
           "B(α_T)'s class moments, as many rows as the target has, spread by B's class masses "
           "(computed at the target from the atoms; nothing new travels), so that a class the "
           "target lacks is not described by the sources alone. mnist 79.50 / loss 2.75 against "
           "the one-pass head's 79.46 / 3.17: the loss falls by 0.42, (i) fails; with the true "
           "labels it raises the loss (4.00 against 3.50): B(α_T)'s absent classes are no "
           "better than the sources'. `tune_lda_head.py` (`bary`) reruns it.", ""]
    summary = {}
    for ds, res in data.items():
        table, targets, seeds, avgs = main_table(res)
        summary[ds] = avgs
        md += [f"## {NAMES[ds]}", "", protocol(res, ds, seeds, targets, timing), table, ""]
        so = avgs.get(("source-only", "logreg"))
        peers = {mh: v for mh, v in avgs.items() if mh[0] not in {m for m, _ in ROWS}
                 and "ceiling" not in mh[0]}
        best = max(peers.items(), key=lambda kv: kv[1]) if peers else None
        for strat, head in DEFED:
            v = avgs.get((strat, head))
            if so is not None and v is not None:
                word = "above" if v >= so else "BELOW"
                line = (f"- {strat} ({head}): {100 * v:.1f} — {word} source-only ({100 * so:.1f}, "
                        f"{100 * (v - so):+.1f})")
                if best:
                    line += (f"; {'above' if v >= best[1] else 'BELOW'} the best peer, "
                             f"{best[0][0]} ({100 * best[1]:.1f}, {100 * (v - best[1]):+.1f})")
                md.append(line + ".")
        fails = failures(res)
        if fails:
            md.append("- Peers that failed (reported, not hidden): " + "; ".join(fails) + ".")
        al = alpha_summary(res)
        for strat, s in al.items():
            if s["max_l1"] is not None:
                md.append(f"- α_T ({strat}, seed {seeds[0]}): "
                          + "; ".join(f"{t} ({', '.join(map(str, v))})" for t, v in s["seed0"].items())
                          + f". Largest L1 distance between two targets' α (same seed): "
                            f"{s['max_l1']:.2f} (mean {s['mean_l1']:.2f}).")
        for r in res:
            for strat, c in (r.get("consensus") or {}).items():
                md.append(f"- Consensus ({strat}, target {r['target']}, seed {r['seed']}): "
                          f"M(0) = {c['max'][0]:.3g} → M({c['rounds'][-1]}) = {c['max'][-1]:.3g} "
                          f"(ratio {c['max'][-1] / c['max'][0]:.2f}; max over client pairs).")
        mt, mtargets, mseeds = missing_table(res)
        if mt:
            md += ["", f"### Missing target classes ({NAMES[ds]})", "",
                   f"round(m·C) classes (seeded) removed from the target's adaptation data only; "
                   f"the test split keeps every class. Targets {', '.join(mtargets)}, seeds "
                   f"{', '.join(map(str, mseeds))}; mean over targets per seed, ± std over seeds.", "",
                   mt, "", "Classes removed: " + "; ".join(dropped_list(res)) + "."]
        et = envelope_table(res)
        if et:
            md += ["", f"### Barycentric envelope ({NAMES[ds]})", "",
                   "A federation of the sources only (aggregation, same R and E); the first "
                   "source's atoms are kept fixed and α_T alone is fitted on the full and on the "
                   "reduced target GMM (`fedalign.dadil.envelope`, projected steps on the simplex); "
                   "accuracy of heads trained on samples of B(α_T).", "", et]
        md.append("")
    if a.more_seeds is not None:
        md += more_seeds_section(data, load(a.more_seeds))
    for label, path in variants:
        md += variant_section(data, label, load(path))
    png = plot_consensus(data, a.out / "consensus.png")
    if png:
        md += ["## Consensus", "", "![consensus](consensus.png)", "",
               "M(t) = max over 10 common weight vectors of W2 between two clients' barycenters; "
               "a falling curve means the clients' dictionaries converge to a common one.", ""]
    (a.out / "RESULTS.md").write_text("\n".join(md))
    (a.out / "summary.json").write_text(json.dumps(
        {ds: {f"{m} ({h})": v for (m, h), v in s.items()} for ds, s in summary.items()}, indent=1))
    print(f"wrote {a.out / 'RESULTS.md'}")


if __name__ == "__main__":
    main()

"""Build examples/slot/RESULTS.md from the grid's reports (``run_grid.py``).

Reports are ``<grid>/<dataset>/M<M>_a<alpha>_s<seed>.json`` (producer ``fedalign federation``):
one partition seed (= head seed), every τ, every head in its variants, the validation-selected
τ̂ and the test-selected (oracle) τ. Everything the protocol section says is read from the
reports (domains, rows, encoder, fractions, τ grid, seeds, head options, participation,
barycenter convergence, timing) — nothing about the protocol is written here by hand.

    python make_results.py /tmp/fedalign-slot/grid -o RESULTS.md [--notes notes.md]
        [--readme-table table.md]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedalign.files import read_report

PAPER = ("For orientation, the SLOT-Align paper reports on Office-Home at α = 0.1: "
         "O-FedAvg 64.2 → 72.1, FedCGS 84.4 → 85.1, FedPFT 74.2 → 80.7 (different backbone, "
         "dataset and client setup; not a target for these numbers).")
NAMES = {"ofedavg": "O-FedAvg", "fedcgs": "FedCGS", "fedpft": "FedPFT", "fedpft-k1": "FedPFT (K=1)",
         "fed3r": "Fed3R", "centralized": "centralized"}
RULE_TAU = 0.4  # the SLOT-Align reference's fixed-mode default: a label-free rule


def ordered(labels) -> list:
    """Head labels in the grid's order (:data:`fedalign.federation.DEFAULT_HEADS`), others after."""
    from fedalign.federation import DEFAULT_HEADS

    rank = {lb: i for i, lb in enumerate(DEFAULT_HEADS)}
    return sorted(labels, key=lambda lb: (rank.get(lb, len(rank)), lb))


def head_name(label: str) -> str:
    method, _, variant = label.partition(":")
    return f"{NAMES.get(method, method)} ({variant or 'fedalign'})"


def load(grid: Path):
    """{dataset: {M: {alpha: {seed: report}}}} of the federation reports under ``grid``."""
    runs = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for path in sorted(grid.glob("*/M*_a*_s*.json")):
        rep = read_report(path)
        if rep.get("producer") != "fedalign federation":
            continue
        pr = rep["protocol"]
        alpha = "none" if pr["alpha"] is None else f"{pr['alpha']:g}"
        runs[rep["dataset"]][int(pr["clients_per_domain"])][alpha][int(pr["seed"])] = rep
    return runs


def macro(acc: dict) -> float:
    return float(np.mean(list(acc.values())))


def tau_key(t) -> str:
    return f"{float(t):g}"


def pm(values) -> str:
    v = 100 * np.asarray(values, float)
    return "—" if not len(v) else f"{v.mean():.1f} ± {v.std():.1f}"


def delta(a, b) -> str:
    d = [y - x for x, y in zip(a, b)]
    return f"{100 * np.mean(d):+.1f}" if d else "—"


def alpha_order(a):
    return math.inf if a == "none" else -float(a)


def participation(reps) -> str:
    """Clients taking part over the seeds: "K/K" or "mean/K (min m)"."""
    k = [r["participation"]["taking_part"] for r in reps]
    K = reps[0]["participation"]["clients_total"]
    if min(k) == K:
        return f"{K}/{K}"
    return f"{np.mean(k):.1f}/{K} (min {min(k)})"


def taus_text(taus) -> str:
    vals, counts = np.unique(np.asarray(taus, float), return_counts=True)
    return ", ".join(f"{v:g}×{c}" if c > 1 else f"{v:g}" for v, c in zip(vals, counts))


def cells(reps, label):
    """Per seed (in seed order): macro at τ=0, at τ̂, at the rule τ, at the oracle τ; τ̂; oracle τ."""
    out = defaultdict(list)
    for r in reps:
        h = r["heads"][label]
        test = h["test"]
        out["base"].append(macro(test["0"]))
        out["sel"].append(macro(test[tau_key(h["selected_tau"])]))
        out["rule"].append(macro(test[tau_key(RULE_TAU)]) if tau_key(RULE_TAU) in test else np.nan)
        out["oracle"].append(macro(test[tau_key(h["oracle_tau"])]))
        out["tau_sel"].append(h["selected_tau"])
        out["tau_oracle"].append(h["oracle_tau"])
    return out


def protocol_section(runs, timing) -> list:
    lines = ["## Protocol (read from the reports)", ""]
    any_rep = None
    for ds in sorted(runs):
        reps = [r for M in runs[ds].values() for a in M.values() for r in a.values()]
        any_rep = any_rep or reps[0]
        r0 = reps[0]
        feats = r0.get("features", {})
        doms = ", ".join(f"{d} {r0['domain_rows'][d]:,}" for d in r0["domains"])
        enc = {(f.get("model"), f.get("weights"), tuple(f.get("input_size") or ()), f.get("d"))
               for f in feats.values()}
        enc_txt = "; ".join(f"`{m}` ({w} weights, input {'×'.join(map(str, s[1:])) or '?'} px), d = {d}"
                            for m, w, s, d in enc) or "not recorded"
        Ms = sorted(runs[ds])
        alphas = sorted({a for M in runs[ds].values() for a in M}, key=alpha_order)
        seeds = sorted({s for M in runs[ds].values() for a in M.values() for s in a})
        lines += [f"- **{ds}**: {len(r0['class_names'])} classes; domains (rows): {doms}; features: "
                  f"{enc_txt}. Runs: M ∈ {{{', '.join(map(str, Ms))}}} clients per domain, "
                  f"α ∈ {{{', '.join(alphas)}}}, seeds {', '.join(map(str, seeds))} "
                  f"({len(reps)} runs)."]
    pr = any_rep["protocol"]
    lines += [
        f"- **Partition** (`fedalign.partition`, seed s): per domain a stratified "
        f"{100 * pr['test_fraction']:g} % test split; Dirichlet(α·1_K) fractions per class over the "
        f"K = D·M clients, client k keeping ⌊p[k,c]·n⌋ of its domain's class-c pool; "
        f"{pr['redraws']} redraws; a client left with fewer than {pr['min_client_size']} rows takes "
        f"no part (the tables' *clients* column counts those that did). A domain with no "
        f"participating client has no map: its test split is scored unaligned.",
        f"- **SLOT-Align**: per client mean + Ledoit–Wolf covariance → barycenter "
        f"({pr['barycenter_weights']} weights, tolerance {pr['barycenter_tol']:g}) → each client's "
        f"map moves its training rows; each domain's test split is moved by the domain map (the map "
        f"of its participating clients' pooled statistics; with M = 1 the client map), at the same τ. "
        f"τ ∈ {{{', '.join(f'{t:g}' for t in pr['taus'])}}}; τ = 0 is the unaligned baseline. "
        f"O-FedAvg (reference) instead trains through a frozen transport layer with the cosine τ "
        f"schedule from τ_min to τ_max = τ and is evaluated at τ_max.",
        f"- **τ without test labels**: each participating client holds out a stratified "
        f"{100 * pr['val_fraction']:g} % of its training rows; the same pipeline on the remaining "
        f"rows (its own statistics, barycenter and maps) scores every τ on them. τ̂ = "
        f"{pr['tau_selection']}. The column *τ = {RULE_TAU:g} (rule)* is the reference's fixed default "
        f"(also label-free). *Oracle* picks τ on the test accuracy itself and is shown only as such.",
        "- **Scoring**: accuracy per test domain, macro mean over the test domains; partition seed = "
        "head seed; mean ± std (ddof = 0) over seeds; Δ is the mean paired difference in points.",
        "- **Heads** (options as run; `fedalign` is this package's choice, `reference` reproduces "
        "each head's reference code — see the head's docstring for what still differs):", ""]
    heads = any_rep["heads"]
    for label in ordered(heads):
        h = heads[label]
        p = {k: v for k, v in h["params"].items() if k != "variant"}
        other = heads.get(h["method"] if h["variant"] != "fedalign" else f"{h['method']}:reference")
        if other is not None and h["variant"] != "fedalign":
            p = {k: v for k, v in p.items() if other["params"].get(k) != v}
            lines.append(f"  - {head_name(label)}: as fedalign except " +
                         ", ".join(f"{k}={_fmt(v)}" for k, v in p.items()))
        else:
            lines.append(f"  - {head_name(label)}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in p.items()))
    conv = [r["barycenter"][k] for ds in runs.values() for M in ds.values() for a in M.values()
            for r in a.values() for k in ("full", "selection")]
    lines += ["", f"Barycenters: {sum(c['converged'] for c in conv)}/{len(conv)} converged, "
              f"at most {max(c['iterations'] for c in conv)} iterations, largest fixed-point residual "
              f"{max(c['residual'] for c in conv):.1e}."]
    if timing:
        runs_t = [t for t in timing if "seconds" in t]
        walls = [t for t in timing if "grid_wall_s" in t]
        txt = f"Time: {len(runs_t)} runs, {sum(t['seconds'] for t in runs_t) / 60:.1f} min of worker time"
        if walls:
            txt += (f"; grid wall time {sum(w['grid_wall_s'] for w in walls) / 60:.1f} min on "
                    f"{walls[-1]['jobs']} workers ({walls[-1].get('cpus', '?')} CPUs)")
        lines += ["", txt + " (`timing.jsonl`)."]
    return lines + [""]


def _fmt(v):
    return f"{v:g}" if isinstance(v, float) else str(v)


def dataset_section(ds, by_M) -> list:
    lines = [f"## {ds}", ""]
    M = min(by_M)
    runs = by_M[M]
    alphas = sorted(runs, key=alpha_order)
    any_rep = next(iter(next(iter(runs.values())).values()))
    labels = ordered(any_rep["heads"])
    domains = any_rep["domains"]
    taus = [tau_key(t) for t in any_rep["protocol"]["taus"]]
    lines += [f"M = {M} client(s) per domain. Macro accuracy (%) over test domains, mean ± std over "
              "seeds; *clients*: clients that took part (of K) over the seeds.", "",
              "### Baseline vs +SLOT", "",
              "| head | α | clients | baseline (τ=0) | +SLOT τ̂ (validation) | Δ | τ̂ chosen | "
              f"+SLOT τ={RULE_TAU:g} (rule) | Δ | oracle: best τ on test | oracle τ |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label in labels:
        for a in alphas:
            reps = [runs[a][s] for s in sorted(runs[a])]
            c = cells(reps, label)
            lines.append(f"| {head_name(label)} | {a} | {participation(reps)} | {pm(c['base'])} | "
                         f"{pm(c['sel'])} | {delta(c['base'], c['sel'])} | {taus_text(c['tau_sel'])} | "
                         f"{pm(c['rule'])} | {delta(c['base'], c['rule'])} | {pm(c['oracle'])} | "
                         f"{taus_text(c['tau_oracle'])} |")
    lines += ["", "### τ sweep (test macro accuracy %, τ = 0 is the baseline)", "",
              "| head | α | clients | " + " | ".join(f"τ={t}" for t in taus) + " | validation-selected τ̂ "
              "| oracle τ (test) |", "|" + "---|" * (len(taus) + 5)]
    for label in labels:
        for a in alphas:
            reps = [runs[a][s] for s in sorted(runs[a])]
            c = cells(reps, label)
            row = [pm([macro(r["heads"][label]["test"][t]) for r in reps]) for t in taus]
            lines.append(f"| {head_name(label)} | {a} | {participation(reps)} | " + " | ".join(row)
                         + f" | {taus_text(c['tau_sel'])} | {taus_text(c['tau_oracle'])} |")
    lines += ["", "### Per-domain accuracy (%), baseline → +SLOT τ̂ (validation)", "",
              "| head | α | clients | " + " | ".join(domains) + " |", "|" + "---|" * (len(domains) + 3)]
    for label in labels:
        for a in alphas:
            reps = [runs[a][s] for s in sorted(runs[a])]
            row = []
            for d in domains:
                b = [r["heads"][label]["test"]["0"][d] for r in reps]
                s = [r["heads"][label]["test"][tau_key(r["heads"][label]["selected_tau"])][d] for r in reps]
                row.append(f"{100 * np.mean(b):.1f} → {100 * np.mean(s):.1f}")
            lines.append(f"| {head_name(label)} | {a} | {participation(reps)} | " + " | ".join(row) + " |")
    unmapped = sorted({d for a in runs.values() for r in a.values() for d in r["unmapped_domains"]})
    if unmapped:
        n = sum(bool(r["unmapped_domains"]) for a in runs.values() for r in a.values())
        lines += ["", f"In {n} run(s) no client of {', '.join(unmapped)} took part; that test split "
                  "was scored unaligned."]
    ofa = [lb for lb in labels if lb.startswith("ofedavg")]
    if ofa:
        lines += ["", "### O-FedAvg: final training loss (sample-weighted over clients, mean over seeds)", "",
                  "| head | α | " + " | ".join(f"τ={t}" for t in taus) + " |", "|" + "---|" * (len(taus) + 2)]
        for label in ofa:
            for a in alphas:
                reps = [runs[a][s] for s in sorted(runs[a])]
                row = [f"{np.mean([r['heads'][label]['info'][t]['train_loss'] for r in reps]):.3g}"
                       for t in taus]
                lines.append(f"| {head_name(label)} | {a} | " + " | ".join(row) + " |")
    return lines + [""]


def finer_section(runs) -> list:
    """Baseline → +SLOT τ̂ for every M found (finer partitions)."""
    datasets = [ds for ds in sorted(runs) if len(runs[ds]) > 1]
    if not datasets:
        return []
    lines = ["## Finer partitions: M clients per domain", "",
             "Each domain's test split is mapped by its domain map (pooled statistics of its "
             "participating clients). Macro accuracy (%), baseline → +SLOT τ̂ (validation), "
             "mean over seeds, and the clients that took part.", ""]
    for ds in datasets:
        Ms = sorted(runs[ds])
        alphas = sorted({a for M in runs[ds].values() for a in M}, key=alpha_order)
        labels = ordered(next(iter(next(iter(runs[ds][Ms[0]].values())).values()))["heads"])
        lines += [f"### {ds}", "", "| head | α | " + " | ".join(f"M={M}" for M in Ms) + " |",
                  "|" + "---|" * (len(Ms) + 2)]
        for label in labels:
            for a in alphas:
                row = []
                for M in Ms:
                    reps = [runs[ds][M][a][s] for s in sorted(runs[ds][M].get(a, {}))]
                    if not reps:
                        row.append("—")
                        continue
                    c = cells(reps, label)
                    row.append(f"{100 * np.mean(c['base']):.1f} → {100 * np.mean(c['sel']):.1f} "
                               f"({participation(reps)})")
                lines.append(f"| {head_name(label)} | {a} | " + " | ".join(row) + " |")
        lines.append("")
    return lines


def readme_table(runs) -> list:
    """The README's table: head × (dataset, α), baseline → +SLOT τ̂, M = 1."""
    cols = [(ds, a) for ds in sorted(runs) for a in sorted(runs[ds][min(runs[ds])], key=alpha_order)]
    any_rep = next(iter(next(iter(runs[cols[0][0]][min(runs[cols[0][0]])].values())).values()))
    lines = ["| head | " + " | ".join(f"{ds} α={a}" for ds, a in cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for label in ordered(any_rep["heads"]):
        row = []
        for ds, a in cols:
            reps = list(runs[ds][min(runs[ds])][a].values())
            c = cells(reps, label)
            row.append(f"{100 * np.mean(c['base']):.1f}→{100 * np.mean(c['sel']):.1f}")
        lines.append(f"| {head_name(label)} | " + " | ".join(row) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=Path("RESULTS.md"))
    ap.add_argument("--notes", type=Path, default=Path(__file__).with_name("notes.md"),
                    help="hand-written reading of the tables, included verbatim")
    ap.add_argument("--readme-table", type=Path, help="also write the README's summary table here")
    args = ap.parse_args()
    runs = load(args.grid)
    if not runs:
        raise SystemExit(f"no federation reports under {args.grid}")
    timing_path = args.grid / "timing.jsonl"
    timing = ([json.loads(x) for x in timing_path.read_text().splitlines() if x.strip()]
              if timing_path.exists() else [])
    lines = ["# SLOT-Align reproduction: results", "",
             f"Generated by `make_results.py` from {sum(len(s) for d in runs.values() for M in d.values() for s in M.values())} "
             "run reports of `run_grid.py` (`make -C examples/slot`). Do not edit by hand.", ""]
    lines += protocol_section(runs, timing)
    if args.notes.exists():
        lines += [args.notes.read_text().rstrip(), ""]
    lines += [PAPER, ""]
    for ds in sorted(runs):
        lines += dataset_section(ds, runs[ds])
    lines += finer_section(runs)
    args.output.write_text("\n".join(lines) + "\n")
    if args.readme_table:
        args.readme_table.write_text("\n".join(readme_table(runs)) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

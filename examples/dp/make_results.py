"""Build examples/dp/RESULTS.md and the accuracy-vs-ε plot from the DP grid's reports
(``run_dp.py``). Everything the protocol section says is read from the reports.

    python make_results.py /tmp/fedalign-dp/grid -o RESULTS.md --plot dp_accuracy.png
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedalign.files import read_report

NAMES = {"fedcgs": "FedCGS (fedalign)", "fed3r": "Fed3R (fedalign)"}
PROTECTED = [
    "**Protected**: every number a client sends — the count, Σx and Σxxᵀ of its statistics "
    "and the sums of its FedCGS / Fed3R message — is released with Gaussian noise, and its "
    "total over one run is (ε, δ)-DP for its rows under add/remove-one-row (Gaussian-DP "
    "composition of both releases, checked per client below). The barycenter, the maps and the "
    "heads are post-processing of those releases.",
    "**Why noise and not secure aggregation**: the barycenter needs every client's own mean "
    "and covariance (it is not a function of their sum), so secure aggregation, which reveals "
    "only sums, could not hide them; the DP noise does.",
    "**Not protected**: the exact clipped fraction each record carries (a diagnostic, at most "
    "1/n per row); the noise seeds of this simulation (reproducible on purpose: a deployment "
    "draws fresh OS noise, as `fedalign stats` does without `--seed`); floating-point side "
    "channels of numpy's Gaussian sampler; the test splits (evaluation only, never sent); and, "
    "in the *exact maps* rows, the head message (a client that maps its rows with its exact "
    "statistics makes every mapped row depend on every row, so clipping no longer bounds the "
    "message's sensitivity — those rows carry no composed guarantee).",
]


def macro(acc: dict) -> float:
    return float(np.mean(list(acc.values())))


def load(grid: Path):
    """{dataset: {(ε label, map statistics): {seed: report}}}."""
    runs = defaultdict(lambda: defaultdict(dict))
    for path in sorted(grid.glob("*/eps*_s*.json")):
        rep = read_report(path)
        if rep.get("producer") != "fedalign federation":
            continue
        key = (rep["epsilon"], rep.get("map_stats") or "none")
        runs[rep["dataset"]][key][int(rep["protocol"]["seed"])] = rep
    return runs


def eps_value(label: str) -> float:
    return math.inf if label == "inf" else float(label)


def pm(values) -> str:
    v = 100 * np.asarray(values, float)
    return "—" if not len(v) else f"{v.mean():.1f} ± {v.std():.1f}"


def accuracies(reps: dict, head: str, tau: str) -> list:
    return [macro(r["heads"][head]["test"][tau]) for _, r in sorted(reps.items())]


def privacy_check(runs) -> tuple[float, int, list, list]:
    """Largest |total ε − ε| over every covered client total, how many totals, and the clipped
    fractions of the statistics and head releases."""
    worst, count, stats_clip, head_clip = 0.0, 0, [], []
    for by in runs.values():
        for (eps, ms), reps in by.items():
            if eps == "inf":
                continue
            for r in reps.values():
                stats_clip += [s["clipped_fraction"] for s in r["dp"]["stats_release"].values()]
                for h in r["heads"].values():
                    for entries in h["privacy"].values():
                        for e in entries:
                            head_clip.append(e["head"]["clipped_fraction"])
                            if e["head_message_covered"]:
                                worst = max(worst, abs(e["total"]["epsilon"] - float(eps)))
                                count += 1
    return worst, count, stats_clip, head_clip


def protocol(runs, timing) -> list:
    r0 = next(r for by in runs.values() for reps in by.values() for r in reps.values())
    pr = r0["protocol"]
    lines = ["## Protocol (read from the reports)", ""]
    n_max = 0
    for ds in sorted(runs):
        rd = next(r for reps in runs[ds].values() for r in reps.values())
        doms = ", ".join(f"{d} {rd['domain_rows'][d]:,}" for d in rd["domains"])
        enc = {(f.get("model"), f.get("weights"), f.get("d")) for f in rd.get("features", {}).values()}
        enc_txt = "; ".join(f"`{m}` ({w} weights), d = {d}" for m, w, d in enc) or "not recorded"
        seeds = sorted({s for reps in runs[ds].values() for s in reps})
        eps = sorted({e for e, _ in runs[ds]}, key=eps_value)
        n_runs = sum(len(v) for v in runs[ds].values())
        lines.append(f"- **{ds}**: {len(rd['class_names'])} classes; domains (rows): {doms}; features: "
                     f"{enc_txt}. ε ∈ {{{', '.join('∞' if e == 'inf' else e for e in eps)}}}, seeds "
                     f"{', '.join(map(str, seeds))} ({n_runs} runs).")
        n_max = max(n_max, max(int(v * (1 - pr["test_fraction"])) for v in rd["domain_rows"].values()))
    dp = next(r["dp"] for by in runs.values() for (e, _), reps in by.items() if e != "inf"
              for r in reps.values())
    rule = r0["clip_rule"]
    files = ", ".join(f"{k} ({v['rows']} rows)" for k, v in (rule.get("files") or {}).items())
    lines += [
        f"- **Federation**: "
        + (f"α = {pr['alpha']:g} (Dirichlet label shift)" if pr["alpha"] is not None else
           "α = none (no label shift: each client keeps all of its domain's training rows)")
        + f", M = {pr['clients_per_domain']} client per domain, "
        f"{100 * pr['test_fraction']:g} % test split per domain, partition seed = head seed; "
        f"τ = {r0['tau']:g} fixed (τ = 0: no SLOT), no validation-based τ selection (it would "
        f"release the same rows a second time); barycenter tolerance {pr['barycenter_tol']:g}.",
        f"- **Privacy**: {dp['mechanism']} Gaussian mechanism; neighbouring: {dp['neighbouring']}. "
        f"Each client's total budget (ε, δ) per run: {100 * dp['stats_share']:g} % of μ² (ρ) to its "
        f"statistics (count 5 %, Σx 25 %, Σxxᵀ 70 % of that), the rest to its head message; at "
        f"τ = 0 the head message gets all of it. δ = {dp['delta']:g} "
        f"({'≤' if dp['delta'] <= 1 / n_max ** 2 else '>'} 1/n² = {1 / n_max ** 2:.2g} for the "
        f"largest possible client, n = {n_max} training rows of the largest domain).",
        f"- **Clipping**: C = {dp['clip']:.4g}, {rule['rule']}"
        + (f" ({rule.get('source')}: {files})" if files else "") + "; no private row or test label "
        "was used to choose it.",
        "- **Post-processing**: statistics → PSD projection onto {0 ≼ Σ ≼ C² I} and a shrinkage "
        "rule that needs no fourth moment (the DP noise energy, known from σ, plus a Gaussian "
        "sampling term; `fedalign/dp/moments.py`); FedCGS: the total covariance projected to PSD, "
        "then its ridge; Fed3R: Σ G projected to PSD, then λI.",
        "- **Maps**: *released* — every client maps its rows with the map built from its released "
        "statistics (the guarantee covers the head message); *exact* — with its exact statistics "
        "(the head message is then not covered: no composed guarantee).",
    ]
    worst, count, sc, hc = privacy_check(runs)
    if count:
        lines.append(f"- **Accounting check**: {count} per-client totals (statistics + head message, "
                     f"composed) of covered runs; largest |total ε − ε| = {worst:.1e}. Clipped "
                     f"fraction of rows: statistics {100 * np.mean(sc):.1f} % on average (max "
                     f"{100 * np.max(sc):.1f} %), head messages {100 * np.mean(hc):.1f} % (max "
                     f"{100 * np.max(hc):.1f} %).")
    if timing:
        secs = sum(t["seconds"] for t in timing if "seconds" in t)
        walls = [t for t in timing if "grid_wall_s" in t]
        n_runs = sum(1 for t in timing if "seconds" in t)
        txt = f"- **Time**: {n_runs} runs, {secs / 60:.1f} min of worker time"
        if walls:
            txt += (f"; grid wall time {sum(w['grid_wall_s'] for w in walls) / 60:.1f} min on "
                    f"{walls[-1]['jobs']} workers ({walls[-1]['cpus']} CPUs)")
        lines.append(txt + " (`timing.jsonl`).")
    return lines


def table(ds, by) -> list:
    eps = sorted({e for e, _ in by}, key=eps_value)
    order = list(NAMES)
    heads = sorted({h for reps in by.values() for r in reps.values() for h in r["heads"]},
                   key=lambda h: (order.index(h) if h in order else len(order), h))
    tau = f"{next(r for reps in by.values() for r in reps.values())['tau']:g}"
    head = "| head | setting | " + " | ".join("ε = ∞ (non-private)" if e == "inf" else f"ε = {e}" for e in eps) + " |"
    lines = [f"## {ds}", "", "Macro accuracy (%) over the test domains, mean ± std over seeds.", "",
             head, "|" + "---|" * (len(eps) + 2)]
    settings = [("released", tau, f"SLOT τ={tau}, maps from released stats"),
                ("exact", tau, f"SLOT τ={tau}, maps from exact stats (not covered)"),
                ("released", "0", "no SLOT (τ=0)")]
    for h in heads:
        for ms, t, label in settings:
            row = []
            for e in eps:
                reps = by.get((e, "none" if e == "inf" else ms), {})
                row.append(pm(accuracies(reps, h, t)) if reps else "—")
            if any(c != "—" for c in row[:-1]):
                lines.append(f"| {NAMES.get(h, h)} | {label} | " + " | ".join(row) + " |")
    return lines + [""]


def plot(runs, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    for ds in sorted(runs):
        by = runs[ds]
        r0 = next(r for reps in by.values() for r in reps.values())
        tau = f"{r0['tau']:g}"
        eps = sorted({e for e, ms in by if e != "inf" and ms == "released"}, key=eps_value)
        for h in sorted(r0["heads"], key=lambda h: (list(NAMES).index(h) if h in NAMES else 9, h)):
            c = next(colors)
            acc = [accuracies(by[(e, "released")], h, tau) for e in eps]
            x = [float(e) for e in eps]
            m = [100 * np.mean(a) for a in acc]
            s = [100 * np.std(a) for a in acc]
            label = f"{NAMES.get(h, h).split(' (')[0]} + SLOT, {ds}"
            ax.errorbar(x, m, yerr=s, color=c, marker="o", capsize=3, label=label)
            if ("inf", "none") in by:
                ax.axhline(100 * np.mean(accuracies(by[("inf", "none")], h, tau)), color=c, ls="--", lw=1)
    ax.set_xscale("log")
    ticks = sorted({float(e) for by in runs.values() for e, _ in by if e != "inf"})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ε per client (total over everything it sends; δ fixed)")
    ax.set_ylabel("macro accuracy (%)")
    ax.set_title("Accuracy vs privacy budget (dashed: non-private)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    ap.add_argument("--plot", type=Path, default=Path(__file__).with_name("dp_accuracy.png"))
    args = ap.parse_args()
    runs = load(args.grid)
    if not runs:
        raise SystemExit(f"error: no DP grid reports under {args.grid}")
    log = args.grid / "timing.jsonl"
    timing = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()] if log.exists() else []
    plot(runs, args.plot)
    lines = ["# Differentially private SLOT-Align, FedCGS and Fed3R messages: results", "",
             f"Generated by `make_results.py` from the reports of `run_dp.py`. Do not edit by hand. "
             f"Plot: `{args.plot.name}`.", ""]
    lines += protocol(runs, timing) + ["", "## What is and is not protected", ""]
    lines += [f"- {p}" for p in PROTECTED] + [""]
    for ds in sorted(runs):
        lines += table(ds, runs[ds])
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output} and {args.plot}")


if __name__ == "__main__":
    main()

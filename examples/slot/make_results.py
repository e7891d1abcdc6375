"""Build examples/slot/RESULTS.md from the `fedalign evaluate` JSON reports of the grid.

Reports are named ``<reports>/<dataset>/a<alpha>_s<seed>_t<tau>.json`` (one partition seed,
one head seed = the same seed, one τ; τ = 0 is the unaligned baseline). For every dataset, α,
τ and head the macro accuracy (mean over test domains) is aggregated over seeds as
mean ± std (ddof = 0).

    python make_results.py /tmp/fedalign-slot/reports -o RESULTS.md [--notes notes.md]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedalign.files import read_report

NAME = re.compile(r"a(?P<alpha>[0-9.]+|none)_s(?P<seed>\d+)_t(?P<tau>[0-9.]+)\.json$")
HEADLINE_TAU = 0.4  # the reference implementation's fixed-mode default
PAPER = ("For orientation, the SLOT-Align paper reports on Office-Home at α = 0.1: "
         "O-FedAvg 64.2 → 72.1, FedCGS 84.4 → 85.1, FedPFT 74.2 → 80.7 (different backbone, "
         "dataset and client setup; not a target for these numbers).")


def load(reports: Path):
    """{dataset: {(alpha, tau, method): {seed: (macro, {domain: acc})}}}, domains per dataset."""
    data = defaultdict(lambda: defaultdict(dict))
    domains = {}
    for path in sorted(reports.glob("*/*.json")):
        m = NAME.search(path.name)
        if not m:
            continue
        rep = read_report(path)
        alpha, seed, tau = m["alpha"], int(m["seed"]), float(m["tau"])
        al = rep.get("alignment")
        found = 0.0 if al is None else float(al["tau"])
        if abs(found - tau) > 1e-12:
            raise SystemExit(f"{path}: name says τ={tau}, report says τ={found}")
        ds = path.parent.name
        domains[ds] = rep["domains"]
        for method, res in rep["methods"].items():
            data[ds][(alpha, tau, method)][seed] = (res["macro_per_seed"][0], res["per_seed"][0])
    return data, domains


#: number of seeds of a full cell; cells with fewer are marked "(n=…)"
FULL = {"n": 0}


def pm(values, digits=1) -> str:
    v = 100 * np.asarray(values, float)
    if not len(v):
        return "—"
    mark = f" (n={len(v)})" if len(v) < FULL["n"] else ""
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}{mark}"


def alpha_key(a):
    return float("inf") if a == "none" else -float(a)


def dataset_section(ds, cells, domains) -> list:
    alphas = sorted({k[0] for k in cells}, key=alpha_key)
    taus = sorted({k[1] for k in cells})
    methods = list(dict.fromkeys(k[2] for k in cells))
    seeds = sorted({s for v in cells.values() for s in v})
    FULL["n"] = max(len(v) for v in cells.values())
    lines = [f"## {ds}", "", f"Test domains: {', '.join(domains)}. Seeds: {', '.join(map(str, seeds))} "
             f"(partition seed = head seed; a cell with fewer seeds is marked n=…). Macro accuracy (%) "
             "over test domains, mean ± std over seeds.", ""]

    def macro(a, t, m, seeds=None):
        c = cells.get((a, t, m), {})
        return [c[k][0] for k in sorted(c) if seeds is None or k in seeds]

    def paired(a, m):
        """Seeds with both the baseline and the headline-τ report."""
        return set(cells.get((a, 0.0, m), {})) & set(cells.get((a, head_tau, m), {}))

    aligned = [t for t in taus if t > 0]
    if not aligned:
        return lines + ["No aligned (τ > 0) results for this dataset: baseline only.", ""] + [
            "| head | " + " | ".join(f"α={a}" for a in alphas) + " |", "|" + "---|" * (len(alphas) + 1)] + [
            f"| {m} | " + " | ".join(pm(macro(a, 0.0, m)) for a in alphas) + " |" for m in methods] + [""]
    head_tau = HEADLINE_TAU if HEADLINE_TAU in taus else aligned[0]
    lines += [f"### Baseline vs +SLOT (τ = {head_tau:g})", ""]
    hdr = ["head"] + [f"α={a} {c}" for a in alphas for c in ("baseline", f"+SLOT", "Δ")]
    lines += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for m in methods:
        row = [m]
        for a in alphas:
            P = paired(a, m)
            b, s = macro(a, 0.0, m, P), macro(a, head_tau, m, P)
            diff = [y - x for x, y in zip(b, s)]
            row += [pm(b), pm(s), (f"{100 * np.mean(diff):+.1f}" if diff else "—")]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Only seeds with both reports enter this table (paired: same partition, same head "
              "seed); Δ is the mean paired difference in points.", ""]

    lines += ["### τ sweep (macro accuracy %, τ = 0 is the baseline)", ""]
    hdr = ["head", "α"] + [f"τ={t:g}" for t in taus] + ["best τ (test-selected)"]
    lines += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for m in methods:
        for a in alphas:
            means = {t: np.mean(macro(a, t, m)) for t in taus if macro(a, t, m)}
            best = max(means, key=means.get) if means else None
            row = [m, a] + [pm(macro(a, t, m)) for t in taus] + [f"{best:g}" if best is not None else "—"]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "The best-τ column picks τ on the test accuracy itself: an optimistic oracle, shown "
              "only to read the sweep; the headline table uses the fixed default τ.", ""]

    lines += [f"### Per-domain accuracy (%), baseline → +SLOT (τ = {head_tau:g}), paired seeds", ""]
    hdr = ["head", "α"] + list(domains)
    lines += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for m in methods:
        for a in alphas:
            row = [m, a]
            P = paired(a, m)
            for d in domains:
                b = [v[1][d] for k, v in cells.get((a, 0.0, m), {}).items() if k in P]
                s = [v[1][d] for k, v in cells.get((a, head_tau, m), {}).items() if k in P]
                row.append(f"{100 * np.mean(b):.1f} → {100 * np.mean(s):.1f}" if b and s else "—")
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=Path("RESULTS.md"))
    ap.add_argument("--notes", type=Path, default=Path(__file__).with_name("notes.md"),
                    help="hand-written protocol notes and deviations, included verbatim")
    args = ap.parse_args()
    data, domains = load(args.reports)
    if not data:
        raise SystemExit(f"no reports under {args.reports}")
    lines = ["# SLOT-Align reproduction: results", "",
             "Generated by `make_results.py` from the `fedalign evaluate` JSON reports "
             "(`make -C examples/slot results`). Do not edit by hand.", ""]
    if args.notes.exists():
        lines += [args.notes.read_text().rstrip(), ""]
    lines += [PAPER, ""]
    for ds in sorted(data):
        lines += dataset_section(ds, data[ds], domains[ds])
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output} ({sum(len(v) for v in data.values())} cells)")


if __name__ == "__main__":
    main()

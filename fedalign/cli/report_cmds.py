"""``report``: one table from several evaluation reports (e.g. baseline vs +SLOT)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fedalign.cli.app import command
from fedalign.cli.console import out


@command("report", epilog="Example: fedalign report base.json slot.json dadil.json")
def report_cmd(
    reports: List[Path] = typer.Argument(..., help="Report files (.json) from evaluate or dadil-evaluate."),
    label: Optional[List[str]] = typer.Option(None, "--label", help="Column labels, one per report (repeat)."),
):
    """Print methods × reports: macro accuracy (%), mean ± std over seeds."""
    from rich.table import Table

    from fedalign.errors import FedalignError
    from fedalign.files import read_report, report_accuracies

    if label and len(label) != len(reports):
        raise FedalignError("give one --label per report")
    cols, rows = [], {}
    for i, path in enumerate(reports):
        rep = read_report(path)
        producer, results = report_accuracies(rep, path)
        if producer == "evaluate":
            al = rep.get("alignment")
            name = "baseline" if not al else f"+SLOT τ={al['tau']:g}"
            vals = {m: r["summary"]["macro"] for m, r in results.items()}
        else:  # fedalign dadil-evaluate
            name = f"target {rep.get('domain', '?')}"
            vals = dict(results)
        cols.append(label[i] if label else f"{name}\n{Path(path).name}")
        for m, v in vals.items():
            rows.setdefault(m, {})[i] = v
    table = Table(title="accuracy (%), mean ± std over seeds (macro over domains)")
    table.add_column("method")
    for c in cols:
        table.add_column(c, justify="right")
    for m, vals in rows.items():
        table.add_row(m, *[f"{100 * vals[i]['mean']:.1f} ± {100 * vals[i]['std']:.1f}" if i in vals
                           else "" for i in range(len(cols))])
    out.print(table)

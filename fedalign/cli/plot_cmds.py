"""``plot embedding`` and ``plot accuracy``: PNG pictures of features and results."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fedalign.cli.app import app, command, err

plot_app = typer.Typer(help="PNG pictures: feature embeddings and accuracy bars.",
                       no_args_is_help=True)
app.add_typer(plot_app, name="plot")


@command("embedding", typer_app=plot_app,
         epilog="Example: fedalign plot embedding c0.h5 c1.h5 --after c0.al.h5 --after c1.al.h5 -o emb.png")
def embedding_cmd(
    features: List[Path] = typer.Argument(..., help="Features files, one per client."),
    after: Optional[List[Path]] = typer.Option(None, "--after", help="Aligned files, same order (repeat)."),
    output: Path = typer.Option(Path("embedding.png"), "-o", "--output", help="PNG to write."),
    method: str = typer.Option("pca", help="pca or tsne."),
    max_points: int = typer.Option(500, help="Rows drawn per file."),
    seed: int = typer.Option(0, help="Subsampling / t-SNE seed."),
):
    """2-D projection of client features before (and after) alignment.

    Coloured by client, marked by class; both panels share the PCA fitted on the originals.
    """
    from fedalign.plot import plot_embedding

    plot_embedding(features, after or None, output, method, max_points, seed)
    err.print(f"plot: wrote {output}")


@command("accuracy", typer_app=plot_app,
         epilog="Example: fedalign plot accuracy base.json slot.json --method fedcgs -o acc.png")
def accuracy_cmd(
    reports: List[Path] = typer.Argument(..., help="Report files from `fedalign evaluate --json`."),
    method: Optional[str] = typer.Option(None, help="Method to draw (default: the first in each report)."),
    label: Optional[List[str]] = typer.Option(None, "--label", help="Bar labels, one per report (repeat)."),
    output: Path = typer.Option(Path("accuracy.png"), "-o", "--output", help="PNG to write."),
    title: str = typer.Option("Per-domain accuracy", help="Figure title."),
):
    """Grouped bars of per-domain accuracy (and the mean) for several reports."""
    from fedalign.errors import FedalignError
    from fedalign.plot import accuracy_series_from_reports, plot_accuracy

    if label and len(label) != len(reports):
        raise FedalignError("give one --label per report")
    plot_accuracy(accuracy_series_from_reports(reports, method, label), output, title)
    err.print(f"plot: wrote {output}")

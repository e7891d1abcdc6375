"""``plot embedding``, ``plot accuracy`` and ``plot reconstruction``: PNG pictures of features
and results."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fedalign import defaults

from fedalign.cli.app import app, command
from fedalign.cli.console import err
from fedalign.cli.help import HelpGroup
from fedalign.cli.options import choice_option, output_option

plot_app = typer.Typer(cls=HelpGroup,
                       help="PNG pictures: feature embeddings, accuracy bars and a DaDiL "
                            "target's reconstruction by its barycenter.",
                       epilog="Example: fedalign plot embedding c0.h5 c1.h5 --after c0.al.h5 "
                              "--after c1.al.h5 -o emb.png\n"
                              "Example: fedalign plot accuracy base.json slot.json --method fedcgs "
                              "-o acc.png",
                       no_args_is_help=True)
app.add_typer(plot_app, name="plot")


@command("embedding", typer_app=plot_app, outputs=("output",),
         epilog="Example: fedalign plot embedding c0.h5 c1.h5 --after c0.al.h5 --after c1.al.h5 -o emb.png")
def embedding_cmd(
    features: List[Path] = typer.Argument(..., help="Features files, one per client."),
    after: Optional[List[Path]] = typer.Option(None, "--after", help="Aligned files, same order (repeat)."),
    output: Path = output_option("PNG to write.", default=Path("embedding.png")),
    method: str = choice_option("pca", "--method", ("pca", "tsne"), "pca or tsne."),
    max_points: int = typer.Option(500, min=2, help="Rows drawn per file."),
    seed: int = typer.Option(0, min=0, max=defaults.MAX_SEED, help="Subsampling / t-SNE seed."),
):
    """2-D projection of client features before (and after) alignment.

    Coloured by client, marked by class; both panels share the PCA fitted on the originals.
    """
    from fedalign.plot import plot_embedding

    plot_embedding(features, after or None, output, method, max_points, seed)
    err.print(f"plot: wrote {output}")


@command("accuracy", typer_app=plot_app, outputs=("output",),
         epilog="Example: fedalign plot accuracy base.json slot.json --method fedcgs -o acc.png")
def accuracy_cmd(
    reports: List[Path] = typer.Argument(..., help="Report files from `fedalign evaluate --json`."),
    method: Optional[str] = typer.Option(None, help="Method to draw (default: the first in each report)."),
    label: Optional[List[str]] = typer.Option(None, "--label", help="Bar labels, one per report (repeat)."),
    output: Path = output_option("PNG to write.", default=Path("accuracy.png")),
    title: str = typer.Option("Per-domain accuracy", help="Figure title."),
):
    """Grouped bars of per-domain accuracy (and the mean) for several reports."""
    from fedalign.errors import FedalignError
    from fedalign.plot import accuracy_series_from_reports, plot_accuracy

    if label and len(label) != len(reports):
        raise FedalignError("give one --label per report")
    plot_accuracy(accuracy_series_from_reports(reports, method, label), output, title)
    err.print(f"plot: wrote {output}")


@command("reconstruction", typer_app=plot_app, outputs=("output",),
         epilog="Example: fedalign plot reconstruction --state fed/state/webcam.state.npz "
                "webcam.test.h5 --missing 3,7 -o reconstruction.png\n\n"
                "From the envelope study: fedalign plot reconstruction --atoms amazon.atoms.npz "
                "--alpha envelope.json:reduced webcam.test.h5 -o reconstruction.png")
def reconstruction_cmd(
    features: Path = typer.Argument(..., help="The target's labelled features (.h5), e.g. its test split: the 'real' points."),
    state: Optional[Path] = typer.Option(None, "--state", help="The target client's state: samples of B(α_T; its atoms) with its own α_T."),
    atoms: Optional[Path] = typer.Option(None, "--atoms", help="A dictionary (atoms or state file) to use with --alpha."),
    alpha: Optional[str] = typer.Option(None, "--alpha", help="α_T: weights (0.2,0.5,0.3) or REPORT.json[:NAME], the α a dadil-envelope report fitted on GMM NAME (overrides the state's)."),
    missing: Optional[str] = typer.Option(None, "--missing", help="Classes removed from the target's adaptation data, indices or names (3,7): drawn in colour, the others in grey. Default: those of the --alpha report."),
    output: Path = output_option("PNG to write.", default=Path("reconstruction.png")),
    n_per_class: int = typer.Option(200, "--n-per-class", min=1, help="Samples of B(α_T) per class."),
    method: str = choice_option("tsne", "--method", ("tsne", "pca"), "tsne (scikit-learn t-SNE, joint) or pca."),
    max_points: int = typer.Option(1000, "--max-points", min=1, help="Real rows and samples drawn, each (uniform subsample)."),
    seed: int = typer.Option(0, min=0, max=defaults.MAX_SEED, help="Sampling, subsampling and t-SNE seed."),
):
    """Real target features and samples of its barycenter B(α_T) in one 2-D embedding.

    The paper's reconstruction picture (GMM-DaDiL, Figure 5): classes removed from the
    target's adaptation data (--missing) are coloured, present ones grey; circles are real
    target features, crosses samples of B(α_T; atoms). Crosses of a missing class over the
    circles of that class mean the dictionary reconstructs the class the target never showed.
    """
    from fedalign.dadil.envelope import (barycenter, check_test, load_dictionary, parse_classes,
                                         read_alpha)
    from fedalign.dadil.state import client_barycenter, load_state
    from fedalign.errors import FedalignError
    from fedalign.files import read_features
    from fedalign.gmm_head import sample_balanced
    from fedalign.plot import plot_reconstruction

    if (state is None) == (atoms is None):
        raise FedalignError("give either --state (the target's state) or --atoms with --alpha")
    inputs = [features, state, atoms, alpha.rpartition(":")[0] if alpha else None]
    if any(p and Path(p).resolve() == output.resolve() for p in inputs):
        raise FedalignError(f"-o {output} is one of the inputs: refusing to overwrite it")
    dic, source = load_dictionary(state if state is not None else atoms)
    a, a_info = None, dict(missing_classes=None)
    if alpha is not None:
        a, a_info = read_alpha(alpha, dic.n_atoms, source["sha256"])
    elif "alpha" in source:
        a = source["alpha"]
    else:
        raise FedalignError(f"{source['path']} is an atoms file: give the target's --alpha")
    X, y, info = read_features(features)
    names = info["class_names"]
    Xr, yr = check_test(dic, X, y, names, where=str(features))
    if missing is not None:
        miss = parse_classes(missing, names, dic.n_classes)
    elif a_info["missing_classes"] is not None:
        miss = list(a_info["missing_classes"])
    else:
        raise FedalignError("give --missing (the classes removed from the target's data)")
    if state is not None:
        B = client_barycenter(load_state(state), a)
    else:
        B = barycenter(dic, a)
    Xs, ys = sample_balanced(B, int(n_per_class), int(seed))
    res = plot_reconstruction(Xr, yr, Xs, ys, miss, output, method, seed, max_points,
                              names or None)
    counts = {(g["source"], g["classes"]): g["n"] for g in res["groups"]}
    per = ", ".join(f"{c}: {counts[('real', c)]} real / {counts[('reconstructed', c)]} "
                    f"reconstructed" for c in miss)
    err.print(f"plot: wrote {output} ({res['n_real']} real rows, {res['n_samples']} samples of "
              f"B(α_T = {'/'.join(f'{v:.2f}' for v in a)}); missing classes: {per or 'none'})")

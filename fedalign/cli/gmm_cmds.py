"""``fit-gmm``: a client's labeled (or unlabeled) diagonal Gaussian mixture."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from fedalign import defaults

from fedalign.cli.app import command
from fedalign.cli.console import err
from fedalign.cli.options import choice_option, output_option


@command("fit-gmm", outputs=("output",), epilog="Example: fedalign fit-gmm client3.h5 -o client3.gmm.npz "
                           "--components-per-class 5")
def fit_gmm_cmd(
    features: Path = typer.Argument(..., help="Features file (.h5)."),
    output: Path = output_option("GMM file to write (.npz)."),
    components_per_class: int = typer.Option(5, "--components-per-class", "-k", min=1,
                                             help="Components per class (k); unlabeled: C·k in all."),
    class_weights: str = choice_option("balanced", "--class-weights", "fedalign.gmm:CLASS_WEIGHTS", "balanced (each class mass 1/C) or prior (n_c/n)."),
    unlabeled: bool = typer.Option(False, "--unlabeled", help="Ignore labels: one GMM with C·k components."),
    n_classes: Optional[int] = typer.Option(None, "--n-classes", min=1,
                                            help="C (default: the file's class names, else max label + 1)."),
    var_floor_rel: float = typer.Option(0.01, "--var-floor-rel", help="Variance floor per dimension as a fraction of that dimension's variance over the file (a rule that ignores the features' scale)."),
    min_var: Optional[float] = typer.Option(None, "--min-var", help="Absolute variance floor instead of --var-floor-rel (also EM regularisation)."),
    seed: int = typer.Option(0, min=0, max=defaults.MAX_SEED, help="EM initialisation seed (same seed → same file)."),
    max_iter: int = typer.Option(100, min=1, help="Maximum EM iterations per mixture."),
    tol: float = typer.Option(1e-3, min=0.0, help="EM tolerance on the mean log-likelihood."),
):
    """Fit a diagonal GMM to a features file (scikit-learn EM in float64).

    Labeled rows: one mixture of k components per class, concatenated with one-hot labels
    (a class with fewer than k samples gets fewer components). Unlabeled rows (label −1) or
    --unlabeled: one mixture of C·k components without labels. The file holds the mixture
    only, no samples; it stays with its client.
    """
    from fedalign.gmm import fit_gmm_file

    t0 = time.perf_counter()
    g = fit_gmm_file(features, output, components_per_class, unlabeled=unlabeled,
                     n_classes=n_classes, class_weights=class_weights, min_var=min_var,
                     seed=seed, max_iter=max_iter, tol=tol, var_floor_rel=var_floor_rel)
    n = sum(r["n"] for r in g.meta["fit"])          # the rows fitted (labeled ones, if labeled)
    not_conv = sum(not r["converged"] for r in g.meta["fit"])
    kind = "labeled" if g.labeled else "unlabeled"
    k, C = components_per_class, g.meta["n_classes"]   # an unlabeled GMM may have no class names
    if g.K == C * k:
        parts = f"K={g.K} components = C·k = {C}·{k}"
    else:  # a class with fewer than k samples gets fewer components
        parts = f"K={g.K} components (≤ C·k = {C}·{k}: small classes get fewer)"
    err.print(f"fit-gmm: {kind} n={n} d={g.d} {parts} "
              f"({len(g.meta['fit'])} EM fits, {not_conv} not converged, "
              f"{time.perf_counter() - t0:.2f}s) → {output}")

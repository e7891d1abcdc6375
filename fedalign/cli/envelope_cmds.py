"""``dadil-envelope``: the barycentric-envelope study of a fixed dictionary (GMM-DaDiL Table 3)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from fedalign.cli.app import command
from fedalign.cli.console import err, out
from fedalign.cli.options import choice_option, json_option, seeds_option, threads_option


def _named_paths(specs, option: str) -> dict:
    """``NAME=FILE`` (or ``FILE``: the name is the file name up to its first dot) → {name: Path}."""
    from fedalign.errors import FedalignError

    named = {}
    for spec in specs or []:
        name, eq, path = str(spec).partition("=")
        name, path = (name.strip(), path) if eq else (Path(spec).name.split(".")[0], spec)
        if not name or not path:
            raise FedalignError(f"{option}: expected NAME=FILE, got {spec!r}")
        if name in named:
            raise FedalignError(f"{option}: the name {name!r} is given twice")
        named[name] = Path(path)
    return named


def _named_classes(specs, class_names, n_classes) -> dict:
    """``NAME=3,7`` → {name: [3, 7]} (indices or class names)."""
    from fedalign.dadil.envelope import parse_classes
    from fedalign.errors import FedalignError

    named = {}
    for spec in specs or []:
        name, eq, classes = str(spec).partition("=")
        if not eq or not name.strip():
            raise FedalignError(f"--missing: expected NAME=CLASSES (e.g. reduced=3,7), "
                                f"got {spec!r}")
        named[name.strip()] = parse_classes(classes, class_names, n_classes)
    return named


@command("dadil-envelope", outputs=("json_out",),
         epilog="Example: fedalign dadil-envelope --atoms fed/round_050/amazon.atoms.npz "
                "--gmm full=webcam.gmm.npz --gmm reduced=webcam.m45.gmm.npz "
                "--missing reduced=3,7 --test webcam.test.h5 --seeds 0-4 --steps 200 "
                "--json envelope.json")
def envelope_cmd(
    atoms: Path = typer.Option(..., "--atoms", help="One source client's dictionary, learned without the target: a published atoms file or its state file."),
    gmm: List[str] = typer.Option(..., "--gmm", help="NAME=FILE: a target GMM (fit-gmm) to reconstruct, e.g. full=webcam.gmm.npz; repeat (e.g. reduced=webcam.m45.gmm.npz)."),
    test: Path = typer.Option(..., "--test", help="The target's labelled test features (.h5), never used to fit the GMMs."),
    missing: Optional[List[str]] = typer.Option(None, "--missing", help="NAME=CLASSES: classes removed from that GMM's data (indices or names, e.g. reduced=3,7); reports accuracy on them. Default for a labeled GMM: classes without a component."),
    classifier: Optional[List[str]] = typer.Option(None, "--classifier", help="linear (head on samples of B(α_T)) and/or map: linear,map or repeat (default: both)."),
    n_per_class: int = typer.Option(500, "--n-per-class", min=1, help="Samples per class of B(α_T) for the linear head."),
    seeds_opt: List[str] = seeds_option("Sampling seeds of the linear head: 0,1,2 or 0-4."),
    steps: int = typer.Option(100, "--steps", min=1, help="Steps of the α fit (fedalign.dadil.dictionary.fit_alpha)."),
    rule: str = choice_option("projected", "--rule", "fedalign.dadil.optim:ALPHA_RULES", "α update rule of fedalign.dadil.dictionary.fit_alpha: projected (gradient step + projection onto the simplex, as in the paper), newton or eg."),
    tol: float = typer.Option(1e-9, "--tol", min=0.0, help="Stop the α fit when α changes by less than this."),
    labeled: bool = typer.Option(False, "--labeled", help="Fit α on SMW2² with the target GMM's labels (oracle) instead of MW2² (as the unlabeled target would)."),
    json_out: Optional[Path] = json_option("Write the report (JSON): α, fit record, loss and accuracies per GMM."),
    threads: int = threads_option("BLAS threads (1 is fastest for these small matrices)."),
):
    """Barycentric envelope: can a source's fixed dictionary express the target?

    Keeps the atoms P of ONE source client fixed and fits the target's barycentric weights
    alone on each --gmm Q_T: α_T = argmin over the simplex of MW2²(Q_T, B(α; P)). Reports α_T,
    the reconstruction loss MW2²(Q_T, B(α_T; P)) (features only) and the accuracy on the
    --test features of a linear head trained on samples of B(α_T; P) (mean ± std over --seeds)
    and of the MAP rule, overall and on the --missing classes. With a full and a reduced
    target GMM (some classes removed before fitting), a high accuracy on the missing classes
    means B(α_T; P) reconstructs them from the sources (Montesuma et al., GMM-DaDiL,
    Section 5.2, Table 3).
    """
    from rich import box
    from rich.table import Table

    from fedalign.cli.options import parse_seeds
    from fedalign.dadil.classifiers import parse_classifiers
    from fedalign.dadil.envelope import envelope_study, load_dictionary
    from fedalign.errors import FedalignError
    from fedalign.files import read_features, write_report
    from fedalign.gmm import load_gmm
    from fedalign.threads import limit_threads

    limit_threads(threads)
    t0 = time.perf_counter()
    heads = list(parse_classifiers(classifier))
    seeds = parse_seeds(seeds_opt)
    gmm_paths = _named_paths(gmm, "--gmm")
    if json_out is not None:
        inputs = [atoms, test, *gmm_paths.values()]
        if any(json_out.resolve() == Path(p).resolve() for p in inputs):
            raise FedalignError(f"--json {json_out} is one of the inputs: refusing to overwrite it")
    dic, source = load_dictionary(atoms)
    gmms = {name: load_gmm(p) for name, p in gmm_paths.items()}
    X, y, info = read_features(test)
    names = info["class_names"]
    miss = _named_classes(missing, names, dic.n_classes)
    unknown = set(miss) - set(gmms)
    if unknown:
        raise FedalignError(f"--missing names {sorted(unknown)[0]!r}, which is not a --gmm name "
                            f"({', '.join(gmms)})")
    rep = envelope_study(dic, gmms, X, y, classifiers=heads, n_per_class=n_per_class,
                         seeds=seeds, n_steps=steps, labeled=labeled, rule=rule, tol=tol,
                         missing=miss, class_names=names or None)
    targets = rep["targets"]
    any_missing = any(r["missing_classes"] for r in targets.values())
    table = Table(box=box.SIMPLE_HEAD,
                  title=f"barycentric envelope of {source['client']}'s atoms (round "
                        f"{source['round']}, A={dic.n_atoms}) on {test.name}: accuracy (%), "
                        f"{len(seeds)} seed(s)")
    table.add_column("GMM", no_wrap=True)
    table.add_column("α_T", no_wrap=True)
    table.add_column("MW2²", justify="right", no_wrap=True)
    for h in heads:
        table.add_column(h, justify="right", style="bold", no_wrap=True)
        if any_missing:
            table.add_column(f"{h} on\nmissing", justify="right", no_wrap=True)
    for name, r in targets.items():
        cells = []
        for h in heads:
            a = r["accuracy"][h]
            cells.append(f"{100 * a['mean']:.1f}±{100 * a['std']:.1f}")
            if any_missing:
                m = a.get("missing_classes")
                cells.append("—" if m is None else f"{100 * m:.1f}")
        table.add_row(name, "/".join(f"{v:.2f}" for v in r["alpha"]), f"{r['loss']:.3g}",
                      *cells)
    out.print(table)
    if json_out is not None:
        from fedalign.files import sha256_file

        rep = dict(producer="fedalign dadil-envelope", source=source,
                   test=dict(path=str(test), sha256=sha256_file(test)),
                   gmms={n: dict(path=str(p), sha256=sha256_file(p)) for n, p in gmm_paths.items()},
                   **rep)
        write_report(json_out, rep)
    err.print(f"dadil-envelope: {len(gmms)} target GMM(s) × {len(seeds)} seed(s) "
              f"({time.perf_counter() - t0:.1f}s)" + (f" → {json_out}" if json_out else ""))

"""``import``: features computed elsewhere (.npz, .npy, .mat, CSV, HDF5) → a features file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from fedalign.cli.app import command
from fedalign.cli.console import err
from fedalign.cli.options import choice_option, output_option


@command(
    "import", outputs=("output",),
    epilog=(
        "Example: fedalign import amazon.npz -o amazon.h5\n"
        "MATLAB, labels 1…10: fedalign import webcam.mat -o webcam.h5 --label-base 1 --class-names classes.txt\n"
        "A .npy pair: fedalign import webcam_features.npy --labels webcam_labels.npy -o webcam.h5\n"
        "CSV with a header: fedalign import digits.csv -o digits.h5 --labels-key digit --ids-key file"
    ),
)
def import_cmd(
    source: Path = typer.Argument(..., help="File to import: .npz, .npy, .mat (v5 or v7.3), .csv/.tsv/.txt or .h5/.hdf5."),
    output: Path = output_option("Features file to write (.h5)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="npz, npy, mat, csv or h5 (default: from the suffix)."),
    features_key: Optional[str] = typer.Option(None, "--features-key", help="Array, MATLAB variable or HDF5 dataset of the (n, d) features (default: the first of features, fts, feats, X, data)."),
    labels_key: Optional[str] = typer.Option(None, "--labels-key", help="Labels array / variable / dataset, or CSV column name or index (-1: the last) (default: the first of labels, label, y, targets, class)."),
    ids_key: Optional[str] = typer.Option(None, "--ids-key", help="Per-row ids (default: ids or id when present, else SOURCE-STEM/ROW)."),
    class_names_key: Optional[str] = typer.Option(None, "--class-names-key", help="Array / variable / dataset of class names (default: class_names, classes or categories when present)."),
    labels_file: Optional[Path] = typer.Option(None, "--labels", help="Labels from their own file (.npy, or one label per line); for a .npy the default is its sibling (X_features.npy → X_labels.npy, X.npy → y.npy)."),
    class_names: Optional[str] = typer.Option(None, "--class-names", help="Class names: a file with one name per line, or a,b,c (default: from the data, the string labels, or the label values)."),
    label_base: int = typer.Option(0, "--label-base", help="Integer labels are class indices counted from this value (1 for MATLAB's 1…C labels); -1 after the shift is unlabeled."),
    label_values: str = choice_option("index", "--label-values", "fedalign.importers:LABEL_VALUES", "index (labels are class indices) or sorted (the distinct values, sorted, become 0…K-1: for ±1 labels or sparse codes)."),
    unlabeled: bool = typer.Option(False, "--unlabeled", help="Ignore labels: every row is unlabeled (-1)."),
    delimiter: Optional[str] = typer.Option(None, "--delimiter", help="CSV delimiter (default: tab for .tsv, else the first of , tab ; space in the first line)."),
):
    """Import features computed elsewhere into a fedalign features file (.h5).

    Reads .npz archives (features/labels, as the SLOT-Align reference code writes them), .npy
    pairs, MATLAB .mat files (fts/labels, the classic domain-adaptation benchmarks), CSV and
    plain HDF5. The features must be finite numbers (n, d); labels become class indices (see
    --label-base and --label-values); the source, its SHA-256, the keys read and the label
    rule go into the file's provenance.
    """
    from fedalign.importers import import_features

    t0 = time.perf_counter()
    res = import_features(source, output, fmt, features_key=features_key, labels_key=labels_key,
                          ids_key=ids_key, class_names_key=class_names_key, labels_file=labels_file,
                          class_names=class_names, label_base=label_base,
                          label_values=label_values, unlabeled=unlabeled, delimiter=delimiter)
    for note in res.notes:  # (in the command's words: fedalign.errors.spell)
        err.print(f"import: note: {note}", markup=False)
    keys = ", ".join(f"{k}={v}" for k, v in res.keys.items())
    shown = ", ".join(res.class_names[:10]) + (", …" if len(res.class_names) > 10 else "")
    err.print(f"import: {res.format} ({keys}): n={res.n} d={res.d}, {len(res.class_names)} classes"
              f"{f' ({shown})' if shown else ''}, {res.n_labeled} labeled rows "
              f"({time.perf_counter() - t0:.2f}s) → {res.output}", markup=False)

"""Deterministic stratified subsample of the digits domains as list files for `fedalign extract`.

For each domain and each digit class the first ``--per-class`` files are kept, in sorted file
order (for USPS the ``test_*`` files come first, then ``train_*``). The list files hold
``path,label`` rows with paths relative to the domain folder, so extract them with ``--root``:

    python examples/extract/digits_subsample.py ../shared/data/digits -o lists/ --per-class 100
    fedalign extract lists/mnist.csv --root ../shared/data/digits/mnist -o mnist.h5

Grayscale images (MNIST, USPS) are converted to RGB by the extractor.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

DOMAINS = ("mnist", "usps", "mnistm")


def class_files(folder: Path, domain: str) -> list:
    """Image files of one class folder in selection order."""
    files = sorted(p.name for p in folder.iterdir() if p.suffix.lower() == ".png")
    if domain == "usps":
        files = [f for f in files if f.startswith("test_")] + [f for f in files if not f.startswith("test_")]
    return files


def subsample(root: Path, domain: str, per_class: int) -> list:
    """``[(relative path, label)]``: the first ``per_class`` files of every class 0..9."""
    rows = []
    for c in range(10):
        files = class_files(root / domain / str(c), domain)
        if len(files) < per_class:
            raise SystemExit(f"{domain}/{c}: only {len(files)} images, need {per_class}")
        rows += [(f"{c}/{f}", c) for f in files[:per_class]]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("digits", type=Path, help="the digits folder (holds mnist/ usps/ mnistm/)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="folder for <domain>.csv lists")
    ap.add_argument("--per-class", type=int, default=100)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for d in DOMAINS:
        rows = subsample(args.digits, d, args.per_class)
        with open(args.out / f"{d}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["path", "label"])
            w.writerows(rows)
        print(f"{d}: {len(rows)} rows -> {args.out / (d + '.csv')}")


if __name__ == "__main__":
    main()

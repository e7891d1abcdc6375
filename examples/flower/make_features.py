#!/usr/bin/env python
"""Small labeled features files for the launcher's cost runs: D domains of Gaussian classes,
each domain shifted and scaled (a few hundred rows, low d: a run of 20 sites fits in minutes).

    python examples/flower/make_features.py -o feats/ --domains 3 --rows 1200 -d 8 --classes 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def make(out: Path, domains: int, rows: int, d: int, classes: int, seed: int) -> list:
    from fedalign.files import write_features

    rng = np.random.default_rng(seed)
    mus = rng.normal(size=(classes, d)) * 3
    names = [f"class{c}" for c in range(classes)]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(domains):
        dom = f"dom{i}"
        shift, scale = rng.normal(size=d) * 2, 1 + 0.5 * i
        y = rng.integers(0, classes, rows)
        X = ((mus[y] + rng.normal(size=(rows, d))) * scale + shift).astype(np.float32)
        p = out / f"{dom}.h5"
        write_features(p, X, y, [f"{dom}-{j}" for j in range(rows)], names, dict(domain=dom))
        paths.append(p)
    return paths


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--domains", type=int, default=3)
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("-d", type=int, default=8)
    ap.add_argument("--classes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for p in make(Path(a.out), a.domains, a.rows, a.d, a.classes, a.seed):
        print(p)


if __name__ == "__main__":
    main()

"""Convert the Amazon review features (.mat, Chen et al. 2012) to fedalign features files.

Usage: python amazon_to_h5.py DATA/amazon_review OUT_DIR
Writes OUT_DIR/{books,dvd,elec,kitchen}.h5 (400-d float32, labels 0 = negative, 1 = positive).
"""

import sys
from pathlib import Path

import numpy as np
from scipy.io import loadmat

from fedalign.files import sha256_file, write_features


def main(src, dst):
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for mat in sorted(src.glob("*_400.mat")):
        dom = mat.stem.split("_")[0]
        m = loadmat(mat)
        X = np.asarray(m["fts"], dtype=np.float32)
        y = np.asarray(m["labels"]).ravel().astype(np.int64)
        write_features(dst / f"{dom}.h5", X, y, [f"{dom}/{i:05d}" for i in range(len(y))],
                       class_names=["negative", "positive"],
                       provenance=dict(producer="examples/dadil/amazon_to_h5.py", domain=dom,
                                       source=str(mat), source_sha256=sha256_file(mat)))
        print(f"{dom}: n={len(y)} d={X.shape[1]} → {dst / (dom + '.h5')}")


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""``fedalign import``: generated .npz, .npy pairs, MATLAB v5 and v7.3, CSV and HDF5 files
become features files equal to their source; bad inputs are one error line, exit 2, no file."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.errors import FedalignError
from fedalign.files import read_features
from fedalign.importers import detect_format, encode_labels, import_features, sibling_labels

runner = CliRunner()


def data(n=30, d=5, C=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * 10
    y = np.arange(n) % C
    return X, y


def run(*args):
    r = runner.invoke(app, ["import", *map(str, args)])
    return r


def ok(*args):
    r = run(*args)
    assert r.exit_code == 0, r.output
    return r


def bad(tmp_path, *args, match):
    out = tmp_path / "bad.h5"
    r = run(*args, "-o", out)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and match in errors[0], r.output
    assert "Traceback" not in r.output and not out.exists()
    return errors[0]


def same(path, X, y, names=None):
    X2, y2, info = read_features(path)
    np.testing.assert_array_equal(X2, X.astype(np.float32))
    np.testing.assert_array_equal(y2, y)
    if names is not None:
        assert info["class_names"] == names
    return info


# --------------------------------------------------------------------------------------------
# each format
# --------------------------------------------------------------------------------------------


def test_npz_features_labels(tmp_path):
    X, y = data()
    src = tmp_path / "amazon.npz"
    np.savez(src, features=X, labels=y, class_names=np.array(["bike", "cup", "mug"]))
    r = ok(src, "-o", tmp_path / "a.h5")
    assert "n=30 d=5, 3 classes (bike, cup, mug), 30 labeled rows" in r.output
    info = same(tmp_path / "a.h5", X, y, ["bike", "cup", "mug"])
    prov = info["provenance"]
    assert prov["format"] == "npz" and prov["keys"]["features"] == "features"
    assert prov["labels"] == {"rule": "index", "base": 0} and len(prov["source_sha256"]) == 64
    assert info["ids"][0] == "amazon/00" and len(set(info["ids"])) == 30


def test_npz_other_keys_and_ids(tmp_path):
    X, y = data()
    src = tmp_path / "emb.npz"
    np.savez(src, emb=X, cls=y, ids=np.array([f"img{i}.jpg" for i in range(30)]))
    ok(src, "-o", tmp_path / "e.h5", "--features-key", "emb", "--labels-key", "cls")
    info = same(tmp_path / "e.h5", X, y, ["0", "1", "2"])
    assert str(info["ids"][3]) == "img3.jpg"


def test_npz_X_y_found_without_options(tmp_path):
    X, y = data()
    np.savez(tmp_path / "xy.npz", X=X, y=y)
    ok(tmp_path / "xy.npz", "-o", tmp_path / "xy.h5")
    same(tmp_path / "xy.h5", X, y)


def test_npy_pair_by_sibling_and_by_option(tmp_path):
    X, y = data()
    np.save(tmp_path / "webcam_features.npy", X)
    np.save(tmp_path / "webcam_labels.npy", y.reshape(-1, 1))  # (n, 1) is fine
    assert sibling_labels(tmp_path / "webcam_features.npy") == tmp_path / "webcam_labels.npy"
    ok(tmp_path / "webcam_features.npy", "-o", tmp_path / "w.h5")
    same(tmp_path / "w.h5", X, y)
    np.save(tmp_path / "emb.npy", X)
    (tmp_path / "lab.txt").write_text("\n".join(["cat", "dog", "owl"] * 10) + "\n")
    ok(tmp_path / "emb.npy", "--labels", tmp_path / "lab.txt", "-o", tmp_path / "e.h5",
       "--class-names", "owl,dog,cat")
    same(tmp_path / "e.h5", X, 2 - y, ["owl", "dog", "cat"])


def test_npy_without_labels(tmp_path):
    X, _ = data()
    np.save(tmp_path / "emb.npy", X)
    bad(tmp_path, tmp_path / "emb.npy", match="no labels found: give --labels ")
    ok(tmp_path / "emb.npy", "--unlabeled", "-o", tmp_path / "u.h5")
    same(tmp_path / "u.h5", X, np.full(30, -1))


def test_mat_v5_fts_labels_from_one(tmp_path):
    from scipy.io import savemat

    X, y = data(C=10, n=40)
    names = np.empty((1, 10), dtype=object)
    for i in range(10):
        names[0, i] = f"class{i}"
    savemat(tmp_path / "webcam.mat", {"fts": X, "labels": (y + 1).reshape(-1, 1).astype(float),
                                      "classes": names})
    r = ok(tmp_path / "webcam.mat", "-o", tmp_path / "w0.h5", "--class-names-key", "classes",
           "--label-base", "1")
    same(tmp_path / "w0.h5", X, y, [f"class{i}" for i in range(10)])
    assert "note" not in r.output
    # without --label-base 1 the labels 1…10 do not fit the 10 names: said in one line
    bad(tmp_path, tmp_path / "webcam.mat", match="label 10 is out of range for the 10 class names")
    # without names they are accepted as indices, with a note about MATLAB numbering
    savemat(tmp_path / "plain.mat", {"fts": X, "labels": (y + 1).reshape(-1, 1)})
    r = ok(tmp_path / "plain.mat", "-o", tmp_path / "p.h5")
    assert "import: note: no row has label 0" in r.output and "--label-base 1" in r.output


def test_mat_sparse_features(tmp_path):
    import scipy.sparse
    from scipy.io import savemat

    X, y = data()
    X[X < 5] = 0
    savemat(tmp_path / "s.mat", {"fts": scipy.sparse.csc_matrix(X), "labels": y.reshape(-1, 1)})
    ok(tmp_path / "s.mat", "-o", tmp_path / "s.h5")
    same(tmp_path / "s.h5", X, y)


def _matlab73(path, **arrays):
    """A MATLAB v7.3 file as MATLAB writes it: HDF5 with a 512-byte header, column-major."""
    with h5py.File(path, "w", userblock_size=512) as h:
        for k, v in arrays.items():
            h[k] = np.asarray(v).T
            h[k].attrs["MATLAB_class"] = np.bytes_("double")
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
    with open(path, "r+b") as f:
        f.write(header.ljust(116) + b"\x00" * 8 + b"\x00\x02" + b"IM")


def test_mat_v73_via_h5py(tmp_path):
    X, y = data()
    _matlab73(tmp_path / "big.mat", fts=X, labels=y.reshape(-1, 1).astype(float))
    r = ok(tmp_path / "big.mat", "-o", tmp_path / "b.h5")
    same(tmp_path / "b.h5", X, y)
    assert json.loads(h5py.File(tmp_path / "b.h5")["/"].attrs["provenance"])["detail"] == "MATLAB v7.3"
    assert "mat (features=fts, labels=labels)" in r.output


def test_csv_with_header_string_labels_and_ids(tmp_path):
    X, y = data(d=3)
    names = ["cat", "dog", "owl"]
    lines = ["id,f0,f1,label,f2"] + [f"img{i}.png,{float(X[i, 0])!r},{float(X[i, 1])!r},{names[y[i]]},{float(X[i, 2])!r}"
                                     for i in range(30)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    ok(tmp_path / "t.csv", "-o", tmp_path / "t.h5")
    info = same(tmp_path / "t.h5", X, y, names)
    assert list(info["ids"][:2]) == ["img0.png", "img1.png"]


def test_csv_without_header_label_column_by_index_and_tsv(tmp_path):
    X, y = data(d=4)
    rows = [",".join([repr(float(v)) for v in X[i]] + [str(y[i])]) for i in range(30)]
    (tmp_path / "n.csv").write_text("\n".join(rows))
    bad(tmp_path, tmp_path / "n.csv", match="no labels found: give --labels-key")
    ok(tmp_path / "n.csv", "--labels-key", "-1", "-o", tmp_path / "n.h5")
    same(tmp_path / "n.h5", X, y)
    rows = ["a\tb\tc\td\tlabels"] + ["\t".join([repr(float(v)) for v in X[i]] + [str(y[i])]) for i in range(30)]
    (tmp_path / "t.tsv").write_text("\n".join(rows))
    ok(tmp_path / "t.tsv", "-o", tmp_path / "t.h5")
    same(tmp_path / "t.h5", X, y)


def test_plain_hdf5(tmp_path):
    X, y = data()
    with h5py.File(tmp_path / "p.hdf5", "w") as h:
        h["emb/train"] = X
        h["y"] = y
        h.attrs["class_names"] = ["a", "b", "c"]
    ok(tmp_path / "p.hdf5", "--features-key", "emb/train", "-o", tmp_path / "p.h5")
    same(tmp_path / "p.h5", X, y, ["a", "b", "c"])


def test_format_option_overrides_the_suffix(tmp_path):
    X, y = data()
    np.savez(tmp_path / "feats.npz", features=X, labels=y)
    (tmp_path / "feats.npz").rename(tmp_path / "feats.bin")
    bad(tmp_path, tmp_path / "feats.bin", match="give --format")
    ok(tmp_path / "feats.bin", "--format", "npz", "-o", tmp_path / "f.h5")
    same(tmp_path / "f.h5", X, y)


def test_pm_one_labels_sorted(tmp_path):
    X, _ = data()
    pm = np.where(np.arange(30) % 2, 1, -1)
    np.savez(tmp_path / "pm.npz", features=X, labels=pm)
    ok(tmp_path / "pm.npz", "--label-values", "sorted", "-o", tmp_path / "pm.h5",
       "--class-names", "negative,positive")
    info = same(tmp_path / "pm.h5", X, (pm > 0).astype(int), ["negative", "positive"])
    assert info["provenance"]["labels"] == {"rule": "sorted", "values": ["-1", "1"]}


def test_class_names_from_a_file(tmp_path):
    X, y = data()
    np.savez(tmp_path / "a.npz", features=X, labels=y)
    (tmp_path / "names.txt").write_text("back_pack\nbike\n\ncalculator\n")
    ok(tmp_path / "a.npz", "--class-names", tmp_path / "names.txt", "-o", tmp_path / "a.h5")
    same(tmp_path / "a.h5", X, y, ["back_pack", "bike", "calculator"])


def test_same_input_same_file(tmp_path):
    X, y = data()
    np.savez(tmp_path / "a.npz", features=X, labels=y)
    ok(tmp_path / "a.npz", "-o", tmp_path / "1.h5")
    ok(tmp_path / "a.npz", "-o", tmp_path / "2.h5")
    a, b = read_features(tmp_path / "1.h5"), read_features(tmp_path / "2.h5")
    np.testing.assert_array_equal(a[0], b[0])
    assert (tmp_path / "1.h5").read_bytes() == (tmp_path / "2.h5").read_bytes()
    assert a[2]["provenance"] == b[2]["provenance"] and list(a[2]["ids"]) == list(b[2]["ids"])


def test_the_output_feeds_the_pipeline(tmp_path):
    X, y = data(n=60)
    np.savez(tmp_path / "a.npz", features=X, labels=y)
    ok(tmp_path / "a.npz", "-o", tmp_path / "a.h5")
    r = runner.invoke(app, ["stats", str(tmp_path / "a.h5"), "-o", str(tmp_path / "a.stats.npz")])
    assert r.exit_code == 0, r.output


# --------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,match", [(np.nan, "1 NaN/Inf values (first at row 4, column 2)"),
                                         (np.inf, "NaN/Inf"), (1e300, "beyond float32")])
def test_non_finite_features(tmp_path, value, match):
    X, y = data()
    X[4, 2] = value
    np.savez(tmp_path / "a.npz", features=X, labels=y)
    bad(tmp_path, tmp_path / "a.npz", match=match)


@pytest.mark.parametrize("make,match", [
    (lambda X, y: dict(features=X[:, 0], labels=y), "must be 2-D (n, d), got a 1-D array"),
    (lambda X, y: dict(features=X.reshape(30, 5, 1), labels=y), "got shape (30, 5, 1)"),
    (lambda X, y: dict(features=X[:0], labels=y[:0]), "need n ≥ 1 rows"),
    (lambda X, y: dict(features=X, labels=y[:-1]), "29 labels for 30 feature rows"),
    (lambda X, y: dict(features=X, labels=y + 0.5), "is not an integer: use --label-values sorted"),
    (lambda X, y: dict(features=X, labels=y - 3), "is below -1"),
    (lambda X, y: dict(features=X, labels=np.c_[y, y]), "one value per row, got shape (30, 2)"),
    (lambda X, y: dict(feats2=X, labels=y), "no features array found (looked for features"),
    (lambda X, y: dict(features=X.astype(str), labels=y), "features must be numbers"),
])
def test_bad_npz(tmp_path, make, match):
    X, y = data()
    np.savez(tmp_path / "a.npz", **make(X, y))
    bad(tmp_path, tmp_path / "a.npz", match=match)


def test_bad_keys_and_files(tmp_path):
    X, y = data()
    np.savez(tmp_path / "a.npz", features=X, labels=y)
    line = bad(tmp_path, tmp_path / "a.npz", "--features-key", "emb", match="no features array 'emb'")
    assert "has: features, labels" in line
    np.savez(tmp_path / "o.npz", features=X, labels=np.array([object()] * 30))
    bad(tmp_path, tmp_path / "o.npz", match="holds Python objects")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    bad(tmp_path, tmp_path / "junk.npz", match="not a readable .npz file")
    (tmp_path / "junk.mat").write_bytes(b"\x00" * 10)
    bad(tmp_path, tmp_path / "junk.mat", match="not a readable MATLAB file")
    (tmp_path / "junk.h5").write_bytes(b"\x00" * 10)
    bad(tmp_path, tmp_path / "junk.h5", match="not a readable HDF5 file")
    bad(tmp_path, tmp_path / "missing.npz", match="no such file")
    bad(tmp_path, tmp_path / "a.npz", "--format", "parquet", match="--format must be one of")
    bad(tmp_path, tmp_path / "a.npz", "--label-values", "random", match="--label-values must be")
    bad(tmp_path, tmp_path / "a.npz", "--class-names", "a,b", match="label 2 is out of range for the 2")
    bad(tmp_path, tmp_path / "a.npz", "--class-names", "a,a,b", match="'a' more than once")


def test_bad_csv(tmp_path):
    (tmp_path / "a.csv").write_text("f0,f1,label\n1,2,0\n3,x,1\n")
    bad(tmp_path, tmp_path / "a.csv", match="row 3, column 'f1': 'x' is not a number")
    (tmp_path / "b.csv").write_text("f0,f1,label\n1,2,0\n3,1\n")
    bad(tmp_path, tmp_path / "b.csv", match="row 3 has 2 columns, expected 3")
    (tmp_path / "c.csv").write_text("f0,f1,label\n1,nan,0\n3,1,1\n")
    bad(tmp_path, tmp_path / "c.csv", match="NaN/Inf")
    (tmp_path / "d.csv").write_text("f0,f1,label\n1,2,cat\n3,1,dog\n")
    bad(tmp_path, tmp_path / "d.csv", "--class-names", "cat,cow", match="label 'dog' is not one of")
    (tmp_path / "e.csv").write_text("")
    bad(tmp_path, tmp_path / "e.csv", match="no rows")


def test_output_must_not_be_the_input(tmp_path):
    X, y = data()
    with h5py.File(tmp_path / "p.h5", "w") as h:
        h["features"], h["labels"] = X, y
    bad_out = run(tmp_path / "p.h5", "-o", tmp_path / "p.h5")
    assert bad_out.exit_code == 2 and "error:" in bad_out.output
    assert h5py.File(tmp_path / "p.h5")["features"].shape == (30, 5)  # untouched


def test_library_api(tmp_path):
    assert detect_format("x.TSV") == "csv" and detect_format("x.hdf5") == "h5"
    with pytest.raises(FedalignError, match="cannot tell the format"):
        detect_format("x")
    y, names, mapping, notes = encode_labels(np.array(["b", "a", "", "b"]), 4)
    assert y.tolist() == [1, 0, -1, 1] and names == ["a", "b"] and mapping == {"rule": "names"}
    X, yy = data()
    np.savez(tmp_path / "a.npz", features=X, labels=yy)
    res = import_features(tmp_path / "a.npz", tmp_path / "a.h5")
    assert (res.n, res.d, res.n_labeled, res.format) == (30, 5, 30, "npz")


def test_library_messages_name_parameters(tmp_path):
    """The library words its errors and notes in its parameters; the CLI (tests above) names
    its flags."""
    with pytest.raises(FedalignError, match="^fmt must be one of"):
        detect_format("x.npz", "parquet")
    with pytest.raises(FedalignError, match=r"give fmt \("):
        detect_format("x")
    X, y = data()
    np.save(tmp_path / "emb.npy", X)
    with pytest.raises(FedalignError, match="give labels_file .*, or unlabeled=True"):
        import_features(tmp_path / "emb.npy", tmp_path / "e.h5")
    with pytest.raises(FedalignError, match="^labels_key has no meaning for a .npy file"):
        import_features(tmp_path / "emb.npy", tmp_path / "e.h5", labels_key="y")
    with pytest.raises(FedalignError, match="^label_values must be index or sorted"):
        encode_labels(np.array([0, 1]), 2, label_values="random")
    _, _, _, notes = encode_labels(np.array([1, 2, 2]), 3)
    assert "import again with label_base 1" in notes[0] and "--" not in notes[0]
    with pytest.raises(FedalignError, match="^class_names: no class names given"):
        import_features(tmp_path / "emb.npy", tmp_path / "e.h5", class_names=",", unlabeled=True)


# --------------------------------------------------------------------------------------------
# what a fuzzer found: hangs, overwritten inputs, tracebacks
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("labels, match", [
    (np.array([0, 1, 10**9, 1, 0, 0]), "label 1000000000 (row 2) is out of range"),   # hung
    (np.array([0, 1, 2**64 - 1, 1, 0, 0], dtype=np.uint64),            # wrapped to −1 silently
     "label 18446744073709551615 (row 2) is out of range"),
    (np.array([0.0, 1.0, 1e300, 1.0, 0.0, 0.0]), "label 1e+300 (row 2) is out of range"),
], ids=["1e9", "uint64-max", "1e300"])
def test_labels_beyond_the_class_bound_are_refused_at_once(tmp_path, labels, match):
    X, _ = data(n=6)
    np.savez(tmp_path / "a.npz", features=X, labels=labels)
    line = bad(tmp_path, tmp_path / "a.npz", match=match)
    assert "100,000 classes at most" in line
    for base in ("9223372036854775808", "-1000000000"):
        bad(tmp_path, tmp_path / "a.npz", "--label-base", base,
            match="--label-base must be between −100,000 and 100,000")


def test_inputs_the_output_check_did_not_see_are_never_overwritten(tmp_path):
    """The .npy's sibling labels file and a --class-names file are inputs too."""
    X, y = data(n=6)
    np.save(tmp_path / "a_features.npy", X)
    np.save(tmp_path / "a_labels.npy", y)
    (tmp_path / "cn.txt").write_text("a\nb\nc\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for out, extra in ((tmp_path / "a_labels.npy", ()),
                       (tmp_path / "cn.txt", ("--class-names", tmp_path / "cn.txt"))):
        r = run(tmp_path / "a_features.npy", "-o", out, *extra)
        assert r.exit_code == 2 and "is also an input" in r.output, r.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_damaged_sources_are_one_error_naming_the_file(tmp_path):
    X, y = data(n=6)
    np.savez(tmp_path / "a.npz", features=X, labels=y)
    raw = (tmp_path / "a.npz").read_bytes()
    (tmp_path / "half.npz").write_bytes(raw[: len(raw) // 2])
    bad(tmp_path, tmp_path / "half.npz", match="half.npz: not a readable npz file")
    np.savez_compressed(tmp_path / "z.npz", features=X, labels=y)
    b = bytearray((tmp_path / "z.npz").read_bytes())
    b[60:120] = bytes(x ^ 0xFF for x in b[60:120])
    (tmp_path / "z.npz").write_bytes(bytes(b))
    bad(tmp_path, tmp_path / "z.npz", match="z.npz: not a readable npz file")
    (tmp_path / "long.csv").write_text("f1,f2,label\n1,2," + "9" * 200_000 + "\n")
    bad(tmp_path, tmp_path / "long.csv", match="long.csv: not a readable csv file")
    (tmp_path / "ok.csv").write_text("f1\tf2\tlabel\n1\t2\t0\n3\t4\t1\n")
    bad(tmp_path, tmp_path / "ok.csv", "--delimiter", "ab", match="delimiter must be one character")
    ok(tmp_path / "ok.csv", "--delimiter", "tab", "-o", tmp_path / "ok.h5")
    (tmp_path / "cn.txt").write_bytes("café\nb\n".encode("latin-1"))
    np.save(tmp_path / "x_features.npy", X[:2])
    np.save(tmp_path / "x_labels.npy", y[:2])
    bad(tmp_path, tmp_path / "x_features.npy", "--class-names", tmp_path / "cn.txt",
        match="cannot read")
    for name in ("features", "labels"):
        with h5py.File(tmp_path / f"e_{name}.h5", "w") as h:
            h["features"] = X
            h["labels"] = y
            del h[name]
            h.create_dataset(name, data=h5py.Empty("f8"))
        bad(tmp_path, tmp_path / f"e_{name}.h5", match=f"dataset '{name}' is empty")


def test_ids_must_be_unique(tmp_path):
    X, y = data(n=4)
    np.savez(tmp_path / "a.npz", features=X, labels=y, ids=np.array(["p", "q", "p", "r"]))
    bad(tmp_path, tmp_path / "a.npz", match="id 'p' names rows 0 and 2: ids must be unique")

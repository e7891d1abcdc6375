"""File kinds: writers, validating readers, atomic writes."""

import json
import os

import h5py
import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.files import (FeatureFile, atomic_output, read_features, read_npz, read_report,
                            write_features, write_npz, write_report)


def test_features_roundtrip(tmp_path):
    X = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    y = np.arange(30) % 3
    write_features(tmp_path / "f.h5", X, y, [f"a/{i}.png" for i in range(30)], ["x", "y", "z"],
                   {"producer": "test"})
    X2, y2, info = read_features(tmp_path / "f.h5")
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, y)
    assert info["ids"][3] == "a/3.png" and info["class_names"] == ["x", "y", "z"]
    with FeatureFile(tmp_path / "f.h5") as ff:
        chunks = list(ff.iter_chunks(7))
        assert [c[0] for c in chunks] == [0, 7, 14, 21, 28]


def test_features_nan_rejected_on_read(tmp_path):
    X = np.ones((5, 2), np.float32)
    write_features(tmp_path / "f.h5", X, np.zeros(5), list("abcde"))
    with h5py.File(tmp_path / "f.h5", "r+") as h:
        h["features"][2, 1] = np.nan
    with pytest.raises(FedalignError, match="NaN"):
        read_features(tmp_path / "f.h5")


def test_features_nan_rejected_on_write(tmp_path):
    X = np.ones((5, 2), np.float32)
    X[0, 0] = np.inf
    with pytest.raises(FedalignError):
        write_features(tmp_path / "f.h5", X, np.zeros(5), list("abcde"))
    assert list(tmp_path.iterdir()) == []  # no partial output


def test_wrong_kind_version_and_garbage(tmp_path):
    write_npz(tmp_path / "m.npz", "map", {"A": np.eye(2), "b": np.zeros(2)})
    with pytest.raises(FedalignError, match="is a map file, expected a stats file"):
        read_npz(tmp_path / "m.npz", "stats")
    with h5py.File(tmp_path / "g.h5", "w") as h:
        h.attrs["kind"] = "features"
        h.attrs["format_version"] = 99
    with pytest.raises(FedalignError, match="format_version 99"):
        FeatureFile(tmp_path / "g.h5")
    (tmp_path / "t.h5").write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    with pytest.raises(FedalignError, match="not a readable HDF5"):
        FeatureFile(tmp_path / "t.h5")
    with pytest.raises(FedalignError, match="no such file"):
        read_npz(tmp_path / "missing.npz", "stats")


def test_npz_shape_mismatch_and_pickle(tmp_path):
    with pytest.raises(FedalignError, match="shape mismatch"):
        write_npz(tmp_path / "m.npz", "map", {"A": np.eye(3), "b": np.zeros(2)})
    np.savez(tmp_path / "p.npz", __kind__=np.array("map"), A=np.array([{"x": 1}], dtype=object))
    with pytest.raises(FedalignError, match="pickle"):
        read_npz(tmp_path / "p.npz", "map")


def test_npz_nan_rejected(tmp_path):
    np.savez(tmp_path / "m.npz", __kind__=np.array("map"), __format_version__=np.array(1),
             __meta__=np.array("{}"), A=np.full((2, 2), np.nan), b=np.zeros(2))
    with pytest.raises(FedalignError, match="NaN"):
        read_npz(tmp_path / "m.npz", "map")


def test_atomic_output_leaves_nothing_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_output(tmp_path / "out.txt") as tmp:
            tmp.write_text("partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_report_roundtrip(tmp_path):
    write_report(tmp_path / "r.json", {"table": [1, 2]})
    assert read_report(tmp_path / "r.json")["table"] == [1, 2]
    (tmp_path / "x.json").write_text(json.dumps({"kind": "other"}))
    with pytest.raises(FedalignError):
        read_report(tmp_path / "x.json")


# ------------------------------------------------ one file, several spellings: keyed lookups
def _count_resolutions(monkeypatch):
    """Count ``os.path.realpath`` calls made by fedalign.files (its outputs module resolves
    every path)."""
    import fedalign.files.outputs as outputs

    calls = []
    real = outputs.os.path.realpath

    def counting(p, *a, **k):
        calls.append(p)
        return real(p, *a, **k)

    monkeypatch.setattr(outputs.os.path, "realpath", counting)
    return calls


def test_check_outputs_resolves_each_path_once(tmp_path, monkeypatch):
    """A federation's ~1,000 outputs: n + m resolutions, not one per pair (20 s at n = 1,000)."""
    from fedalign.files import check_outputs

    ins = [tmp_path / f"c{c}.gmm.npz" for c in range(10)]
    outs = [tmp_path / f"r{r:03d}" / f"c{c}.npz" for r in range(150) for c in range(10)]
    calls = _count_resolutions(monkeypatch)
    check_outputs(ins, outs, allow=[ins[0]])
    assert len(calls) == len(ins) + len(outs) + 1


def test_check_outputs_sees_every_spelling_and_names_the_first_input(tmp_path, monkeypatch):
    from fedalign.files import check_outputs

    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).write_text(name)
    os.link("a", "hard")
    (tmp_path / "soft").symlink_to("b")
    check_outputs(["a", "b"], ["x", "y"])                                   # distinct: fine
    (tmp_path / "d").mkdir()
    for outs, msg in ((["x", str(tmp_path / "x")], f"x and {tmp_path}/x are the same output"),
                      (["x", "d/../x"], "x and d/../x are the same output file"),
                      (["y", "hard"], r"output hard is also an input \(a\)"),   # a hard link
                      (["soft"], r"output soft is also an input \(b\)"),        # a symlink
                      ([str(tmp_path / "b")], f"output {tmp_path}/b is also an input \\(b\\)")):
        with pytest.raises(FedalignError, match=msg):
            check_outputs(["a", "b"], outs)
    # an input given twice under two spellings: the message names the first one given
    with pytest.raises(FedalignError, match=r"output a is also an input \(hard\)"):
        check_outputs(["hard", "a"], ["a"])
    with pytest.raises(FedalignError, match=r"output a is also an input: refusing"):
        check_outputs(["a", "hard"], ["a"])
    check_outputs(["a"], ["hard"], allow=["./a"])                         # updated in place
    check_outputs([None, "a"], [None, "x"])                               # None entries ignored


def test_transaction_finds_its_outputs_by_any_spelling_in_one_lookup(tmp_path, monkeypatch):
    from fedalign.files import atomic_outputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "old").write_text("old")
    (tmp_path / "link").symlink_to("old")
    (tmp_path / "d").mkdir()
    n = 300
    with atomic_outputs() as tx:
        calls = _count_resolutions(monkeypatch)
        tmps = [tx.add(f"f{i}.txt") for i in range(n)]
        assert len(calls) == n                                     # one resolution per output
        old_tmp = tx.add("old")
        for bad in ("./f7.txt", "d/../f7.txt", "link"):          # the same file again
            with pytest.raises(FedalignError, match="would be written twice"):
                tx.add(bad)
        assert tx.temporary("./f7.txt") == tmps[7] and tx.temporary("link") == old_tmp
        with pytest.raises(KeyError):
            tx.temporary("nope")
        tx.commit_first("./f9.txt")
        assert tx.entries[0][0] == tmps[9] and len(tx.entries) == n + 1
        tx.commit_first("nope")                                    # not an output: no change
        assert tx.entries[0][0] == tmps[9] and len(tx.entries) == n + 1
        tx.discard(tmps[3])
        with pytest.raises(KeyError):
            tx.temporary("f3.txt")
        assert tx.add("f3.txt") != tmps[3]                         # free again after discard
        for i, t in enumerate(tmps):
            if i != 3:
                t.write_text(str(i))
        tx.temporary("f3.txt").write_text("3")
        old_tmp.write_text("new")
    assert [(tmp_path / f"f{i}.txt").read_text() for i in (0, 3, n - 1)] == ["0", "3", str(n - 1)]
    assert (tmp_path / "old").read_text() == "new"
    assert not [p for p in tmp_path.iterdir() if ".fedalign-tmp-" in p.name]


def test_packed_symmetric_round_trip_and_stats_version_2(tmp_path):
    """format_version 2 stores symmetric matrices once (upper triangle); readers unpack them
    to the same float64 matrix (exact in float64), report the storage dtype, read v1 too,
    and npz_header gives shapes without reading arrays."""
    from fedalign.files import npz_header, pack_symmetric, unpack_symmetric, write_npz

    rng = np.random.default_rng(0)
    d = 6
    Z = rng.normal(size=(20, d))
    C = Z.T @ Z / 20
    P = pack_symmetric(C)
    assert P.shape == (d * (d + 1) // 2,)
    np.testing.assert_array_equal(unpack_symmetric(P), C)
    arrays = dict(n=np.int64(20), mean=np.zeros(d), covariance=C, shrinkage=np.float64(0.1),
                  shift=np.zeros(d), sum_y=np.zeros(d), sum_yy=20 * C,
                  sum_sqnorm_y=np.zeros(d), sum_sqnorm2=np.float64(1.0))
    for version, dtype in ((1, "float64"), (2, "float64"), (2, "float32")):
        p = write_npz(tmp_path / f"v{version}{dtype}.npz", "stats", arrays, version=version,
                      dtype=dtype)
        info = {}
        a, _ = read_npz(p, "stats", info)
        assert info == dict(format_version=version, dtype=dtype)
        tol = 0 if dtype == "float64" else 1e-6
        np.testing.assert_allclose(a["covariance"], C, rtol=tol, atol=tol)
        assert a["covariance"].dtype == np.float64 and a["covariance"].shape == (d, d)
        h = npz_header(p, "stats")
        assert h["format_version"] == version and h["shapes"]["covariance"] == (d, d)
    with pytest.raises(FedalignError, match="float32 range"):
        pack_symmetric(np.eye(2) * 1e39, "float32")
    with pytest.raises(FedalignError, match="packed formats"):
        write_npz(tmp_path / "x.npz", "reference", dict(mean=np.zeros(d), covariance=C,
                  weights=np.ones(1), n=np.ones(1, dtype=np.int64)), dtype="float32")
    bad = tmp_path / "v9.npz"
    np.savez(bad, __kind__=np.array("stats"), __format_version__=np.array(9))
    for reader in (read_npz, npz_header):
        with pytest.raises(FedalignError, match="format_version 9 is not supported .expected 1 or 2"):
            reader(bad, "stats")

"""File kinds: writers, validating readers, atomic writes."""

import json

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

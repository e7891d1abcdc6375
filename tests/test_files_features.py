"""Features files (fedalign.files.features): the writers, the validating reader."""

import h5py
import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.files import FeatureFile, read_features, write_features


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


def test_features_wrong_version_and_garbage(tmp_path):
    with h5py.File(tmp_path / "g.h5", "w") as h:
        h.attrs["kind"] = "features"
        h.attrs["format_version"] = 99
    with pytest.raises(FedalignError, match="format_version 99"):
        FeatureFile(tmp_path / "g.h5")
    (tmp_path / "t.h5").write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    with pytest.raises(FedalignError, match="not a readable HDF5"):
        FeatureFile(tmp_path / "t.h5")

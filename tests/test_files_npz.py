"""The .npz kinds (fedalign.files.schemas, fedalign.files.npz): validating writers and
readers, packed symmetric matrices, the header alone; the SPD check they use
(fedalign.linalg.check_spd)."""

import subprocess
import sys

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.files import read_npz, write_npz


def test_wrong_kind_and_missing_npz(tmp_path):
    write_npz(tmp_path / "m.npz", "map", {"A": np.eye(2), "b": np.zeros(2)})
    with pytest.raises(FedalignError, match="is a map file, expected a stats file"):
        read_npz(tmp_path / "m.npz", "stats")
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


def test_check_spd_lives_in_linalg_and_files_re_exports_it():
    """The numeric SPD check is linear algebra (fedalign.linalg); fedalign.files keeps the name,
    and importing the files package (which now imports linalg) still loads no torch."""
    import fedalign.files
    import fedalign.linalg

    assert fedalign.files.check_spd is fedalign.linalg.check_spd
    assert fedalign.files.SYMMETRY_RTOL == fedalign.linalg.SYMMETRY_RTOL
    code = "import sys, fedalign.files; print('torch' in sys.modules, 'h5py' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr


def _by_hand(path, kind, version=1, **arrays):
    """An npz of ``kind`` written around the validating writer (as a damaged or edited file)."""
    np.savez(path, __kind__=np.array(kind), __format_version__=np.array(version),
             __meta__=np.array("{}"), **arrays)
    return path


@pytest.mark.parametrize("kind, arrays, message", [
    ("map", dict(A=np.zeros((0, 0)), b=np.zeros(0)), r"array 'A' has shape \(0, 0\): d must be at least 1"),
    ("gmm", dict(weights=np.zeros(0), means=np.zeros((0, 3)), variances=np.ones((0, 3))),
     r"array 'weights' has shape \(0,\): K must be at least 1"),
    ("gmm", dict(weights=np.ones(1), means=np.zeros((1, 3)), variances=np.ones((1, 3)),
                 labels=np.zeros((1, 0))), r"array 'labels' has shape \(1, 0\): C must be at least 1"),
    ("reference", dict(mean=np.zeros(2), covariance=np.eye(2), weights=np.zeros(0),
                       n=np.zeros(0, np.int64)), r"array 'weights' has shape \(0,\): K must be at least 1"),
], ids=["map-d0", "gmm-K0", "gmm-C0", "reference-K0"])
def test_a_zero_size_dimension_is_refused_by_reader_and_writer(tmp_path, kind, arrays, message):
    """No kind has a meaning for an empty dimension (zero atoms, components, classes or
    features): the reader refuses it naming the array and the symbol; the writer too."""
    with pytest.raises(FedalignError, match=message):
        read_npz(_by_hand(tmp_path / "z.npz", kind, **arrays), kind)
    with pytest.raises(FedalignError, match=message):
        write_npz(tmp_path / "w.npz", kind, arrays)
    assert not (tmp_path / "w.npz").exists()


def test_integers_beyond_2_53_are_refused_and_2_53_itself_is_read(tmp_path):
    """Counts and rounds enter float64 arithmetic, exact up to 2**53: beyond, in either sign
    and in any integer dtype, the file is damaged."""
    from fedalign.files import MAX_INTEGER

    assert MAX_INTEGER == 2**53
    arrays = dict(mean=np.zeros(2), covariance=np.eye(2), weights=np.array([0.5, 0.5]))
    for n, shown in ((np.array([2**53 + 1, 1], np.int64), 2**53 + 1),
                     (np.array([1, -(2**53) - 1], np.int64), -(2**53) - 1),
                     (np.array([2**64 - 1, 1], np.uint64), 2**64 - 1)):
        p = _by_hand(tmp_path / "r.npz", "reference", n=n, **arrays)
        with pytest.raises(FedalignError, match=f"array 'n' holds the integer {shown}, beyond "
                                                r"±2\*\*53 \(a count or a round\): a damaged file$"):
            read_npz(p, "reference")
        with pytest.raises(FedalignError, match="beyond ±2"):
            write_npz(tmp_path / "w.npz", "reference", dict(arrays, n=n))
    assert not (tmp_path / "w.npz").exists()
    p = write_npz(tmp_path / "ok.npz", "reference", dict(arrays, n=np.array([2**53, 1])))
    assert read_npz(p, "reference")[0]["n"].tolist() == [2**53, 1]


def test_unsigned_words_take_any_unsigned_value_and_no_negative_one(tmp_path):
    """The "u" kind (a generator's 64-bit words): every uint64 value is read, the magnitude
    bound of numbers does not apply; an int64 array is read when no word is negative; a
    float array is not integer."""
    from fedalign.files.schemas import Schema, _validate_arrays

    sch = Schema("words", 1, {"w": (("six",), "u")})
    top = np.full(6, 2**64 - 1, np.uint64)
    assert _validate_arrays({"w": top}, sch, "s") == {"six": 6}
    assert _validate_arrays({"w": np.arange(6)}, sch, "s") == {"six": 6}
    with pytest.raises(FedalignError, match=r"^s: array 'w' must hold unsigned words, got -3$"):
        _validate_arrays({"w": np.array([0, 1, -3, 0, 0, 0])}, sch, "s")
    with pytest.raises(FedalignError, match=r"^s: array 'w' must be integer, got float64$"):
        _validate_arrays({"w": np.zeros(6)}, sch, "s")

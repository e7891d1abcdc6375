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

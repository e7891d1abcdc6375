"""Streaming moments and Ledoit–Wolf against scikit-learn (independent oracle)."""

import re

import numpy as np
import pytest
from sklearn.covariance import LedoitWolf

from fedalign.errors import FedalignError
from fedalign.stats import Moments, compute_stats, load_stats, save_stats, shrunk_covariance


def _rel(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(b).max(), 1e-300)


@pytest.mark.parametrize("n,d,offset,chunk", [(500, 20, 0.0, 64), (50, 80, 1e4, 7), (1000, 3, -3.0, 1000)])
def test_ledoit_wolf_matches_sklearn(n, d, offset, chunk):
    rng = np.random.default_rng(n + d)
    X = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + offset
    m = Moments(d)
    for i in range(0, n, chunk):
        m.update(X[i : i + chunk])
    C, s = shrunk_covariance(m, "auto")
    lw = LedoitWolf().fit(X)
    assert _rel(m.mean, lw.location_) < 1e-10
    assert _rel(C, lw.covariance_) < 1e-10
    assert abs(s - lw.shrinkage_) <= 1e-10 * max(1.0, lw.shrinkage_)


def test_merge_equals_single_pass():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 6)) + 10
    y = rng.integers(0, 3, 300)
    a = Moments(6, n_classes=3).update(X[:50], y[:50])
    b = Moments(6, shift=a.shift.copy(), n_classes=3).update(X[50:], y[50:])
    whole = Moments(6, shift=a.shift.copy(), n_classes=3).update(X, y).finalize()
    merged = a.merge(b)
    assert merged.n == 300
    np.testing.assert_allclose(merged.sum_yy, whole.sum_yy, rtol=1e-12)
    np.testing.assert_array_equal(merged.class_counts, np.bincount(y, minlength=3))
    np.testing.assert_allclose(merged.class_sums, [X[y == c].sum(0) for c in range(3)], rtol=1e-12)
    sx, sxx = merged.raw_sums()
    np.testing.assert_allclose(sx, X.sum(0), rtol=1e-12)
    np.testing.assert_allclose(sxx, X.T @ X, rtol=1e-11)


def test_shrinkage_options():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 5))
    m = Moments(5).update(X)
    C0, s0 = shrunk_covariance(m, "none")
    assert s0 == 0.0
    np.testing.assert_allclose(C0, np.cov(X.T, bias=True), rtol=1e-10)
    C1, s1 = shrunk_covariance(m, 1.0)
    np.testing.assert_allclose(C1, np.eye(5) * np.trace(C0) / 5, rtol=1e-12)
    with pytest.raises(FedalignError):
        shrunk_covariance(m, 1.5)


def test_fewer_than_two_samples_is_an_error():
    m = Moments(3).update(np.ones((1, 3)))
    with pytest.raises(FedalignError, match="at least 2"):
        shrunk_covariance(m)


def test_file_roundtrip_and_per_class(feature_file, tmp_path):
    p, X, y = feature_file(n=257, d=7, n_classes=4)
    st = compute_stats(p, per_class=True, chunk_rows=50)
    lw = LedoitWolf().fit(X.astype(np.float64))
    assert _rel(st.covariance, lw.covariance_) < 1e-10
    save_stats(tmp_path / "s.npz", st)
    st2 = load_stats(tmp_path / "s.npz")
    np.testing.assert_array_equal(st2.covariance, st.covariance)
    np.testing.assert_array_equal(st2.moments.class_counts, np.bincount(y, minlength=4))
    assert st2.class_names == ["c0", "c1", "c2", "c3"]
    # aggregates only: no array has a per-sample axis
    with np.load(tmp_path / "s.npz") as z:
        assert all(257 not in z[k].shape for k in z.files)


def test_constant_features_are_finite():
    X = np.ones((10, 4))
    m = Moments(4).update(X)
    C, s = shrunk_covariance(m)
    assert np.all(np.isfinite(C)) and np.allclose(C, 0)


def _with_class_counts(src, dst, counts):
    """A copy of the stats file ``src`` whose ``class_counts`` are replaced, by hand."""
    d = dict(np.load(src))
    d["class_counts"] = np.asarray(counts, dtype=np.int64)
    np.savez(dst, **d)
    return dst


def test_class_counts_must_be_non_negative_and_at_most_n(feature_file, tmp_path):
    """The class counts are of the labeled rows: none negative, and together at most n. A
    file with fewer (unlabeled rows) and the file the writer wrote are read."""
    p, X, y = feature_file(n=60, d=3, n_classes=3)
    good = save_stats(tmp_path / "s.npz", compute_stats(p, per_class=True))
    counts = np.bincount(y, minlength=3)
    assert load_stats(good).moments.class_counts.tolist() == counts.tolist()   # sum == n
    for bad, shown in (([-1, 30, 31], "[-1 30 31] (sum 60)"), ([30, 30, 1], "[30 30  1] (sum 61)")):
        with pytest.raises(FedalignError, match=re.escape("'class_counts' must be ≥ 0 and sum to "
                                                          f"at most n=60 (the labeled rows), got {shown}")):
            load_stats(_with_class_counts(good, tmp_path / "bad.npz", bad))
    fewer = load_stats(_with_class_counts(good, tmp_path / "fewer.npz", [10, 0, 20]))
    assert fewer.moments.class_counts.tolist() == [10, 0, 20]
    # counts whose int64 sum would wrap around: the sum is exact
    huge = [2**53] * 1024
    d = dict(np.load(good))
    d["class_counts"] = np.array(huge, np.int64)
    d["class_sums"] = np.zeros((1024, 3))
    d.pop("class_names", None)
    np.savez(tmp_path / "wrap.npz", **d)
    with pytest.raises(FedalignError, match=r"sum to at most n=60 .*\(sum 9223372036854775808\)$"):
        load_stats(tmp_path / "wrap.npz")

"""fedalign.gmm and ``fedalign fit-gmm``: fitting vs scikit-learn, files, sampling, MAP."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.errors import FedalignError
from fedalign.files import write_npz
from fedalign.gmm import (GMM, fit_gmm, load_gmm, log_likelihood, map_predict, predict_proba,
                          refit_gmm, sample_gmm, save_gmm, score_samples)

runner = CliRunner()


def blobs(n=300, d=4, C=3, seed=0, sep=4.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    centers = rng.normal(size=(C, d)) * sep
    return centers[y] + rng.normal(size=(n, d)), y


def test_labeled_fit_matches_per_class_sklearn():
    from sklearn.mixture import GaussianMixture

    X, y = blobs(seed=1)
    g = fit_gmm(X, y, components_per_class=2, seed=3, min_var=1e-6)
    assert (g.K, g.d, g.n_classes) == (6, 4, 3)
    np.testing.assert_array_equal(g.labels.argmax(1), [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(g.labels.sum(1), np.ones(6))
    for c in range(3):
        ref = GaussianMixture(2, covariance_type="diag", reg_covar=1e-6, random_state=3).fit(X[y == c])
        np.testing.assert_allclose(g.means[2 * c: 2 * c + 2], ref.means_, rtol=1e-10)
        np.testing.assert_allclose(g.variances[2 * c: 2 * c + 2], ref.covariances_, rtol=1e-10)
        # balanced: each class has mass 1/C
        np.testing.assert_allclose(g.weights[2 * c: 2 * c + 2], ref.weights_ / 3, rtol=1e-10)


def test_relative_floor_is_scale_free_and_per_dimension():
    """Default floor: 1 % of each dimension's variance; fits at scale s equal s × the fit."""
    from fedalign.gmm import variance_floor

    X, y = blobs(seed=1)
    X = X.copy()
    X[y == 0, 3] = 0.0                       # a dimension that is exactly 0 for a whole class
    g = fit_gmm(X, y, components_per_class=2, seed=3)
    floor = variance_floor(X)
    np.testing.assert_allclose(floor, 0.01 * X.var(0), rtol=1e-12)
    assert np.all(g.variances >= floor - 1e-15)
    np.testing.assert_allclose(g.variances[g.labels.argmax(1) == 0, 3], floor[3], rtol=1e-12)
    s = 0.02
    g2 = fit_gmm(X * s + 0.1, y, components_per_class=2, seed=3)
    np.testing.assert_allclose(g2.means, g.means * s + 0.1, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(g2.variances, g.variances * s * s, rtol=1e-5)
    assert g.meta["var_floor_rel"] == 0.01 and g.meta["min_var"] is None


def test_prior_class_weights_and_small_class():
    X, y = blobs(n=200, seed=2)
    y = y.copy()
    y[y == 2] = 0
    y[:2] = 2                                       # class 2 has 2 samples < k = 4
    g = fit_gmm(X, y, components_per_class=4, class_weights="prior", min_var=1e-3)
    counts = np.bincount(y, minlength=3)
    owner = g.labels.argmax(1)
    np.testing.assert_array_equal(np.bincount(owner, minlength=3), [4, 4, 2])
    np.testing.assert_allclose(np.bincount(owner, weights=g.weights, minlength=3), counts / counts.sum())
    assert g.variances.min() >= 1e-3


def test_unlabeled_fit_and_determinism():
    X, y = blobs(seed=3)
    g = fit_gmm(X, np.full(len(X), -1), components_per_class=2, n_classes=3)
    assert g.labels is None and g.K == 6
    g2 = fit_gmm(X, None, components_per_class=2, n_classes=3)
    np.testing.assert_array_equal(g.means, g2.means)
    with pytest.raises(FedalignError, match="number of classes"):
        fit_gmm(X, None)
    with pytest.raises(FedalignError, match="class weights"):
        fit_gmm(X, y, class_weights="odd")


def test_log_likelihood_matches_sklearn_and_scipy():
    from sklearn.mixture import GaussianMixture

    X, _ = blobs(n=200, d=3, seed=4)
    ref = GaussianMixture(3, covariance_type="diag", random_state=0).fit(X)
    g = GMM(ref.weights_, ref.means_, ref.covariances_)
    np.testing.assert_allclose(score_samples(g, X), ref.score_samples(X), rtol=1e-10)
    assert log_likelihood(g, X) == pytest.approx(ref.score(X), rel=1e-10)
    dens = sum(w * multivariate_normal(m, np.diag(v)).pdf(X[:5])
               for w, m, v in zip(g.weights, g.means, g.variances))
    np.testing.assert_allclose(score_samples(g, X[:5]), np.log(dens), rtol=1e-10)


def test_map_predict_soft_labels_brute_force():
    rng = np.random.default_rng(5)
    K, d, C = 4, 2, 3
    g = GMM(rng.dirichlet(np.ones(K)), rng.normal(size=(K, d)), rng.uniform(0.5, 2, (K, d)),
            rng.dirichlet(np.ones(C), size=K))
    X = rng.normal(size=(50, d)) * 2
    lik = np.stack([w * multivariate_normal(m, np.diag(v)).pdf(X)
                    for w, m, v in zip(g.weights, g.means, g.variances)], 1)
    post = lik / lik.sum(1, keepdims=True)
    np.testing.assert_allclose(predict_proba(g, X), post @ g.labels, rtol=1e-9)
    np.testing.assert_array_equal(map_predict(g, X), (post @ g.labels).argmax(1))
    # far from every component: log-domain stays finite
    assert map_predict(g, np.full((1, d), 1e3)).shape == (1,)


def test_sampling_and_classifiers():
    X, y = blobs(n=600, d=5, seed=6)
    g = fit_gmm(X, y, components_per_class=2)
    Xs, ys = sample_gmm(g, 20000, np.random.default_rng(0))
    mix_mean = g.weights @ g.means
    np.testing.assert_allclose(Xs.mean(0), mix_mean, atol=0.1)
    np.testing.assert_allclose(np.bincount(ys) / len(ys), [1 / 3] * 3, atol=0.02)
    assert (map_predict(g, X) == y).mean() > 0.98


def test_save_load_roundtrip_and_bad_files(tmp_path):
    X, y = blobs(seed=7)
    g = fit_gmm(X, y, components_per_class=2, class_names=["a", "b", "c"])
    p = save_gmm(tmp_path / "g.npz", g, {"producer": "test"})
    h = load_gmm(p)
    for name in ("weights", "means", "variances", "labels"):
        np.testing.assert_array_equal(getattr(h, name), getattr(g, name))
    assert h.class_names == ["a", "b", "c"] and h.meta["producer"] == "test"
    bad = tmp_path / "bad.npz"
    write_npz(bad, "gmm", dict(weights=[0.5, 0.6], means=np.zeros((2, 3)), variances=np.ones((2, 3))))
    with pytest.raises(FedalignError, match="sum to 1"):
        load_gmm(bad)
    write_npz(bad, "map", dict(A=np.eye(2), b=np.zeros(2)))
    with pytest.raises(FedalignError, match="expected a gmm file"):
        load_gmm(bad)


@pytest.mark.parametrize("labels", [
    [[1.2, -0.2], [0.5, 0.5]],            # a negative "probability"
    [[1.0, 1.0], [0.5, 0.5]],             # a row summing to 2
    [[1e300, 0.0], [0.5, 0.5]],
], ids=["negative", "sum-2", "huge"])
def test_gmm_labels_must_be_class_probability_rows(labels):
    with pytest.raises(FedalignError, match=r"GMM labels must be rows of class probabilities"):
        GMM([0.5, 0.5], np.zeros((2, 3)), np.ones((2, 3)), np.array(labels))
    soft = GMM([0.5, 0.5], np.zeros((2, 3)), np.ones((2, 3)),
               np.array([[0.3, 0.7], [1.0 + 1e-7, -1e-7]]))   # round-off of a renormalisation
    assert soft.n_classes == 2


def test_npz_values_whose_square_overflows_are_refused(tmp_path):
    """1e300 means made the DaDiL start print overflow warnings, then blame its output."""
    bad = tmp_path / "bad.npz"
    np.savez(bad, __kind__=np.array("gmm"), __format_version__=np.array(1),
             __meta__=np.array("{}"), weights=np.ones(2) / 2,
             means=np.array([[0.0, 1e300], [0.0, 0.0]]), variances=np.ones((2, 2)))
    with pytest.raises(FedalignError, match=r"array 'means' holds a value of magnitude 1e\+300, "
                                            r"beyond 1e\+150"):
        load_gmm(bad)
    write_npz(tmp_path / "ok.npz", "gmm", dict(weights=np.ones(2) / 2, variances=np.ones((2, 2)),
                                              means=np.array([[0.0, 1e150], [0.0, 0.0]])))
    assert load_gmm(tmp_path / "ok.npz").means.max() == 1e150


def test_cli_fit_gmm_labeled_unlabeled_and_errors(feature_file, tmp_path):
    path, X, y = feature_file("c.h5", n=240, d=6, n_classes=3)
    out = tmp_path / "c.gmm.npz"
    r = runner.invoke(app, ["fit-gmm", str(path), "-o", str(out), "--components-per-class", "2",
                            "--seed", "1"])
    assert r.exit_code == 0, r.output
    g = load_gmm(out)
    assert g.K == 6 and g.class_names == ["c0", "c1", "c2"]
    ref = fit_gmm(X, y, 2, seed=1)
    np.testing.assert_allclose(g.means, ref.means, rtol=1e-12)
    out2 = tmp_path / "c2.gmm.npz"
    r = runner.invoke(app, ["fit-gmm", str(path), "-o", str(out2), "-k", "2", "--seed", "1"])
    assert out.read_bytes() == out2.read_bytes()          # same seed → byte-identical
    tpath, _, _ = feature_file("t.h5", n=150, d=6, unlabeled=True)
    r = runner.invoke(app, ["fit-gmm", str(tpath), "-o", str(tmp_path / "t.npz"), "-k", "2"])
    assert r.exit_code == 0, r.output
    assert load_gmm(tmp_path / "t.npz").labels is None and load_gmm(tmp_path / "t.npz").K == 6
    r = runner.invoke(app, ["fit-gmm", str(path), "-o", str(tmp_path / "x.npz"), "--class-weights", "odd"])
    assert r.exit_code == 2 and "--class-weights must be one of" in r.output and not (tmp_path / "x.npz").exists()
    r = runner.invoke(app, ["fit-gmm", str(tmp_path / "missing.h5"), "-o", str(tmp_path / "x.npz")])
    assert r.exit_code == 2 and "no such file" in r.output
    r = runner.invoke(app, ["fit-gmm", str(out), "-o", str(tmp_path / "x.npz")])   # a gmm, not features
    assert r.exit_code == 2 and "is an .npz file (a gmm file), expected an HDF5 features file" in r.output and not (tmp_path / "x.npz").exists()


def test_cli_fit_gmm_prior_weights_reports_k_as_c_times_k(feature_file, tmp_path):
    path, _, _ = feature_file("s.h5", n=120, d=4, n_classes=2)
    out = tmp_path / "s.gmm.npz"
    r = runner.invoke(app, ["fit-gmm", str(path), "-o", str(out), "-k", "3",
                            "--class-weights", "prior"])
    assert r.exit_code == 0, r.output
    assert "K=6" in r.stderr and "C·k = 2·3" in r.stderr and load_gmm(out).K == 6


def test_refit_gmm_reuses_the_recorded_fit_options():
    rng = np.random.default_rng(4)
    y = np.arange(150) % 3
    X = rng.normal(size=(150, 6)) + 3.0 * np.eye(3, 6)[y]
    g = fit_gmm(X, y, 2, n_classes=3, seed=3, var_floor_rel=0.05, class_weights="prior")
    half = refit_gmm(g, X[:80], y[:80])
    ref = fit_gmm(X[:80], y[:80], 2, n_classes=3, seed=3, var_floor_rel=0.05,
                  class_weights="prior")
    np.testing.assert_array_equal(half.means, ref.means)
    np.testing.assert_array_equal(half.weights, ref.weights)
    assert not np.array_equal(half.means, g.means)
    fixed = fit_gmm(X, y, 2, n_classes=3, min_var=0.5)
    np.testing.assert_array_equal(refit_gmm(fixed, X[:80], y[:80]).variances,
                                  fit_gmm(X[:80], y[:80], 2, n_classes=3, min_var=0.5).variances)
    assert refit_gmm(g, X[:80], y[:80], n_classes=4).n_classes == 4     # an override wins


@pytest.mark.parametrize("C", [0, -2, True, 2.0, "3", 100_001])
def test_class_count_is_an_integer_from_1_to_max_classes(C):
    from fedalign.files import MAX_CLASSES
    from fedalign.gmm import check_n_classes

    assert MAX_CLASSES == 100_000
    with pytest.raises(FedalignError, match=r"^number of classes must be an integer in "
                                            rf"\[1, 100,000\], got {re.escape(repr(C))}$"):
        check_n_classes(C)
    assert [check_n_classes(c) for c in (1, np.int64(3), MAX_CLASSES)] == [1, 3, MAX_CLASSES]
    X, y = blobs(n=60, seed=2)
    with pytest.raises(FedalignError, match="number of classes must be an integer"):
        fit_gmm(X, None, 1, n_classes=C)        # an unlabeled fit takes C from the argument


@pytest.mark.parametrize("n_classes, message", [
    (0, r"metadata 'n_classes' must be an integer in \[1, 100,000\], got 0$"),
    (100_001, r"metadata 'n_classes' must be an integer in \[1, 100,000\], got 100001$"),
    (True, r"metadata 'n_classes' must be an integer, got bool true$"),
], ids=["0", "max+1", "bool"])
def test_gmm_file_with_a_bad_recorded_class_count_is_refused(tmp_path, n_classes, message):
    """An unlabeled GMM's C is its fit record's n_classes: 0, a bool or more than
    MAX_CLASSES is refused on reading (the file fit_gmm writes is read back)."""
    X, _ = blobs(n=90, seed=5)
    g = fit_gmm(X, None, 1, n_classes=3)
    good = save_gmm(tmp_path / "g.npz", g)
    assert load_gmm(good).meta["n_classes"] == 3
    d = dict(np.load(good))
    d["__meta__"] = np.array(json.dumps(dict(json.loads(str(d["__meta__"])), n_classes=n_classes)))
    np.savez(tmp_path / "bad.npz", **d)
    with pytest.raises(FedalignError, match=message):
        load_gmm(tmp_path / "bad.npz")


def test_cli_fit_gmm_unlabeled_without_class_names_reports_c(feature_file, tmp_path):
    """fit-gmm's summary takes C from the fit record: an unlabeled file whose class names are
    not kept (--n-classes differs from them) was a TypeError traceback before."""
    path, _, _ = feature_file("u.h5", n=90, d=4, n_classes=3, unlabeled=True)
    out = tmp_path / "u.gmm.npz"
    r = runner.invoke(app, ["fit-gmm", str(path), "-o", str(out), "-k", "2", "--n-classes", "2"])
    assert r.exit_code == 0, r.output
    g = load_gmm(out)
    assert g.n_classes is None and g.meta["n_classes"] == 2
    assert "C·k = 2·2" in r.stderr and "None" not in r.stderr

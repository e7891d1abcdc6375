"""SLOT-Align and one-shot-head behaviours that carry the method's meaning, each with an
independent oracle or a fixture where the property is not automatic (each fails when its
behaviour is planted broken; see docs/mutation.md)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import make_features
from fedalign.errors import FedalignError


# ------------------------------------------------------------------------------------ FedCGS
def test_fedcgs_default_total_covariance_is_centred():
    """Default FedCGS (total covariance / N, ridge 0.01) against numpy on the pooled rows, with
    features far from the origin (mean ≈ 20), where an uncentred Σxxᵀ/N is a different head."""
    from fedalign.heads import run_method
    from fedalign.heads.fedcgs import global_statistics

    rng = np.random.default_rng(0)
    C, d = 3, 5
    centers = rng.normal(size=(C, d)) * 2 + 20.0
    clients = []
    for k, n in enumerate((61, 47, 80)):
        y = rng.integers(0, C, n)
        clients.append(((centers[y] + rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) * 0.5)
                        .astype(np.float32), y))
    X = np.concatenate([c[0] for c in clients]).astype(np.float64)
    y = np.concatenate([c[1] for c in clients])
    S = np.cov(X.T, bias=True)
    head, msgs = run_method("fedcgs", clients, C)
    np.testing.assert_allclose(global_statistics(msgs)[3], S, rtol=1e-9, atol=1e-9)
    Sigma = 0.99 * S + 0.01 * np.trace(S) / d * np.eye(d)
    Mc = np.stack([X[y == c].mean(0) for c in range(C)])
    W = np.linalg.solve(Sigma, Mc.T).T
    b = -0.5 * np.einsum("cd,cd->c", W, Mc) + np.log(np.bincount(y, minlength=C) / len(y))
    np.testing.assert_allclose(head.W, W, rtol=1e-7, atol=1e-7 * np.abs(W).max())
    np.testing.assert_allclose(head.b, b, rtol=1e-7, atol=1e-7 * np.abs(b).max())


# ------------------------------------------------------------------------------------ FedPFT
@pytest.mark.parametrize("kind", ["spherical", "diag", "full"])
def test_fedpft_samples_with_the_standard_deviation(kind):
    """Variance 9 (and 4 for the second dimension of diag/full): the samples' std is 3 (2)."""
    from fedalign.heads.fedpft import sample_class

    cov = {"spherical": np.array([[9.0]]), "diag": np.array([[[9.0, 4.0]]]),
           "full": np.array([[[[9.0, 1.5], [1.5, 4.0]]]])}[kind]
    msg = {"n_components": np.array([1]), "weights": np.array([[1.0]]),
           "means": np.array([[[5.0, -1.0]]]), "covariances": cov}
    Z = sample_class(msg, 0, 40_000, np.random.default_rng(0))
    np.testing.assert_allclose(Z.mean(0), [5.0, -1.0], atol=0.05)
    want = {"spherical": np.diag([9.0, 9.0]), "diag": np.diag([9.0, 4.0]),
            "full": np.array([[9.0, 1.5], [1.5, 4.0]])}[kind]
    np.testing.assert_allclose(np.cov(Z.T), want, rtol=0.04, atol=0.15)


# ------------------------------------------------------------------------------- align files
def _aligned_federation(tmp_path):
    """One domain, one client: stats, a saved reference, the client's map (library calls)."""
    from fedalign.align import client_map, load_reference, make_reference, save_reference
    from fedalign.stats import compute_stats

    make_features(tmp_path / "alpha.c0.train.h5", n=150, d=4, n_classes=3, seed=1, shift=1.0)
    make_features(tmp_path / "beta.c0.train.h5", n=150, d=4, n_classes=3, seed=2, scale=2.0)
    make_features(tmp_path / "alpha.test.h5", n=90, d=4, n_classes=3, seed=3, shift=1.0)
    sts = {c: compute_stats(tmp_path / f"{c}.train.h5") for c in ("alpha.c0", "beta.c0")}
    save_reference(tmp_path / "ref.npz", make_reference(list(sts.values())))
    ref = load_reference(tmp_path / "ref.npz")
    maps = {c: client_map(st, ref, c, c.split(".")[0]) for c, st in sts.items()}
    return ref, maps


def _align(src, out, amap, tau, ref_sha):
    from fedalign.align import align_file, map_provenance

    return align_file(src, out, amap, tau, provenance=map_provenance(amap, ref_sha))


def test_align_keeps_labels_ids_and_moves_features(tmp_path):
    from fedalign.align import apply_map
    from fedalign.files import read_features

    ref, maps = _aligned_federation(tmp_path)
    src = tmp_path / "alpha.c0.train.h5"
    _align(src, tmp_path / "al.h5", maps["alpha.c0"], 0.5, ref.meta["sha256"])
    X0, y0, i0 = read_features(src)
    X1, y1, i1 = read_features(tmp_path / "al.h5")
    assert len(set(y0.tolist())) == 3
    np.testing.assert_array_equal(y1, y0)
    assert list(i1["ids"]) == list(i0["ids"]) and list(i1["class_names"]) == list(i0["class_names"])
    np.testing.assert_allclose(X1, apply_map(X0, maps["alpha.c0"], 0.5), rtol=1e-5, atol=1e-5)
    assert not np.allclose(X1, X0, atol=1e-2)


def test_evaluate_refuses_tests_mapped_at_another_tau_or_reference(tmp_path):
    from fedalign.evaluate import load_inputs

    ref, maps = _aligned_federation(tmp_path)
    sha = ref.meta["sha256"]
    al = tmp_path / "al"
    al.mkdir()
    for c in ("alpha.c0", "beta.c0"):
        _align(tmp_path / f"{c}.train.h5", al / f"{c}.train.h5", maps[c], 0.5, sha)
    train = [al / "alpha.c0.train.h5", al / "beta.c0.train.h5"]
    test = tmp_path / "alpha.test.h5"
    _align(test, al / "alpha.test.h5", maps["alpha.c0"], 0.5, sha)
    clients, tests, _ = load_inputs(train, [al / "alpha.test.h5"])       # same τ, same reference
    assert len(clients) == 2 and tests[0].alignment.tau == 0.5
    (tmp_path / "tau").mkdir()
    _align(test, tmp_path / "tau" / "alpha.test.h5", maps["alpha.c0"], 0.3, sha)
    with pytest.raises(FedalignError, match="not mapped like its clients"):
        load_inputs(train, [tmp_path / "tau" / "alpha.test.h5"])
    (tmp_path / "ref").mkdir()
    _align(test, tmp_path / "ref" / "alpha.test.h5", maps["alpha.c0"], 0.5, "0" * 64)
    with pytest.raises(FedalignError, match="not mapped like its clients"):
        load_inputs(train, [tmp_path / "ref" / "alpha.test.h5"])
    with pytest.raises(FedalignError, match="not mapped like its clients"):
        load_inputs(train, [test])                                         # unaligned test


# ------------------------------------------------------------------------ barycenter --strict
def _cli(*args, cwd):
    """``fedalign ARGS`` in process (typer's runner, stderr kept apart), run from ``cwd``."""
    from typer.testing import CliRunner

    from fedalign.cli import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(here)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def test_barycenter_not_converged_warns_records_and_strict_refuses(tmp_path):
    from fedalign.align import load_reference
    from fedalign.stats import compute_stats, save_stats

    stats = []
    for i in range(3):
        make_features(tmp_path / f"c{i}.h5", n=120, d=6, seed=i, scale=1.0 + i)
        save_stats(tmp_path / f"c{i}.stats.npz", compute_stats(tmp_path / f"c{i}.h5"))
        stats.append(tmp_path / f"c{i}.stats.npz")
    r = _cli("barycenter", *stats, "-o", "ref.npz", "--max-iter", "1", "--tol", "0", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "did not converge" in warn[0], r.stderr
    assert load_reference(tmp_path / "ref.npz").meta["convergence"]["converged"] is False
    r = _cli("barycenter", *stats, "-o", "strict.npz", "--max-iter", "1", "--tol", "0", "--strict",
             cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert "did not converge" in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "strict.npz").exists()
    assert not [p for p in tmp_path.iterdir() if "fedalign-tmp" in p.name]
    r = _cli("barycenter", *stats, "-o", "good.npz", "--strict", cwd=tmp_path)  # converges: fine
    assert r.exit_code == 0 and "warning:" not in r.stderr, r.stderr
    assert load_reference(tmp_path / "good.npz").meta["convergence"]["converged"] is True


# ------------------------------------------------------------- the reference (closed form)
def test_reference_is_the_weighted_bures_barycenter_closed_form():
    """Commuting (diagonal) covariances: √Σ* = Σ_k w_k √Σ_k, μ* = Σ_k w_k μ_k, with w_k = n_k/N
    (samples) or 1/K (uniform); one client: its own Gaussian."""
    from types import SimpleNamespace as NS

    from fedalign.align import make_reference

    rng = np.random.default_rng(0)
    mus, vs, ns = rng.normal(size=(3, 4)) * 2, rng.uniform(0.5, 4.0, (3, 4)), np.array([10, 30, 60])
    sts = [NS(mean=m, covariance=np.diag(v), n=int(n), d=4) for m, v, n in zip(mus, vs, ns)]
    for weights, w in (("samples", ns / ns.sum()), ("uniform", np.full(3, 1 / 3))):
        ref = make_reference(sts, weights, tol=1e-12, max_iter=200)
        np.testing.assert_allclose(ref.mean, w @ mus, atol=1e-10)
        np.testing.assert_allclose(ref.covariance, np.diag((w @ np.sqrt(vs)) ** 2), atol=1e-9)
        np.testing.assert_allclose(ref.weights, w, atol=1e-12)
        assert ref.meta["weighting"] == weights and ref.meta["max_iter"] == 200 and ref.meta["tol"] == 1e-12
        np.testing.assert_array_equal(ref.n, ns)
    one = make_reference(sts[:1])
    np.testing.assert_allclose(one.mean, mus[0], atol=1e-12)
    np.testing.assert_allclose(one.covariance, np.diag(vs[0]), atol=1e-10)
    with pytest.raises(FedalignError, match="weights must be"):
        make_reference(sts, "equal")

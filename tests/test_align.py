"""SLOT-Align on feature files: maps, streaming, reuse on other files."""

import numpy as np
import pytest

from fedalign.align import (align_file, apply_map, client_map, load_map, load_reference,
                            make_reference, save_map, save_reference)
from fedalign.errors import FedalignError
from fedalign.files import read_features
from fedalign.gaussian import w2_squared
from fedalign.stats import compute_stats


@pytest.fixture
def federation(feature_file):
    files = [feature_file(f"c{k}.h5", n=300 + 50 * k, d=6, seed=k, shift=2.0 * k, scale=1 + k)
             for k in range(3)]
    stats = [compute_stats(p) for p, _, _ in files]
    return files, stats


def test_reference_weights_and_roundtrip(federation, tmp_path):
    files, stats = federation
    ref = make_reference(stats, "samples")
    n = np.array([s.n for s in stats])
    np.testing.assert_allclose(ref.weights, n / n.sum())
    np.testing.assert_allclose(ref.mean, sum(w * s.mean for w, s in zip(ref.weights, stats)))
    assert ref.meta["convergence"]["converged"]
    save_reference(tmp_path / "ref.npz", ref)
    ref2 = load_reference(tmp_path / "ref.npz")
    np.testing.assert_array_equal(ref2.covariance, ref.covariance)
    assert len(ref2.meta["sha256"]) == 64
    uni = make_reference(stats, "uniform")
    np.testing.assert_allclose(uni.weights, 1 / 3)


def test_aligned_moments_match_reference(federation, tmp_path):
    files, stats = federation
    ref = make_reference(stats)
    (p, X, _), st = files[1], stats[1]
    amap = client_map(st, ref)
    align_file(p, tmp_path / "out.h5", amap, tau=1.0, chunk_rows=64)
    Z, y, info = read_features(tmp_path / "out.h5")
    out_stats = compute_stats(tmp_path / "out.h5", shrinkage="none")
    # mean maps exactly; the *shrunk* source covariance maps onto Σ_b
    np.testing.assert_allclose(out_stats.mean, ref.mean, atol=1e-4)
    np.testing.assert_allclose(amap.A @ st.covariance @ amap.A, ref.covariance, rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(info["ids"], read_features(p)[2]["ids"])
    assert info["provenance"]["history"][-1]["tau"] == 1.0


@pytest.mark.parametrize("tau", [0.0, 0.4])
def test_streamed_equals_in_memory(federation, tmp_path, tau):
    files, stats = federation
    ref = make_reference(stats)
    p, X, _ = files[0]
    amap = client_map(stats[0], ref)
    align_file(p, tmp_path / "o.h5", amap, tau=tau, chunk_rows=37)
    Z = read_features(tmp_path / "o.h5")[0]
    np.testing.assert_allclose(Z, apply_map(X, amap, tau), rtol=1e-5, atol=1e-5)
    if tau == 0.0:
        np.testing.assert_allclose(Z, X, atol=1e-5)


def test_w2_to_reference_shrinks_by_one_minus_tau(federation):
    files, stats = federation
    ref = make_reference(stats)
    st = stats[2]
    amap = client_map(st, ref)
    full = np.sqrt(w2_squared(st.mean, st.covariance, ref.mean, ref.covariance))
    from fedalign.gaussian import interpolate_map

    At, bt = interpolate_map(amap.A, amap.b, 0.25)
    w = np.sqrt(w2_squared(At @ st.mean + bt, At @ st.covariance @ At, ref.mean, ref.covariance))
    assert w == pytest.approx(0.75 * full, rel=1e-7)


def test_saved_map_reused_on_another_file(federation, tmp_path, feature_file):
    files, stats = federation
    amap = client_map(stats[0], make_reference(stats))
    save_map(tmp_path / "m.npz", amap)
    test_p, Xt, _ = feature_file("test.h5", n=40, d=6, seed=9)
    align_file(test_p, tmp_path / "t.h5", load_map(tmp_path / "m.npz"), tau=0.5)
    np.testing.assert_allclose(read_features(tmp_path / "t.h5")[0], apply_map(Xt, amap, 0.5),
                               rtol=1e-5, atol=1e-5)


def test_dimension_mismatch_leaves_no_output(federation, tmp_path, feature_file):
    files, stats = federation
    amap = client_map(stats[0], make_reference(stats))
    other, _, _ = feature_file("other.h5", d=5)
    with pytest.raises(FedalignError, match="dimension"):
        align_file(other, tmp_path / "bad.h5", amap)
    assert not (tmp_path / "bad.h5").exists()


def test_same_input_same_bytes(federation, tmp_path):
    files, stats = federation
    amap = client_map(stats[0], make_reference(stats))
    align_file(files[0][0], tmp_path / "a.h5", amap, 0.4)
    align_file(files[0][0], tmp_path / "b.h5", amap, 0.4)
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()


def test_server_loader_proves_factored_covariances_definite_and_refuses_singular_ones(tmp_path):
    """load_client_stats skips read_npz's Cholesky only for an exact c I + W Wᵀ with c > 0;
    a singular covariance (c = 0: shrinkage 0, n < d) in a file that skipped the writer's
    check is still refused, naming the file."""
    import numpy as np

    from fedalign.align import load_client_stats
    from fedalign.errors import FedalignError
    from fedalign.files import pack_symmetric
    from fedalign.linalg import ScaledIdentityPlusLowRank

    rng = np.random.default_rng(0)
    d, n = 40, 6
    paths = []
    for k, s in enumerate((0.3, 0.0)):
        X = rng.normal(size=(n, d))
        Y = X - X.mean(0)
        S = Y.T @ Y / n
        C = (1 - s) * S + s * np.trace(S) / d * np.eye(d)
        arrays = dict(n=np.int64(n), mean=X.mean(0), covariance_triu=pack_symmetric(C),
                      shrinkage=np.float64(s), shift=np.zeros(d), sum_y=X.sum(0),
                      sum_yy_triu=pack_symmetric(X.T @ X), sum_sqnorm_y=np.zeros(d),
                      sum_sqnorm2=np.float64(1.0), __kind__=np.array("stats"),
                      __format_version__=np.array(2), __meta__=np.array("{}"))
        paths.append(tmp_path / f"c{k}.stats.npz")
        np.savez(paths[-1], **arrays)
    (good,) = load_client_stats(paths[:1], "factored")
    assert isinstance(good.stats.covariance, ScaledIdentityPlusLowRank)
    assert good.stats.covariance.rank == n - 1
    with pytest.raises(FedalignError, match="c1.stats.npz: 'covariance' is not positive definite"):
        load_client_stats(paths, "factored")


def test_client_maps_equal_client_map_per_client():
    from fedalign.align import Reference, client_map, client_maps
    from fedalign.federation import gaussian_stats

    rng = np.random.default_rng(5)
    sts = [gaussian_stats(rng.normal(k, 1.0 + k, size=(40, 4))) for k in range(3)]
    ref = Reference(np.zeros(4), np.eye(4) * 2.0, np.ones(1), np.array([40]), {})
    many = client_maps(sts, ref, clients=["a", "b", "c"], domains=["x", "y", "z"])
    for st, mp, c, dm in zip(sts, many, "abc", "xyz"):
        one = client_map(st, ref, client=c, domain=dm)
        np.testing.assert_array_equal(mp.A, one.A)
        assert mp.meta == one.meta


@pytest.mark.parametrize("weights, n, message", [
    ([0.25, 0.25], [300, 350], r"'weights' \(the clients' w_k\) must be ≥ 0 and sum to 1, got "
                               r"\[0.25 0.25\] \(sum 0.5\)$"),
    ([1.5, -0.5], [300, 350], r"'weights' .* must be ≥ 0 and sum to 1, got \[ 1.5 -0.5\] \(sum 1\)$"),
    ([0.5, 0.5], [300, 0], r"'n' \(the clients' row counts\) must be ≥ 1, got \[300   0\]$"),
], ids=["sum-0.5", "negative", "n-0"])
def test_reference_with_bad_weights_or_counts_is_refused(federation, tmp_path, weights, n, message):
    """A reference's w_k are ≥ 0 and sum to 1 and its n_k ≥ 1 (every writer makes them so):
    anything else is a damaged or hand-edited file."""
    _, stats = federation
    ref = make_reference(stats[:2], "samples")
    good = save_reference(tmp_path / "ref.npz", ref)
    d = dict(np.load(good))
    d.update(weights=np.array(weights, float), n=np.array(n, np.int64))
    np.savez(tmp_path / "bad.npz", **d)
    with pytest.raises(FedalignError, match=message):
        load_reference(tmp_path / "bad.npz")
    np.testing.assert_allclose(load_reference(good).weights, ref.weights)   # the writer's: read


def test_references_the_tool_writes_are_read(federation, tmp_path, feature_file):
    """Round trip: the barycenter (sample and uniform weights, one client) and the target's
    completed reference (one weight 1, n = the target's rows) are read back as written."""
    from fedalign.label_shift import reference_from_files
    from fedalign.stats import save_stats

    files, stats = federation
    for i, (weights, sts) in enumerate((("samples", stats), ("uniform", stats), ("samples", stats[:1]))):
        ref = make_reference(sts, weights)
        back = load_reference(save_reference(tmp_path / f"r{i}.npz", ref))
        np.testing.assert_array_equal(back.weights, ref.weights)
        np.testing.assert_array_equal(back.n, ref.n)
    srcs = [save_stats(tmp_path / f"s{k}.npz", compute_stats(p, per_class=True))
            for k, (p, _, _) in enumerate(files[:2])]
    ref, _ = reference_from_files(files[2][0], srcs)
    back = load_reference(save_reference(tmp_path / "t.npz", ref))
    assert back.weights.tolist() == [1.0] and back.n.tolist() == [400]

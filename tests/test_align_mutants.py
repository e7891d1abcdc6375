"""SLOT-Align behaviours found untested by the mutation run of ``fedalign/align.py`` (issue 19,
docs/mutation.md): the reference's fixed-point settings and file round trip, the float32
product of the maps (exact closed forms), chunked streaming (rows, labels, ids, progress and
HDF5 chunks for any chunk size), the history an aligned file keeps, the digest's bytes, the DP
record carried into maps and aligned files, the owner record read back by the protocol checks,
the chosen backend doing the work (and being recorded), and the torch path on the CPU."""

from __future__ import annotations

import contextlib
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from fedalign.align import (AffineMap, align_file, apply_map, client_map, domain_map,
                            load_reference, make_reference, map_provenance, save_reference,
                            stats_digest)
from fedalign.backend import NumpyBackend
from fedalign.errors import FedalignError
from fedalign.files import read_features, sha256_file, write_features
from fedalign.gaussian import gaussian_barycenter
from fedalign.stats import GaussianStats, Moments, shrunk_covariance


def _stats(seed, n=60, d=4, shrinkage="auto"):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + 3.0 * seed
    m = Moments(d).update(X).finalize()
    C, s = shrunk_covariance(m, shrinkage)
    return GaussianStats(m.n, m.mean, C, s, m)


@pytest.fixture
def sts():
    return [_stats(k, n=40 + 20 * k) for k in range(3)]


def _features(path, n=11, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = rng.integers(0, 3, size=n)
    ids = [f"row{i:03d}" for i in range(n)]
    write_features(path, X, y, ids, class_names=["a", "b", "c"], provenance={"producer": "tests"})
    return X, y, ids


class SpyBackend(NumpyBackend):
    """The numpy kernels, recording every guarded step (what, bytes) and a compute record."""

    name = "spy"

    def __init__(self):
        self.guarded = []

    def record(self) -> dict:
        return {"backend": "spy", "device": "cpu"}

    @contextlib.contextmanager
    def guard(self, what: str, nbytes: int = 0):
        self.guarded.append((what, nbytes))
        yield


# -- the reference ---------------------------------------------------------------------------
def test_reference_runs_the_fixed_point_with_the_callers_tol_max_iter_and_progress(sts):
    w = np.array([s.n for s in sts]) / sum(s.n for s in sts)
    means, covs = [s.mean for s in sts], [s.covariance for s in sts]
    ref = make_reference(sts)  # defaults: the barycenter's own tol 1e-10, max_iter 100
    want = gaussian_barycenter(means, covs, w).record()
    assert ref.meta["convergence"] == want and want["converged"] and want["iterations"] > 1
    assert ref.meta["convergence"]["residual"] <= 1e-10 == ref.meta["tol"]
    calls = []
    loose = make_reference(sts, tol=1e-3, progress=lambda *a: calls.append(a))
    assert loose.meta["convergence"] == gaussian_barycenter(means, covs, w, tol=1e-3).record()
    assert len(calls) == loose.meta["convergence"]["iterations"] < want["iterations"]
    assert [c[0] for c in calls] == list(range(1, len(calls) + 1))
    one = make_reference(sts, max_iter=1)
    assert one.meta["convergence"]["iterations"] == 1 and not one.meta["convergence"]["converged"]
    assert one.meta["max_iter"] == 1


def test_reference_refuses_no_stats_other_dimensions_bad_backends_and_devices(sts):
    with pytest.raises(FedalignError, match="at least one stats file"):
        make_reference([])
    with pytest.raises(FedalignError, match="d=4 and d=3"):
        make_reference([sts[0], _stats(5, d=3)])
    with pytest.raises(FedalignError, match="backend must be"):
        make_reference(sts, backend="jax")
    with pytest.raises(FedalignError, match="device must be"):
        make_reference(sts, device="tpu")


def test_reference_file_keeps_weights_counts_convergence_and_extra_meta(sts, tmp_path):
    ref = make_reference(sts, "uniform")
    p = save_reference(tmp_path / "ref.npz", ref, extra_meta={"inputs": ["a", "b", "c"]})
    back = load_reference(p)
    np.testing.assert_array_equal(back.weights, ref.weights)
    np.testing.assert_array_equal(back.n, [40, 60, 80])
    np.testing.assert_array_equal(back.mean, ref.mean)
    assert back.meta["convergence"] == ref.meta["convergence"] and back.meta["weighting"] == "uniform"
    assert back.meta["tol"] == 1e-10 and back.meta["inputs"] == ["a", "b", "c"]
    assert back.meta["sha256"] == sha256_file(p)
    plain = load_reference(save_reference(tmp_path / "plain.npz", ref))
    assert plain.meta["convergence"] == ref.meta["convergence"] and "inputs" not in plain.meta


# -- digests and owner records ---------------------------------------------------------------
def test_stats_digest_is_the_sha256_of_n_mean_and_covariance_as_float64_bytes():
    st = _stats(1)
    # values a float32 array holds exactly, so the float32 copy is the same statistics
    mean = st.mean.astype(np.float32).astype(np.float64)
    cov = st.covariance.astype(np.float32).astype(np.float64)
    s64 = GaussianStats(st.n, mean, cov, st.shrinkage, st.moments)
    s32 = GaussianStats(st.n, mean.astype(np.float32), cov.astype(np.float32), st.shrinkage,
                        st.moments)
    oracle = hashlib.sha256(np.int64(st.n).tobytes() + mean.tobytes() + cov.tobytes()).hexdigest()
    assert stats_digest(s64) == stats_digest(s32) == oracle
    moved = GaussianStats(st.n, mean + np.eye(4)[0], cov, st.shrinkage, st.moments)
    assert stats_digest(moved) != oracle


def test_maps_refuse_other_dimensions_and_client_counts(sts):
    ref = make_reference(sts)
    small = _stats(7, d=3)
    with pytest.raises(FedalignError, match="client d=3, reference d=4"):
        client_map(small, ref)
    with pytest.raises(FedalignError, match="domain d=3, reference d=4"):
        domain_map([small], ref, "D", ["x"])
    with pytest.raises(FedalignError, match="2 statistics for 1 clients"):
        domain_map(sts[:2], ref, "D", ["x"])
    for bad in (dict(backend="jax"), dict(device="tpu")):
        with pytest.raises(FedalignError, match="must be"):
            client_map(sts[0], ref, **bad)
        with pytest.raises(FedalignError, match="must be"):
            domain_map(sts[:2], ref, "D", ["a", "b"], **bad)


def test_domain_map_of_one_client_is_exactly_its_client_map():
    """One client: the pooled Gaussian is that client's own (not re-estimated: its fixed
    shrinkage 0.3 is kept, where pooling would compute Ledoit–Wolf's)."""
    sts = [_stats(k, shrinkage=0.3) for k in range(2)]
    ref = make_reference(sts)
    cm, dm = client_map(sts[0], ref, "a", "D"), domain_map(sts[:1], ref, "D", ["a"])
    np.testing.assert_array_equal(dm.A, cm.A)
    np.testing.assert_array_equal(dm.b, cm.b)
    assert dm.meta["stats_sha256"] == cm.meta["stats_sha256"] == stats_digest(sts[0])
    assert dm.meta["client_stats_sha256"] == [stats_digest(sts[0])] and dm.meta["n"] == 60


def test_domain_map_provenance_is_read_back_and_checked_by_the_protocol(sts, tmp_path):
    """The owner record of a domain map, through ``alignment_of``: its reference (from the map
    when none is given), domain, clients and their digests, so that a test file mapped by a
    domain map that pooled other statistics of a client is refused."""
    from fedalign.protocol import Alignment, alignment_of, check_test_map

    ref = load_reference(save_reference(tmp_path / "ref.npz", make_reference(sts)))
    dm = domain_map(sts[:2], ref, "D", ["a", "b"])
    assert dm.meta["reference_sha256"] == ref.meta["sha256"]
    prov = map_provenance(dm)
    assert prov["reference_sha256"] == ref.meta["sha256"]
    assert map_provenance(dm, "f" * 64)["reference_sha256"] == "f" * 64
    a = alignment_of({"history": [dict(prov, step="align", tau=0.4)]})
    assert (a.scope, a.domain, a.clients) == ("domain", "D", ["a", "b"])
    assert a.reference_sha256 == ref.meta["sha256"] and a.stats_sha256 == dm.meta["stats_sha256"]
    assert a.client_stats_sha256 == [stats_digest(s) for s in sts[:2]]
    t = SimpleNamespace(domain="D", path="D.test.h5")
    clients = [SimpleNamespace(name=c, domain="D") for c in ("a", "b")]
    own = {c: Alignment(0.4, ref.meta["sha256"], "client", c, "D", [], stats_digest(s))
           for c, s in zip(("a", "b"), sts[:2])}
    check_test_map(t, a, clients, own)  # the domain map of the clients' own statistics: accepted
    other = alignment_of({"history": [dict(map_provenance(domain_map([sts[0], sts[2]], ref, "D",
                                                                      ["a", "b"])),
                                           step="align", tau=0.4)]})
    with pytest.raises(FedalignError, match="other statistics of client 'b'"):
        check_test_map(t, other, clients, own)


def test_provenance_of_a_domain_map_without_client_records_has_empty_lists():
    """A domain map that records no clients or digests (made by hand, or by an older fedalign)
    still gives an owner record: empty lists, never an error."""
    amap = AffineMap(np.eye(2), np.zeros(2), dict(scope="domain", domain="D", reference_sha256="r"))
    prov = map_provenance(amap)
    assert prov["map_clients"] == [] and prov["client_stats_sha256"] == []
    assert prov["reference_sha256"] == "r" and prov["map_domain"] == "D" and "dp" not in prov


# -- DP records ------------------------------------------------------------------------------
def test_maps_and_their_provenance_carry_the_dp_record_of_the_stats_or_of_the_reference(sts):
    from fedalign.dp import make_spec, noise_rng, reference_inputs, release_stats
    from fedalign.dp.accounting import compact

    rng = np.random.default_rng(3)
    dp = release_stats(rng.normal(size=(200, 4)), make_spec(2.0, 1e-5, 4.0), noise_rng(0))
    exact_ref = make_reference(sts)
    # DP statistics, exact reference: the statistics' record
    m = client_map(dp, exact_ref, "a", "D")
    assert m.meta["dp"] == {"map_stats": compact(dp.dp), "reference_inputs": None}
    assert m.meta["scope"] == "client" and m.meta["stats_sha256"] == stats_digest(dp)
    assert map_provenance(m)["dp"] == m.meta["dp"] and map_provenance(m)["map_client"] == "a"
    # exact statistics, a reference built from DP inputs: the reference's inputs
    inputs = reference_inputs([{"client": "a", "dp": dp.dp}, {"client": "b"}],
                              [stats_digest(dp), stats_digest(sts[1])])
    dp_ref = make_reference(sts)
    dp_ref.meta["dp_inputs"] = inputs
    m2 = client_map(sts[0], dp_ref, "b", "D")
    assert m2.meta["dp"] == {"map_stats": None, "reference_inputs": inputs}
    assert map_provenance(m2)["dp"] == m2.meta["dp"]
    dm = domain_map(sts[:2], dp_ref, "D", ["a", "b"])
    assert dm.meta["dp"]["reference_inputs"] == inputs and dm.meta["scope"] == "domain"
    # neither: no record at all
    plain = client_map(sts[0], exact_ref, "b", "D")
    assert "dp" not in plain.meta and "dp" not in map_provenance(plain)


# -- the product: float32, exact -------------------------------------------------------------
# T(z) = A z + b with A = [[1 + 1e-9, −1], [0, 1]], b = (0, 1 + 2⁻²⁷): in float32, A₀₀ and b₁
# round to 1, so z = (1e4, 1e4) ↦ (0, 10001) exactly, and z = (0, 2²⁴) ↦ (−2²⁴, 2²⁴) (2²⁴ + 1 is
# a tie, rounded to even). A float64 product gives 1e-5 in the first entry, a float64 b₁ 2²⁴ + 2.
_A = np.array([[1.0 + 1e-9, -1.0], [0.0, 1.0]])
_b = np.array([0.0, 1.0 + 2.0 ** -27])
_X = np.array([[1e4, 1e4], [0.0, 2.0 ** 24]], dtype=np.float32)
_Z = np.array([[0.0, 10001.0], [-(2.0 ** 24), 2.0 ** 24]], dtype=np.float32)


def _float32_case(tmp_path):
    write_features(tmp_path / "x.h5", _X, [0, 1], ["p", "q"], class_names=["a", "b"])
    return tmp_path / "x.h5", AffineMap(_A.copy(), _b.copy(), {})


def test_apply_map_computes_in_float32_whatever_the_input_dtype():
    for X in (_X, _X.astype(np.float64)):
        Z = apply_map(X, AffineMap(_A, _b, {}), 1.0)
        assert Z.dtype == np.float32
        np.testing.assert_array_equal(Z, _Z)


def test_align_file_computes_in_float32_like_apply_map(tmp_path):
    src, amap = _float32_case(tmp_path)
    align_file(src, tmp_path / "z.h5", amap, tau=1.0)
    np.testing.assert_array_equal(read_features(tmp_path / "z.h5")[0], _Z)


def test_torch_backend_on_the_cpu_gives_the_same_float32_numbers_and_records_itself(tmp_path):
    pytest.importorskip("torch")
    src, amap = _float32_case(tmp_path)
    align_file(src, tmp_path / "t.h5", amap, tau=1.0, chunk_rows=1, backend="torch", device="cpu")
    Z, y, info = read_features(tmp_path / "t.h5")
    np.testing.assert_array_equal(Z, _Z)
    assert info["provenance"]["history"][-1]["compute"] == {"backend": "torch", "device": "cpu"}
    np.testing.assert_array_equal(y, [0, 1])


# -- streaming -------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_rows", [1, 2, 4, 11, 8192])
def test_streamed_rows_labels_ids_and_progress_do_not_depend_on_the_chunk_size(tmp_path, chunk_rows):
    import h5py

    X, y, ids = _features(tmp_path / "x.h5")
    amap = AffineMap(np.eye(4) * 2.0 + 0.1, np.arange(4.0), {})
    seen = []
    align_file(tmp_path / "x.h5", tmp_path / "z.h5", amap, 0.5, chunk_rows=chunk_rows,
               progress=seen.append)
    Z, y2, info = read_features(tmp_path / "z.h5")
    np.testing.assert_allclose(Z, apply_map(X, amap, 0.5), rtol=1e-6, atol=1e-6)  # BLAS: ≤ 1 ulp
    np.testing.assert_array_equal(y2, y)
    assert list(info["ids"]) == ids and list(info["class_names"]) == ["a", "b", "c"]
    full, rest = divmod(11, chunk_rows)
    assert seen == [chunk_rows] * full + ([rest] if rest else [])  # one call per block, in order
    with h5py.File(tmp_path / "z.h5") as h:  # HDF5 chunks: the blocks, never more than the rows
        assert h["features"].chunks == (min(chunk_rows, 11), 4)


def test_align_appends_its_step_to_the_history_the_file_already_has(tmp_path):
    _features(tmp_path / "x.h5")
    amap = AffineMap(np.eye(4), np.ones(4), {})
    align_file(tmp_path / "x.h5", tmp_path / "a.h5", amap, 0.25, provenance={"map_client": "c0"})
    align_file(tmp_path / "a.h5", tmp_path / "b.h5", amap, 0.5)
    prov = read_features(tmp_path / "b.h5")[2]["provenance"]
    assert prov["producer"] == "tests"
    assert prov["history"] == [dict(map_client="c0", step="align", tau=0.25),
                               dict(step="align", tau=0.5)]


def test_align_file_refuses_bad_backends_and_devices_and_writes_nothing(tmp_path):
    _features(tmp_path / "x.h5")
    amap = AffineMap(np.eye(4), np.zeros(4), {})
    for bad in (dict(backend="jax"), dict(device="tpu")):
        with pytest.raises(FedalignError, match="must be"):
            align_file(tmp_path / "x.h5", tmp_path / "z.h5", amap, **bad)
    assert not (tmp_path / "z.h5").exists()


# -- the backend the caller chose ------------------------------------------------------------
def test_the_chosen_backend_runs_every_step_and_the_runs_record_it(sts, tmp_path):
    """A backend adapter passed in does the barycenter, the maps and the product of every
    block (each guarded with what it is and its bytes, for the out-of-memory line: float32
    block in and out, 8 bytes a value, plus the float32 map), and is recorded."""
    spy = SpyBackend()
    ref = make_reference(sts, backend=spy)
    assert spy.guarded[0][0] == "the barycenter (K=3, d=4)" and ref.meta["compute"] == spy.record()
    spy.guarded.clear()
    amap = client_map(sts[0], ref, backend=spy)
    domain_map(sts[:2], ref, "D", ["a", "b"], backend=spy)
    assert [g[0] for g in spy.guarded] == ["the OT map", "the OT map"]
    spy.guarded.clear()
    _features(tmp_path / "x.h5", n=7)
    align_file(tmp_path / "x.h5", tmp_path / "z.h5", amap, 0.5, chunk_rows=3,
               provenance={"map_client": "c0"}, backend=spy)
    block = lambda m: (f"align of a {m} × 4 block", 8 * m * 4 + 4 * 4 * 4)  # noqa: E731
    assert spy.guarded == [block(3), block(3), block(1)]
    step = read_features(tmp_path / "z.h5")[2]["provenance"]["history"][-1]
    assert step == dict(map_client="c0", compute=spy.record(), step="align", tau=0.5)


def test_reference_records_its_default_iteration_cap_and_refuses_no_stats_in_full_words(sts):
    assert make_reference(sts).meta["max_iter"] == 100
    with pytest.raises(FedalignError) as e:
        make_reference([])
    assert str(e.value) == "barycenter needs at least one stats file"


def test_sample_weights_of_billions_of_rows_do_not_overflow(sts):
    import dataclasses

    big = [dataclasses.replace(s, n=3_000_000_000) for s in sts[:2]]  # n_k · N > 2⁶³
    np.testing.assert_array_equal(make_reference(big).weights, [0.5, 0.5])


def test_aligned_files_are_written_in_hdf5_chunks_of_at_most_4096_rows(tmp_path, sts):
    import h5py

    src = tmp_path / "big.h5"
    rng = np.random.default_rng(0)
    write_features(src, rng.normal(size=(5000, 4)).astype(np.float32), rng.integers(0, 2, 5000),
                   [f"r{i}" for i in range(5000)], class_names=["a", "b"])
    ref = make_reference(sts)
    out = align_file(src, tmp_path / "big.al.h5", client_map(sts[0], ref), tau=0.5)
    with h5py.File(out, "r") as f:
        assert f["features"].chunks == (4096, 4)

"""The torch backend of stats, barycenter and align (on the CPU: no GPU needed), its bad input,
and that the default (numpy) path never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.files import write_features

torch = pytest.importorskip("torch")


def _covs(K, d, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(K):
        Z = rng.normal(size=(2 * d, d)) * rng.uniform(0.2, 3.0, size=d)
        out.append(Z.T @ Z / (2 * d) + 1e-3 * np.eye(d))
    return out


def _features(path, seed, n=400, d=12):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = (rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) * (1 + seed) + 3 * y[:, None]
         + seed).astype(np.float32)
    write_features(path, X, y, [f"{seed}_{i}" for i in range(n)], class_names=["a", "b", "c"])
    return path


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


# -- the library functions -------------------------------------------------------------------
def test_get_backend_rejects_bad_strings_and_missing_gpu():
    from fedalign.backend import get_backend

    assert get_backend().name == "numpy" and get_backend("numpy", "cpu").is_torch is False
    assert get_backend("torch", "cpu").device == "cpu"
    for bad in ("gpu", "cuda:x", "tpu", ""):
        if bad:
            with pytest.raises(FedalignError, match="device must be"):
                get_backend("torch", bad)
    with pytest.raises(FedalignError, match="backend must be"):
        get_backend("jax", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(FedalignError, match="no CUDA device"):
            get_backend("torch", "cuda")
        assert get_backend("numpy", "auto").name == "numpy"


def test_linalg_and_ot_map_match_numpy():
    from fedalign.gaussian import ot_map
    from fedalign.linalg import sqrt_and_inv_sqrt

    C = _covs(2, 24)
    R, Ri = sqrt_and_inv_sqrt(C[0])
    Rt, Rit = sqrt_and_inv_sqrt(C[0], backend="torch")
    assert isinstance(Rt, torch.Tensor) and Rt.dtype == torch.float64
    assert _rel(Rt.numpy(), R) < 1e-12 and _rel(Rit.numpy(), Ri) < 1e-12
    A, b = ot_map(np.zeros(24), C[0], np.ones(24), C[1])
    At, bt = ot_map(np.zeros(24), C[0], np.ones(24), C[1], backend="torch", device="cpu")
    assert isinstance(At, np.ndarray) and _rel(At, A) < 1e-12 and _rel(bt, b) < 1e-12


@pytest.mark.parametrize("tol", [1e-10, 1e-7])
def test_barycenter_torch_equals_numpy_within_10_tol(tol):
    from fedalign.gaussian import bures_barycenter, fixed_point_residual

    covs, w = _covs(6, 40, seed=3), np.arange(1, 7) / 21
    a = bures_barycenter(covs, w, tol=tol)
    b = bures_barycenter(covs, w, tol=tol, backend="torch", device="cpu")
    assert a.converged and b.converged and isinstance(b.covariance, np.ndarray)
    assert _rel(b.covariance, a.covariance) <= 10 * tol
    assert fixed_point_residual(b.covariance, [C + 0 for C in covs], w) <= 10 * tol
    assert abs(a.iterations - b.iterations) <= 1


def test_barycenter_torch_reduced_subspace_equals_numpy():
    """Clients with n_k ≪ d: the exact scalar-complement reduction on the torch path too."""
    from fedalign.gaussian import bures_barycenter

    rng, d = np.random.default_rng(1), 96
    covs = []
    for k in range(4):
        U = rng.normal(size=(d, 4))
        covs.append((k + 1) * 0.3 * np.eye(d) + U @ U.T)
    a, b = bures_barycenter(covs), bures_barycenter(covs, backend="torch")
    assert a.reduced_dim == b.reduced_dim and a.reduced_dim is not None
    assert _rel(b.covariance, a.covariance) <= 1e-9


def test_stats_torch_equals_numpy(tmp_path):
    from fedalign.stats import compute_stats

    f = _features(tmp_path / "a.h5", 0)
    a = compute_stats(f, per_class=True, chunk_rows=97)
    b = compute_stats(f, per_class=True, chunk_rows=97, backend="torch", device="cpu")
    assert a.n == b.n
    for x, y in ((a.mean, b.mean), (a.covariance, b.covariance),
                 (a.moments.sum_yy, b.moments.sum_yy), (a.moments.sum_sqnorm_y, b.moments.sum_sqnorm_y),
                 (a.moments.class_sums, b.moments.class_sums)):
        assert _rel(y, x) <= 1e-10
    assert abs(a.shrinkage - b.shrinkage) <= 1e-10 * max(a.shrinkage, 1e-300)
    assert abs(a.moments.sum_sqnorm2 - b.moments.sum_sqnorm2) <= 1e-10 * a.moments.sum_sqnorm2


def test_align_torch_equals_numpy(tmp_path):
    from fedalign.align import align_file, client_map, make_reference
    from fedalign.files import read_features
    from fedalign.stats import compute_stats

    sts = [compute_stats(_features(tmp_path / f"c{i}.h5", i)) for i in range(3)]
    ref_n = make_reference(sts)
    ref_t = make_reference(sts, backend="torch")
    assert _rel(ref_t.covariance, ref_n.covariance) <= 1e-9
    assert ref_t.meta["compute"] == {"backend": "torch", "device": "cpu"}
    assert "compute" not in ref_n.meta
    m_n, m_t = client_map(sts[0], ref_n), client_map(sts[0], ref_n, backend="torch")
    assert _rel(m_t.A, m_n.A) <= 1e-10
    align_file(tmp_path / "c0.h5", tmp_path / "n.h5", m_n, 0.4, chunk_rows=50)
    align_file(tmp_path / "c0.h5", tmp_path / "t.h5", m_n, 0.4, chunk_rows=50,
               backend="torch", device="cpu")
    Xn, yn, inf_n = read_features(tmp_path / "n.h5")
    Xt, yt, inf_t = read_features(tmp_path / "t.h5")
    np.testing.assert_array_equal(yn, yt)
    np.testing.assert_allclose(Xt, Xn, rtol=1e-5, atol=1e-5 * np.abs(Xn).max())
    assert inf_t["provenance"]["history"][-1]["compute"]["backend"] == "torch"
    assert "compute" not in inf_n["provenance"]["history"][-1]


# -- the CLI ---------------------------------------------------------------------------------
def test_cli_torch_backend_records_device(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fedalign.cli import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    _features(tmp_path / "c0.h5", 0)
    _features(tmp_path / "c1.h5", 1)
    for args in (["stats", "c0.h5", "-o", "c0.stats.npz", "--backend", "torch"],
                 ["stats", "c1.h5", "-o", "c1.stats.npz", "--backend", "torch"],
                 ["barycenter", "c0.stats.npz", "c1.stats.npz", "-o", "ref.npz", "--backend",
                  "torch", "--device", "cpu"],
                 ["align", "c0.h5", "ref.npz", "-o", "c0.al.h5", "--backend", "torch"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.output)
    for f in ("c0.stats.npz", "ref.npz"):
        with np.load(tmp_path / f) as z:
            meta = json.loads(str(z["__meta__"]))
        assert meta["compute"] == {"backend": "torch", "device": "cpu"}


def _stats_and_ref(tmp_path):
    from fedalign.align import make_reference, save_reference
    from fedalign.stats import compute_stats, save_stats

    st = compute_stats(_features(tmp_path / "c0.h5", 0))
    save_stats(tmp_path / "c0.stats.npz", st)
    save_reference(tmp_path / "ref.npz", make_reference([st]))


@pytest.mark.parametrize("cmd, device", [("stats", "cuda"), ("barycenter", "gpu"),
                                         ("align", "cuda:1"), ("align", "cuda:zero")])
def test_cli_bad_device_is_one_error_line_and_no_output(tmp_path, monkeypatch, cmd, device):
    if device in ("cuda", "cuda:1") and torch.cuda.device_count() > 1:
        pytest.skip("GPUs are present")
    from typer.testing import CliRunner

    from fedalign.cli import app

    _stats_and_ref(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = {"stats": ["c0.h5"], "barycenter": ["c0.stats.npz"], "align": ["c0.h5", "ref.npz"]}
    # in process (torch is loaded here already; a subprocess would import it again for ~2 s)
    r = CliRunner().invoke(app, [cmd, *args[cmd], "-o", "out.x", "--device", device])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out.x").exists()


def test_oom_becomes_one_line_saying_how_much():
    from fedalign.backend import get_backend

    bk = get_backend("torch", "cpu")
    with pytest.raises(FedalignError, match=r"out of GPU memory in the test: it needs about 2\.00 GiB"):
        with bk.guard("the test", 2 * 2**30):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")


def test_help_and_numpy_path_do_not_import_torch(tmp_path):
    _features(tmp_path / "c0.h5", 0)
    code = """
import sys
from typer.testing import CliRunner
from fedalign.cli import app
r = CliRunner()
for args in (["--help"], ["stats", "--help"], ["stats", "c0.h5", "-o", "c0.stats.npz"],
             ["barycenter", "c0.stats.npz", "-o", "ref.npz"],
             ["align", "c0.h5", "ref.npz", "-o", "al.h5"]):
    res = r.invoke(app, args)
    assert res.exit_code == 0, (args, res.output)
print("torch" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"

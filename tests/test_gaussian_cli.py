"""CLI: stats → barycenter → align, through CliRunner and a real subprocess; bad input."""

import subprocess
import sys

import h5py
import numpy as np
import pytest
from sklearn.covariance import LedoitWolf
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.files import read_features, read_npz, write_features

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def clients(feature_file):
    return [feature_file(f"c{k}.h5", n=120, d=5, seed=k, shift=k) for k in range(3)]


def test_pipeline(clients, tmp_path):
    stats = []
    for p, X, _ in clients:
        s = tmp_path / (p.stem + ".stats.npz")
        r = run("stats", p, "-o", s, "--per-class")
        assert r.exit_code == 0, r.output
        a, _ = read_npz(s, "stats")
        np.testing.assert_allclose(a["covariance"], LedoitWolf().fit(X.astype(float)).covariance_, rtol=1e-10)
        stats.append(s)
    r = run("barycenter", *stats, "-o", tmp_path / "ref.npz")
    assert r.exit_code == 0, r.output
    line = [ln for ln in r.output.splitlines() if ln.startswith("barycenter:")]
    assert len(line) == 1 and " converged in " in line[0] and "NOT converged" not in r.output, r.output
    assert "residual" in line[0] and "warning:" not in r.output
    _, meta = read_npz(tmp_path / "ref.npz", "reference")
    assert meta["convergence"]["converged"] and meta["convergence"]["iterations"] >= 1
    p = clients[0][0]
    r = run("align", "--tau", "0.5", p, tmp_path / "ref.npz", "-o", tmp_path / "al.h5",
            "--save-map", tmp_path / "map.npz", "--stats", stats[0])
    assert r.exit_code == 0, r.output
    r = run("align", "--map", tmp_path / "map.npz", "--tau", "0.5", p, "-o", tmp_path / "al2.h5")
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(read_features(tmp_path / "al.h5")[0], read_features(tmp_path / "al2.h5")[0])
    # default output name
    r = run("align", p, tmp_path / "ref.npz")
    assert r.exit_code == 0 and (p.parent / "c0.aligned.h5").exists()


def test_subprocess_and_help_does_not_import_torch(clients, tmp_path):
    p = clients[0][0]
    r = subprocess.run([sys.executable, "-m", "fedalign", "stats", str(p), "-o", str(tmp_path / "s.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    code = "import sys; from fedalign.cli import app; sys.argv=['fedalign','--help'];\n" \
           "try:\n    app()\nexcept SystemExit:\n    pass\n" \
           "bad=[m for m in ('torch','timm','sklearn','ot','matplotlib') if m in sys.modules]; print('HEAVY', bad)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr


def _assert_clean_error(r, out, pattern):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert pattern.lower() in lines[0].lower(), lines[0]
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not out.exists()
    assert not [f for f in out.parent.iterdir() if f.name.startswith("." + out.name)]


def test_bad_inputs(clients, tmp_path):
    p = clients[0][0]
    out = tmp_path / "out.npz"
    _assert_clean_error(run("stats", tmp_path / "nope.h5", "-o", out), out, "no such file")
    trunc = tmp_path / "trunc.h5"
    trunc.write_bytes(p.read_bytes()[:500])
    _assert_clean_error(run("stats", trunc, "-o", out), out, "not a readable HDF5")
    # NaN features
    nanf = tmp_path / "nan.h5"
    X = np.ones((4, 3), np.float32)
    write_features(nanf, X, np.zeros(4), list("abcd"))
    with h5py.File(nanf, "r+") as h:
        h["features"][1, 1] = np.inf
    _assert_clean_error(run("stats", nanf, "-o", out), out, "NaN or Inf")
    # fewer than 2 samples
    one = tmp_path / "one.h5"
    write_features(one, np.ones((1, 3)), [0], ["a"])
    _assert_clean_error(run("stats", one, "-o", out), out, "at least 2")
    # wrong kind: a features file where stats are expected
    _assert_clean_error(run("barycenter", p, "-o", out), out, "expected a stats .npz file")
    run("stats", p, "-o", tmp_path / "a.stats.npz")
    _assert_clean_error(run("align", p, tmp_path / "a.stats.npz", "-o", tmp_path / "x.h5"),
                        tmp_path / "x.h5", "is a stats file, expected a reference file")
    # wrong version
    a = dict(np.load(tmp_path / "a.stats.npz"))
    a["__format_version__"] = np.array(7)
    np.savez(tmp_path / "v.stats.npz", **a)
    _assert_clean_error(run("barycenter", tmp_path / "v.stats.npz", "-o", out), out, "format_version 7")
    # dimension mismatch between stats files
    q = tmp_path / "d4.h5"
    write_features(q, np.random.default_rng(0).normal(size=(20, 4)), np.zeros(20), [str(i) for i in range(20)])
    run("stats", q, "-o", tmp_path / "d4.stats.npz")
    _assert_clean_error(run("barycenter", tmp_path / "a.stats.npz", tmp_path / "d4.stats.npz", "-o", out),
                        out, "dimension mismatch")
    # tau out of range
    run("barycenter", tmp_path / "a.stats.npz", "-o", tmp_path / "ref.npz")
    _assert_clean_error(run("align", "--tau", "1.5", p, tmp_path / "ref.npz", "-o", tmp_path / "y.h5"),
                        tmp_path / "y.h5", "tau")
    # pickled npz
    np.savez(tmp_path / "pk.npz", x=np.array([{"a": 1}], dtype=object))
    _assert_clean_error(run("barycenter", tmp_path / "pk.npz", "-o", out), out, "pickle")
    # bad shrinkage
    _assert_clean_error(run("stats", p, "-o", out, "--shrinkage", "2"), out, "shrinkage")


def test_subprocess_bad_input_exit_code(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fedalign", "stats", str(tmp_path / "x.h5"), "-o",
                        str(tmp_path / "s.npz")], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and "Traceback" not in r.stderr


def _small_client(path, k, n=16, d=70, domain="a"):
    """A client with n < d/2 rows (its shrunk covariance is c I + rank n − 1)."""
    rng = np.random.default_rng(k)
    X = (rng.normal(size=(n, d)) * rng.uniform(0.3, 2.0, size=d) + k).astype(np.float32)
    write_features(path, X, rng.integers(0, 2, size=n), [f"{k}_{i}" for i in range(n)],
                   class_names=["a", "b"], provenance={"client": f"c{k}", "domain": domain})
    return path


def test_compact_and_float32_stats_files(tmp_path):
    """--compact (format_version 2) holds the same numbers in about half the bytes; --dtype
    float32 a quarter, within float32 rounding; barycenters of the factored (server) storage
    equal the dense ones (≤ 1e-8), and of compact files exactly those of full files."""
    from fedalign.stats import load_stats

    full, comp, f32 = [], [], []
    for k in range(4):
        p = _small_client(tmp_path / f"c{k}.h5", k)
        for opts, out in (((), full), (("--compact",), comp), (("--dtype", "float32"), f32)):
            s = tmp_path / f"c{k}{''.join(o.strip('-')[:3] for o in opts)}.stats.npz"
            r = run("stats", p, "-o", s, *opts)
            assert r.exit_code == 0, r.output
            out.append(s)
    size = lambda ps: sum(p.stat().st_size for p in ps)  # noqa: E731
    assert size(comp) < 0.6 * size(full) and size(f32) < 0.35 * size(full)  # + metadata
    a, b, c = load_stats(full[0]), load_stats(comp[0]), load_stats(f32[0])
    np.testing.assert_array_equal(a.covariance, b.covariance)
    np.testing.assert_array_equal(a.moments.sum_yy, b.moments.sum_yy)
    np.testing.assert_allclose(c.covariance, a.covariance, rtol=1e-6, atol=1e-7 * np.abs(a.covariance).max())
    assert (a.storage, b.storage, c.storage) == ("float64", "float64", "float32")
    refs = {}
    for name, files, storage in (("dense", full, "dense"), ("factored", full, "factored"),
                                 ("compact", comp, "dense"), ("f32", f32, "factored")):
        r = run("barycenter", *files, "-o", tmp_path / f"{name}.ref.npz", "--storage", storage)
        assert r.exit_code == 0, r.output
        refs[name] = read_npz(tmp_path / f"{name}.ref.npz", "reference")[0]["covariance"]
    rel = lambda x: np.linalg.norm(x - refs["dense"]) / np.linalg.norm(refs["dense"])  # noqa: E731
    assert rel(refs["factored"]) <= 1e-8
    np.testing.assert_array_equal(refs["compact"], refs["dense"])
    assert 0 < rel(refs["f32"]) <= 1e-5   # float32 inputs: a bounded, measured difference


def test_float32_stats_refused_by_a_domain_map(tmp_path):
    stats = []
    for k in range(2):
        p = _small_client(tmp_path / f"c{k}.h5", k)
        stats.append(tmp_path / f"c{k}.stats.npz")
        assert run("stats", p, "-o", stats[-1], "--dtype", "float32").exit_code == 0
    assert run("barycenter", *stats, "-o", tmp_path / "ref.npz").exit_code == 0
    out = tmp_path / "al.h5"
    r = run("align", tmp_path / "c0.h5", tmp_path / "ref.npz", "--stats", stats[0],
            "--stats", stats[1], "-o", out)
    _assert_clean_error(r, out, "stored in float32")
    r = run("stats", tmp_path / "c0.h5", "-o", tmp_path / "x.npz", "--dtype", "float16")
    _assert_clean_error(r, tmp_path / "x.npz", "--dtype must be")


def test_many_stats_files_are_checked_by_their_headers_first(tmp_path):
    """Among many files, the first one of another dimension or version is the error, and
    the files after it are not opened (a damaged one there goes unseen); an empty folder or
    an unexpanded glob is one error line; nothing is written."""
    import shutil

    p = _small_client(tmp_path / "c0.h5", 0)
    assert run("stats", p, "-o", tmp_path / "s000.stats.npz").exit_code == 0
    files = [tmp_path / "s000.stats.npz"]
    for i in range(1, 8):
        files.append(tmp_path / f"s{i:03d}.stats.npz")
        shutil.copy(files[0], files[-1])
    q = _small_client(tmp_path / "odd.h5", 1, d=71)
    assert run("stats", q, "-o", files[4]).exit_code == 0          # the offender: d = 71
    files[6].write_bytes(b"PK\x03\x04 damaged")                      # after it: never read
    out = tmp_path / "ref.npz"
    _assert_clean_error(run("barycenter", *files, "-o", out), out, f"{files[4].name}: dimension mismatch")
    np.savez(files[2], __kind__=np.array("stats"), __format_version__=np.array(3))
    _assert_clean_error(run("barycenter", *files, "-o", out), out, "format_version 3 is not supported")
    (tmp_path / "empty").mkdir()
    _assert_clean_error(run("barycenter", tmp_path / "empty", "-o", out), out, "not a file")
    _assert_clean_error(run("barycenter", tmp_path / "empty" / "*.stats.npz", "-o", out), out,
                        "no such file")

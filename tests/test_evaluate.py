"""evaluate: the CLI protocol (clients ↔ test domains, alignment checks), report, extension point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import make_features
from fedalign.cli import app
from fedalign.cli.fl_cmds import expand_greedy
from fedalign.cli.options import parse_params, parse_seeds
from fedalign.errors import FedalignError
from fedalign.evaluate import (MethodResult, check_params, check_seeds, evaluate_external,
                               mean_std)
from fedalign.files import read_report

runner = CliRunner()
DOMS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    """Partitioned clients, plus SLOT-aligned copies made through the CLI (τ = 0.5)."""
    root = tmp_path_factory.mktemp("fed")
    paths = []
    for i, name in enumerate(DOMS):
        p = root / f"{name}.h5"
        make_features(p, n=240, d=5, n_classes=3, seed=0, shift=1.5 * i, scale=1 + 0.5 * i)
        paths.append(str(p))
    cl, al = root / "clients", root / "aligned"
    al.mkdir()
    r = runner.invoke(app, ["partition", *paths, "-o", str(cl), "--alpha", "1.0", "--seed", "0",
                            "--max-redraws", "20"])
    assert r.exit_code == 0, r.output
    for d in DOMS:
        assert runner.invoke(app, ["stats", str(cl / f"{d}.c0.train.h5"), "-o", str(cl / f"{d}.stats.npz")]).exit_code == 0
    assert runner.invoke(app, ["barycenter", *[str(cl / f"{d}.stats.npz") for d in DOMS],
                               "-o", str(root / "ref.npz")]).exit_code == 0
    for d in DOMS:
        r = runner.invoke(app, ["align", "--tau", "0.5", str(cl / f"{d}.c0.train.h5"), str(root / "ref.npz"),
                                "-o", str(al / f"{d}.c0.train.h5"), "--save-map", str(cl / f"{d}.map.npz")])
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["align", "--tau", "0.5", "--map", str(cl / f"{d}.map.npz"),
                                str(cl / f"{d}.test.h5"), "-o", str(al / f"{d}.test.h5")])
        assert r.exit_code == 0, r.output
    return root


def files(folder, kind):
    return sorted(str(p) for p in folder.glob(f"*.{kind}.h5"))


def test_evaluate_report_and_table(fed, tmp_path):
    out = tmp_path / "r.json"
    args = ["evaluate", "--method", "fedcgs", "-m", "fed3r", "-m", "ofedavg", "--param", "ofedavg.epochs=2",
            "--train", *files(fed / "clients", "train"), "--test", *files(fed / "clients", "test"),
            "--seeds", "0", "1", "--json", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "macro" in r.stdout and "fedcgs" in r.stdout and "±" in r.stdout
    rep = read_report(out)
    assert rep["domains"] == list(DOMS) and rep["seeds"] == [0, 1] and rep["alignment"] is None
    assert [c["domain"] for c in rep["clients"]] == list(DOMS)
    for m in ("fedcgs", "fed3r", "ofedavg"):
        res = rep["methods"][m]
        macro = [np.mean(list(a.values())) for a in res["per_seed"]]
        assert res["summary"]["macro"]["mean"] == pytest.approx(np.mean(macro))
        assert res["summary"]["macro"]["std"] == pytest.approx(np.std(macro))
        # 3 classes (chance 1/3): every method, seed and domain well above it
        assert min(a for s in res["per_seed"] for a in s.values()) > 0.6, res["per_seed"]
    assert rep["methods"]["fedcgs"]["summary"]["macro"]["mean"] > 0.9
    # oracle: the report's FedCGS scores are the library head's scores on each test file
    from fedalign.files import read_features
    from fedalign.heads import run_method

    tr = [read_features(p)[:2] for p in files(fed / "clients", "train")]
    head, _ = run_method("fedcgs", tr, 3)
    for d in DOMS:
        X, y, _ = read_features(fed / "clients" / f"{d}.test.h5")
        want = float(np.mean(np.argmax(X.astype(np.float64) @ head.W.T + head.b, 1) == y))
        assert [s[d] for s in rep["methods"]["fedcgs"]["per_seed"]] == pytest.approx([want, want])
    assert rep["methods"]["ofedavg"]["params"]["epochs"] == 2
    # same inputs and seeds → identical report bytes
    out2 = tmp_path / "r2.json"
    assert runner.invoke(app, args[:-1] + [str(out2)]).exit_code == 0
    assert out.read_bytes() == out2.read_bytes()


def test_evaluate_aligned_protocol(fed, tmp_path):
    out = tmp_path / "a.json"
    r = runner.invoke(app, ["evaluate", "-m", "fedcgs", "--train", *files(fed / "aligned", "train"),
                            "--test", *files(fed / "aligned", "test"), "--json", str(out)])
    assert r.exit_code == 0, r.output
    rep = read_report(out)
    assert rep["alignment"]["tau"] == 0.5 and len(rep["alignment"]["reference_sha256"]) == 64


def _clean_failure(args, out, words):
    r = runner.invoke(app, args + ["--json", str(out)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.stderr
    assert not out.exists()


def test_bad_inputs(fed, tmp_path):
    out = tmp_path / "x.json"
    cl, al = fed / "clients", fed / "aligned"
    base = ["evaluate", "-m", "fedcgs"]
    # aligned clients, unaligned test file of one domain
    _clean_failure(base + ["--train", *files(al, "train"), "--test", str(al / "alpha.test.h5"),
                           str(cl / "beta.test.h5")], out, "not mapped like its clients")
    # a test domain without a client (so without a client map)
    _clean_failure(base + ["--train", str(al / "alpha.c0.train.h5"), "--test", str(al / "beta.test.h5")],
                   out, "has no matching client")
    # different dimension / class set
    make_features(tmp_path / "wide.test.h5", n=30, d=6, n_classes=3)
    _clean_failure(base + ["--train", *files(cl, "train"), "--test", str(tmp_path / "wide.test.h5")],
                   out, "dimension mismatch")
    make_features(tmp_path / "more.test.h5", n=30, d=5, n_classes=4)
    _clean_failure(base + ["--train", *files(cl, "train"), "--test", str(tmp_path / "more.test.h5")],
                   out, "class sets differ")
    # an empty client
    from fedalign.files import write_features

    write_features(tmp_path / "empty.train.h5", np.zeros((0, 5)), [], [], [f"c{i}" for i in range(3)],
                   {"domain": "alpha"})
    _clean_failure(base + ["--train", str(tmp_path / "empty.train.h5"), "--test", str(cl / "alpha.test.h5")],
                   out, "empty client")
    _clean_failure(["evaluate", "-m", "nosuch", "--train", *files(cl, "train"), "--test",
                    str(cl / "alpha.test.h5")], out, "unknown method")
    # the library's "params for a method not requested", in the CLI's words
    _clean_failure(base + ["--param", "fedpft.epochs=1", "--train", *files(cl, "train"), "--test",
                           str(cl / "alpha.test.h5")], out, "--param for a method not requested: fedpft")
    _clean_failure(base + ["--seeds", "x", "--train", *files(cl, "train"), "--test",
                           str(cl / "alpha.test.h5")], out, "--seeds: expected integers")


def test_subprocess_run(fed, tmp_path):
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "fedalign", "evaluate", "-m", "fed3r",
                        "--train", *files(fed / "clients", "train"), "--test", *files(fed / "clients", "test"),
                        "--seeds", "0-1", "--json", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "fed3r" in p.stdout and read_report(out)["seeds"] == [0, 1]


def test_external_method_dispatch(monkeypatch, fed):
    """``--method dadil``-style methods are delegated and merged into the same report."""
    calls = {}

    def fake_eval(inputs, tests, class_names, seeds, params):
        calls.update(inputs=inputs, domains=[t.domain for t in tests], seeds=seeds, params=params)
        return MethodResult("fake", seeds, [{t.domain: 0.5 for t in tests} for _ in seeds])

    monkeypatch.setitem(__import__("fedalign.evaluate").evaluate.EXTERNAL_METHODS, "fake", fake_eval)
    r = runner.invoke(app, ["evaluate", "-m", "fake", "--input", "s1.npz", "s2.npz", "--param", "fake.k=3",
                            "--test", str(fed / "clients" / "beta.test.h5"), "--seeds", "0,1"])
    assert r.exit_code == 0, r.output
    assert calls == dict(inputs=[Path("s1.npz"), Path("s2.npz")], domains=["beta"], seeds=[0, 1], params={"k": "3"})
    assert "50.0 ± 0.0" in r.stdout
    with pytest.raises(FedalignError, match="unknown method 'gone'"):
        evaluate_external("gone", [], [], [], [0], {})


def test_option_parsing():
    assert expand_greedy(["--train", "a", "b", "--json", "o", "--seeds", "0", "1", "-m", "x"]) == [
        "--train", "a", "--train", "b", "--json", "o", "--seeds", "0", "--seeds", "1", "-m", "x"]
    assert parse_seeds(["0-2", "5", "1,7"]) == [0, 1, 2, 5, 7]
    assert parse_params(["fedpft.epochs=5", "ofedavg.lr=0.1"]) == {"fedpft": {"epochs": "5"}, "ofedavg": {"lr": "0.1"}}
    with pytest.raises(FedalignError):
        parse_params(["epochs=5"])
    with pytest.raises(FedalignError):
        parse_seeds(["a"])
    assert mean_std([0.5, 0.7]) == pytest.approx({"mean": 0.6, "std": 0.1})


def test_library_takes_typed_seeds_and_params():
    """The library's entry point: seeds are ints, params a dict (the text is the CLI's)."""
    import fedalign.evaluate as ev

    assert not hasattr(ev, "parse_seeds") and not hasattr(ev, "parse_params")
    assert check_seeds([3, 1, 1, np.int64(2)]) == [1, 2, 3] and check_seeds(range(2)) == [0, 1]
    for bad in ([], None, ["0"], [1.5], [True]):
        with pytest.raises(FedalignError, match="seeds"):
            check_seeds(bad)
    for bad in ([-1], [0, 2**32], [np.int64(-5)]):      # the CLI's range: [0, 2**32 − 1]
        with pytest.raises(FedalignError, match=r"^seeds: each seed must be an integer in "
                                                r"\[0, 2\*\*32 − 1 = 4294967295\] \(.*\), got -?\d+$"):
            check_seeds(bad)
    assert check_seeds([2**32 - 1, np.uint32(7)]) == [7, 2**32 - 1]
    params = {"fedpft": {"epochs": "5"}}
    assert check_params(params, ["fedpft", "fedcgs"]) == params and check_params(None, []) == {}
    with pytest.raises(FedalignError, match="params for a method not requested: fedpft"):
        check_params(params, ["fedcgs"])
    with pytest.raises(FedalignError, match="dict of options"):
        check_params({"fedpft": "epochs=5"}, ["fedpft"])
    assert json.loads(json.dumps(mean_std([1.0]))) == {"mean": 1.0, "std": 0.0}
    assert mean_std(np.array([0.5, 0.75, 1.0])) == pytest.approx({"mean": 0.75, "std": np.sqrt(1 / 24)})
    assert all(type(v) is float for v in mean_std(np.float32([0.5, 1.0])).values())  # JSON-safe

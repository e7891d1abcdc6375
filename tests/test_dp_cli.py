"""DP through the CLI: stats --dp-epsilon writes a DP release with its record, barycenter and
align carry it forward, evaluate composes every client's privacy; bad DP input is one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import make_features
from fedalign.cli import app
from fedalign.files import read_features, read_npz, read_report

runner = CliRunner()
DOMS = ("alpha", "beta")
DP = ["--dp-epsilon", "2", "--dp-delta", "1e-5", "--clip", "12", "--seed", "3"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    """Two domains, one client each: DP stats → barycenter → maps from the released stats
    (dp/) and from the exact stats (exact/), test files mapped with the same maps."""
    root = tmp_path_factory.mktemp("dpfed")
    paths = []
    for i, name in enumerate(DOMS):
        p = root / f"{name}.h5"
        make_features(p, n=200, d=4, n_classes=3, seed=i, shift=1.0 * i)
        paths.append(p)
    cl = root / "clients"
    assert run("partition", *paths, "-o", cl, "--alpha", "none", "--seed", "0").exit_code == 0
    for d in DOMS:
        r = run("stats", cl / f"{d}.c0.train.h5", "-o", root / f"{d}.dp.npz", *DP)
        assert r.exit_code == 0, r.output
    r = run("barycenter", *[root / f"{d}.dp.npz" for d in DOMS], "-o", root / "ref.npz")
    assert r.exit_code == 0 and "2 DP inputs" in r.output, r.output
    for sub, extra in (("dp", ["--stats"]), ("exact", [])):
        (root / sub).mkdir()
        for d in DOMS:
            stats = [*extra, root / f"{d}.dp.npz"] if extra else []
            r = run("align", "--tau", "0.5", cl / f"{d}.c0.train.h5", root / "ref.npz", *stats,
                    "-o", root / sub / f"{d}.c0.train.h5", "--save-map", root / sub / f"{d}.map.npz")
            assert r.exit_code == 0, r.output
            r = run("align", "--tau", "0.5", "--map", root / sub / f"{d}.map.npz", cl / f"{d}.test.h5",
                    "-o", root / sub / f"{d}.test.h5")
            assert r.exit_code == 0, r.output
    return root


def test_stats_writes_a_dp_release_with_its_record(fed):
    arrays, meta = read_npz(fed / "alpha.dp.npz", "stats")
    rec = meta["dp"]
    assert rec["release"].startswith("differentially private") and rec["mechanism"] == "analytic"
    assert (rec["epsilon"], rec["delta"], rec["clip"]) == (2.0, 1e-5, 12.0)
    assert set(rec["parts"]) == {"count", "sum", "second_moment"}
    assert rec["parts"]["second_moment"]["sensitivity"] == 144.0
    assert all(p["sigma"] > 0 for p in rec["parts"].values())
    assert rec["guarantee"]["epsilon"] == pytest.approx(2.0, rel=1e-9)
    assert 0 <= rec["clipped_fraction"] <= 1 and "add/remove one row" in rec["neighbouring"]
    assert "not secret" in rec["noise_seed"]
    assert "source_sha256" not in meta  # a digest of the private rows is not a DP release
    assert "sum_sqnorm_y" not in arrays and not np.any(arrays["shift"])
    # the same seed gives the same release, another seed another one
    again = fed / "again.npz"
    assert run("stats", fed / "clients" / "alpha.c0.train.h5", "-o", again, *DP).exit_code == 0
    assert np.array_equal(read_npz(again, "stats")[0]["sum_yy"], arrays["sum_yy"])


def test_barycenter_and_align_carry_the_records(fed):
    _, ref = read_npz(fed / "ref.npz", "reference")
    assert [e["client"] for e in ref["dp_inputs"]] == ["alpha.c0", "beta.c0"]
    assert all(e["dp"]["epsilon"] == 2.0 for e in ref["dp_inputs"])
    _, m = read_npz(fed / "dp" / "alpha.map.npz", "map")
    assert m["dp"]["map_stats"]["epsilon"] == 2.0 and len(m["dp"]["reference_inputs"]) == 2
    _, m = read_npz(fed / "exact" / "alpha.map.npz", "map")
    assert m["dp"]["map_stats"] is None  # the client's own exact statistics
    step = read_features(fed / "dp" / "alpha.c0.train.h5")[2]["provenance"]["history"][-1]
    assert step["step"] == "align" and step["dp"]["map_stats"]["clip"] == 12.0


def _evaluate(fed, sub, tmp_path, *params):
    out = tmp_path / f"{sub}.json"
    args = ["evaluate", "-m", "fedcgs", "-m", "fed3r", "--seeds", "0",
            "--train", *sorted((fed / sub).glob("*.train.h5")), "--test", *sorted((fed / sub).glob("*.test.h5")),
            *[a for p in params for a in ("--param", p)], "--json", out]
    r = run(*args)
    assert r.exit_code == 0, r.output
    return read_report(out), r.output


def test_evaluate_composes_each_clients_privacy(fed, tmp_path):
    heads = [f"{h}.{k}={v}" for h in ("fedcgs", "fed3r")
             for k, v in (("dp_epsilon", "1"), ("dp_delta", "1e-5"), ("clip", "12"))]
    rep, output = _evaluate(fed, "dp", tmp_path, *heads)
    for h in ("fedcgs", "fed3r"):
        priv = rep["methods"][h]["privacy"]
        assert [e["client"] for e in priv] == ["alpha.c0", "beta.c0"]
        for e in priv:
            assert e["head_message_covered"] and e["total"]["private"]
            mu = math.sqrt(e["stats"]["mu"] ** 2 + e["head"]["mu"] ** 2)
            assert e["total"]["mu"] == pytest.approx(mu, rel=1e-12)
            assert 2.0 < e["total"]["epsilon"] < 3.0  # ε = 2 and ε = 1 composed, below 2 + 1
        assert rep["methods"][h]["params"]["dp_epsilon"] == 1.0
        assert f"{h}: privacy per client and run: ε ≤" in output
    # maps from the exact statistics: the head message is not covered, no total is claimed
    rep, output = _evaluate(fed, "exact", tmp_path, *heads)
    e = rep["methods"]["fedcgs"]["privacy"][0]
    assert not e["head_message_covered"] and "exact statistics" in e["reason"]
    assert e["total"] == {"private": False, "reason": "no composed guarantee: " + e["reason"]}
    assert "no composed guarantee" in output
    # an exact head message after DP statistics: nothing private in all
    rep, _ = _evaluate(fed, "dp", tmp_path)
    e = rep["methods"]["fed3r"]["privacy"][0]
    assert e["head"] == "exact" and not e["total"]["private"]
    assert "dp_epsilon" not in rep["methods"]["fed3r"]["params"]


def _clean_error(r, out, word):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert word.lower() in lines[0].lower(), lines[0]
    assert not out.exists()


@pytest.mark.parametrize("args, word", [
    (["--dp-epsilon", "0", "--dp-delta", "1e-5", "--clip", "1"], "--dp-epsilon"),
    (["--dp-epsilon", "-2", "--dp-delta", "1e-5", "--clip", "1"], "--dp-epsilon"),
    (["--dp-epsilon", "1", "--dp-delta", "0", "--clip", "1"], "--dp-delta"),
    (["--dp-epsilon", "1", "--dp-delta", "1", "--clip", "1"], "--dp-delta"),
    (["--dp-epsilon", "1", "--dp-delta", "1e-5", "--clip", "0"], "--clip"),
    (["--dp-epsilon", "1", "--dp-delta", "1e-5", "--clip", "-1"], "--clip"),
    (["--dp-epsilon", "1", "--dp-delta", "1e-5"], "--clip"),
    (["--dp-epsilon", "1", "--dp-delta", "1e-5", "--clip", "1", "--per-class"], "--per-class"),
    (["--dp-epsilon", "1", "--dp-delta", "1e-5", "--clip", "1", "--shrinkage", "none"], "cannot be honoured"),
    (["--dp-epsilon", "1", "--dp-delta", "1e-5", "--clip", "1", "--dp-mechanism", "laplace"], "--dp-mechanism"),
    (["--dp-delta", "1e-5"], "also give --dp-epsilon"),
    (["--clip", "2"], "also give --dp-epsilon"),
])
def test_stats_bad_dp_input_is_one_line(fed, tmp_path, args, word):
    out = tmp_path / "s.npz"
    _clean_error(run("stats", fed / "clients" / "alpha.c0.train.h5", "-o", out, *args), out, word)


@pytest.mark.parametrize("param, word", [
    ("fedcgs.dp_epsilon=0", "fedcgs.dp_epsilon"),
    ("fedcgs.dp_epsilon=abc", "fedcgs.dp_epsilon"),
    ("fed3r.clip=3", "also give fed3r.dp_epsilon"),
    ("ofedavg.dp_epsilon=1", "unknown option"),
])
def test_evaluate_bad_dp_input_is_one_line(fed, tmp_path, param, word):
    out = tmp_path / "r.json"
    m = param.split(".")[0]
    r = run("evaluate", "-m", m, "--train", *sorted((fed / "dp").glob("*.train.h5")),
            "--test", *sorted((fed / "dp").glob("*.test.h5")), "--param", param, "--json", out)
    _clean_error(r, out, word)


def test_evaluate_bad_head_delta_and_clip(fed, tmp_path):
    out = tmp_path / "r.json"
    base = ["evaluate", "-m", "fed3r", "--train", *sorted((fed / "dp").glob("*.train.h5")),
            "--test", *sorted((fed / "dp").glob("*.test.h5")), "--json", out]
    for extra, word in ((["fed3r.dp_epsilon=1", "fed3r.dp_delta=2", "fed3r.clip=1"], "fed3r.dp_delta"),
                        (["fed3r.dp_epsilon=1", "fed3r.dp_delta=1e-5", "fed3r.clip=-4"], "fed3r.clip")):
        _clean_error(run(*base, *[a for p in extra for a in ("--param", p)]), out, word)


def test_dp_grid_runner_and_results_generator(tmp_path):
    """examples/dp end to end on a tiny generated dataset: C from 'public' features, reports,
    resume, RESULTS.md and the plot."""
    import subprocess
    import sys
    from pathlib import Path

    ex = Path(__file__).resolve().parents[1] / "examples" / "dp"
    for i, name in enumerate("ab"):
        (tmp_path / "feat" / "toy").mkdir(parents=True, exist_ok=True)
        make_features(tmp_path / "feat" / "toy" / f"{name}.h5", n=90, d=4, n_classes=3, seed=i, shift=i)
    (tmp_path / "public").mkdir()
    make_features(tmp_path / "public" / "demo.h5", n=40, d=4, n_classes=3, seed=7)
    out = tmp_path / "grid"
    cmd = [sys.executable, str(ex / "run_dp.py"), "--features", str(tmp_path / "feat"), "-o", str(out),
           "--datasets", "toy", "--epsilons", "2", "inf", "--seeds", "0", "--clip-from",
           str(tmp_path / "public"), "--map-stats", "released", "--jobs", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (out / "toy").glob("*.json")) == ["eps2_released_s0.json", "epsinf_s0.json"]
    rep = read_report(out / "toy" / "eps2_released_s0.json")
    assert rep["clip_rule"]["rule"].startswith("50th percentile") and rep["dp"]["clip"] == rep["clip_rule"]["clip"]
    assert all(e["total"]["epsilon"] == pytest.approx(2.0, rel=1e-9)
               for h in rep["heads"].values() for v in h["privacy"].values() for e in v)
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert "0 to run" in r.stdout
    md, png = tmp_path / "RESULTS.md", tmp_path / "p.png"
    r = subprocess.run([sys.executable, str(ex / "make_results.py"), str(out), "-o", str(md),
                        "--plot", str(png)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert "| FedCGS (fedalign) | SLOT τ=0.4, maps from released stats |" in text
    assert "secure aggregation" in text and "largest |total ε − ε|" in text
    assert png.stat().st_size > 1000

"""CLI: dadil-round (--init, strategies), consensus, evaluate --method dadil, dadil-evaluate."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.files import write_features
from fedalign.gmm import GMM, save_gmm
from fedalign.dadil import PublishedAtoms, federation_paths, save_atoms, simulate

from test_dadil_gossip import blobs, make_gmms

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def cli_federation(gp, fed, rounds, strategy="aggregation", steps=2):
    for c, g in gp.items():
        sp, ap = federation_paths(fed, c, 0)
        sp.parent.mkdir(parents=True, exist_ok=True)
        ap.parent.mkdir(parents=True, exist_ok=True)
        r = run("dadil-round", "--init", "--client", c, "--gmm", g, "--state", sp, "-o", ap,
                "--n-atoms", 2, "--seed", 5)
        assert r.exit_code == 0, r.output
    for t in range(1, rounds + 1):
        (fed / f"round_{t:03d}").mkdir()
        prev = sorted((fed / f"round_{t - 1:03d}").glob("*.atoms.npz"))
        for c in gp:
            sp, ap = federation_paths(fed, c, t)
            r = run("dadil-round", "--state", sp, "--strategy", strategy, "--local-steps", steps,
                    "--client", c, "-o", ap, *prev)
            assert r.exit_code == 0, r.output
            assert f"{c} round {t} {strategy}" in r.output


@pytest.mark.parametrize("strategy, in_memory", [("aggregation", False), ("aggregation", True),
                                                  ("replacement", True)])
def test_cli_rounds_are_byte_identical_to_simulation(tmp_path, strategy, in_memory):
    """The file path (round_files) and the in-memory path (gossip_round, files written at the
    end) both give the CLI's bytes, every round's atoms and the final states."""
    gp = make_gmms(tmp_path, 3)
    cli_federation(gp, tmp_path / "cli", 2, strategy)
    simulate(gp, tmp_path / "sim", rounds=2, strategy=strategy, local_steps=2, n_atoms=2,
             seed=5, in_memory=in_memory)
    n = 0
    for f in sorted((tmp_path / "cli").rglob("*.npz")):
        twin = tmp_path / "sim" / f.relative_to(tmp_path / "cli")
        assert f.read_bytes() == twin.read_bytes(), f
        n += 1
    assert n == 3 * 3 + 3  # atoms of rounds 0..2 and the states


@pytest.fixture
def client0(tmp_path):
    gp = make_gmms(tmp_path, 2)
    sp, ap = tmp_path / "c0.state.npz", tmp_path / "c0.r0.atoms.npz"
    assert run("dadil-round", "--init", "--client", "c0", "--gmm", gp["c0"], "--state", sp,
               "-o", ap, "--n-atoms", 2).exit_code == 0
    other = tmp_path / "tgt.r0.atoms.npz"
    assert run("dadil-round", "--init", "--client", "tgt", "--gmm", gp["tgt"], "--state",
               tmp_path / "tgt.state.npz", "-o", other, "--n-atoms", 2).exit_code == 0
    return gp, sp, other


def write_bad_atoms(path, A=2, K=4, d=4, C=2):
    save_atoms(path, PublishedAtoms(np.zeros((A, K, d)), np.ones((A, K, d)), np.zeros((A, K, C)),
                                    0, "bad"))


@pytest.mark.parametrize("case, message", [
    ("classes", "classes C=3"), ("shape", "components K=6"), ("missing", "no such file"),
    ("client", "state of client c0, not c1"), ("gmm_dim", "dimension d=7"),
    ("kind", "expected an atoms file"),
])
def test_bad_input_exit_2_state_untouched(client0, tmp_path, case, message):
    gp, sp, other = client0
    before = sp.read_bytes()
    args = ["dadil-round", "--state", sp, "-o", tmp_path / "out.npz", other]
    if case == "classes":
        write_bad_atoms(tmp_path / "bad.npz", C=3)
        args.append(tmp_path / "bad.npz")
    elif case == "shape":
        write_bad_atoms(tmp_path / "bad.npz", K=6)
        args.append(tmp_path / "bad.npz")
    elif case == "missing":
        args.append(tmp_path / "missing.atoms.npz")
    elif case == "client":
        args += ["--client", "c1"]
    elif case == "gmm_dim":
        save_gmm(tmp_path / "g7.npz", GMM(np.full(4, 0.25), np.zeros((4, 7)), np.ones((4, 7)),
                                          np.eye(2)[[0, 1, 0, 1]]))
        args += ["--gmm", tmp_path / "g7.npz"]
    elif case == "kind":
        args.append(gp["c0"])
    r = run(*args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.output
    assert sp.read_bytes() == before
    assert not (tmp_path / "out.npz").exists()


def test_other_gmm_and_init_errors(client0, tmp_path):
    gp, sp, other = client0
    r = run("dadil-round", "--state", sp, "-o", tmp_path / "o.npz", "--gmm", gp["tgt"], other)
    assert r.exit_code == 2 and "not the GMM client c0 was initialised with" in r.output
    r = run("dadil-round", "--init", "--state", tmp_path / "n.npz", "-o", tmp_path / "o.npz")
    assert r.exit_code == 2 and "--init needs --client and --gmm" in r.output
    r = run("dadil-round", "--init", "--client", "c0", "--gmm", gp["c0"], "--state", sp, "-o",
            tmp_path / "o.npz")
    assert r.exit_code == 2 and "exists" in r.output
    r = run("dadil-round", "--state", sp, "-o", tmp_path / "o.npz", "--strategy", "mean", other)
    assert r.exit_code == 2 and "--strategy" in r.output
    r = run("dadil-round", "--state", sp, "-o", tmp_path / "o.npz", "--strategy", "replacement")
    assert r.exit_code == 2 and "at least one peer" in r.output
    assert not (tmp_path / "o.npz").exists()


def test_replacement_round_and_consensus_and_evaluate(tmp_path):
    gp = make_gmms(tmp_path, 3)
    cli_federation(gp, tmp_path / "rep", 2, "replacement", 1)
    simulate(gp, tmp_path / "agg", 2, "aggregation", 1, n_atoms=2, seed=5)
    r = run("consensus", f"replacement={tmp_path / 'rep'}", f"aggregation={tmp_path / 'agg'}",
            "-o", tmp_path / "cons.json", "--plot", tmp_path / "cons.png", "-L", 3)
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "cons.json").read_text())
    assert rep["runs"]["replacement"]["rounds"] == [0, 1, 2]
    assert len(rep["runs"]["aggregation"]["M"][0]) == 3
    import matplotlib.image as mpimg

    img = mpimg.imread(tmp_path / "cons.png")[..., :3]   # both runs drawn: C0 and C1 curves
    for rgb in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        assert (np.abs(img - np.array(rgb) / 255).max(-1) < 0.03).sum() > 200, rgb
    M = np.array(rep["runs"]["replacement"]["M"])
    assert M.shape == (3, 3, 3) and np.allclose(M, M.transpose(0, 2, 1)) and np.all(M[:, [0, 1, 2], [0, 1, 2]] == 0)
    # the target's held-out test split and evaluate --method dadil
    X, y = blobs(2, n=100, seed=102)   # the target's domain, rows it never saw
    write_features(tmp_path / "tgt.test.h5", X, y, [str(i) for i in range(100)], ["a", "b"],
                   {"domain": "tgt"})
    state = tmp_path / "agg" / "state" / "tgt.state.npz"
    r = run("evaluate", "--method", "dadil", "--input", state, "--test", tmp_path / "tgt.test.h5",
            "--param", "dadil.classifier=map", "--seeds", "0-1", "--json", tmp_path / "ev.json")
    assert r.exit_code == 0, r.output
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["methods"]["dadil"]["params"]["classifier"] == "map"
    # oracle: the MAP rule on the target's barycenter, from the library (2 classes: chance 0.5)
    from fedalign.dadil import load_state
    from fedalign.dadil.classifiers import accuracy, target_classifier

    from fedalign.files import read_features

    Xf, yf, _ = read_features(tmp_path / "tgt.test.h5")   # the rows as evaluate reads them
    want = accuracy(target_classifier(load_state(state), "map"), Xf, yf)
    assert ev["methods"]["dadil"]["summary"]["tgt"]["mean"] == pytest.approx(want)
    # the MAP rule has no sampling: every seed scores the same
    assert ev["methods"]["dadil"]["per_seed"][0] == ev["methods"]["dadil"]["per_seed"][1]
    r = run("evaluate", "--method", "dadil", "--input", tmp_path / "rep" / "state" / "c0.state.npz",
            "--input", state, "--test", tmp_path / "tgt.test.h5", "--param", "dadil.foo=1")
    assert r.exit_code == 2 and "unknown dadil option" in r.output
    # sources for the source-only baseline
    srcs = []
    for i in range(2):
        Xs, ys = blobs(i)
        srcs += ["--source", tmp_path / f"c{i}.h5"]
        write_features(tmp_path / f"c{i}.h5", Xs, ys, [str(j) for j in range(len(ys))], ["a", "b"])
    r = run("dadil-evaluate", "--test", tmp_path / "tgt.test.h5", *srcs,
            "--gmm", gp["c0"], "--gmm", gp["c1"], "--target-gmm", gp["tgt"], "--central-iters", 5,
            "--n-atoms", 2, "--state", f"aggregation={state}", "--json", tmp_path / "de.json")
    assert r.exit_code == 0, r.output
    de = json.loads((tmp_path / "de.json").read_text())
    assert set(de["accuracy"]) == {"source-only", "centralized", "aggregation"}
    assert set(de["accuracy"]["aggregation"]) == {"linear", "map"}
    # the sources' classes point opposite ways (pooled, an XOR): no linear source rule fits
    assert de["summary"]["source-only (logreg)"]["mean"] < 0.8


def test_subprocess_bad_peer_and_help(tmp_path):
    gp = make_gmms(tmp_path, 2)
    sp = tmp_path / "c0.state.npz"
    assert run("dadil-round", "--init", "--client", "c0", "--gmm", gp["c0"], "--state", sp,
               "-o", tmp_path / "a.npz").exit_code == 0
    before = sp.read_bytes()
    r = subprocess.run([sys.executable, "-m", "fedalign", "dadil-round", "--state", str(sp),
                        "-o", str(tmp_path / "b.npz"), str(tmp_path / "gone.atoms.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: no such file")
    assert sp.read_bytes() == before
    for cmd in ("dadil-round", "consensus", "dadil-evaluate"):
        h = run(cmd, "--help")
        assert h.exit_code == 0 and "Example: fedalign " + cmd in " ".join(h.output.split())


def _files(folder) -> dict:
    """{path: bytes} of every file under ``folder``, hidden ones (temporaries) included."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_subprocess_failed_round_writes_nothing_not_even_the_repair(tmp_path):
    """A client's round-1 atoms were lost (a kill between the state's rename and the atoms'):
    the next dadil-round republishes them, but only as part of a successful round. With a bad
    peer (truncated, or a GMM file instead of atoms) it exits 2 with one error line and every
    file of the federation keeps its bytes; no file appears."""
    gp = make_gmms(tmp_path, 2)
    fed = tmp_path / "fed"
    cli_federation({"c0": gp["c0"]}, fed, 1, "none", 1)
    sp, ap1 = federation_paths(fed, "c0", 1)
    ap2 = federation_paths(fed, "c0", 2)[1]
    (fed / "round_002").mkdir()
    published = ap1.read_bytes()
    ap1.unlink()                                    # the killed run's lost atoms
    truncated = fed / "round_001" / "p.atoms.npz"
    truncated.write_bytes(published[: len(published) // 2])
    for bad in (truncated, gp["c0"]):
        before = _files(tmp_path)
        r = subprocess.run([sys.executable, "-m", "fedalign", "dadil-round", "--state", str(sp),
                            "--strategy", "none", "--local-steps", "1", "-o", str(ap2),
                            str(bad)], capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
        assert _files(tmp_path) == before, bad
        assert not ap1.exists() and not ap2.exists()
    truncated.unlink()
    r = run("dadil-round", "--state", sp, "--strategy", "none", "--local-steps", 1, "-o", ap2,
            fed / "round_000" / "c0.atoms.npz")
    assert r.exit_code == 0, r.output
    assert "republished" in r.output and ap1.read_bytes() == published and ap2.is_file()

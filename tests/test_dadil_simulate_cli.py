"""CLI: dadil-simulate (a whole gossip federation in one process) against the dadil-round loop."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.gmm import GMM, save_gmm

from test_dadil_cli import cli_federation
from test_dadil_gossip import make_gmms

runner = CliRunner()

pytestmark = pytest.mark.usefixtures("one_thread")

#: cli_federation's options (n_atoms 2, seed 5, 2 local steps), spelled for dadil-simulate.
OPTS = ["--n-atoms", 2, "--seed", 5, "--local-steps", 2]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def files_of(folder):
    """{relative path: bytes} of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def simulate_cli(gp, fed, rounds=2, strategy="aggregation", *extra):
    return run("dadil-simulate", *[f"{c}={g}" for c, g in gp.items()], "-o", fed,
               "--rounds", rounds, "--strategy", strategy, *OPTS, *extra)


@pytest.mark.parametrize("strategy", ["aggregation", "replacement"])
def test_folder_is_byte_identical_to_the_dadil_round_loop(tmp_path, strategy):
    gp = make_gmms(tmp_path, 3)
    cli_federation(gp, tmp_path / "loop", 2, strategy)
    r = simulate_cli(gp, tmp_path / "a" / "sim", 2, strategy)   # parents created
    assert r.exit_code == 0, r.output
    loop, sim = files_of(tmp_path / "loop"), files_of(tmp_path / "a" / "sim")
    assert len(loop) == 3 * 3 + 3 and sorted(sim) == sorted(loop)   # atoms of rounds 0..2, states
    assert [k for k in loop if loop[k] != sim[k]] == []
    for c in gp:   # one summary line per client, as dadil-round prints it, and the folder
        assert f"dadil-simulate: {c} round 2 {strategy} (peers: " in r.output
    assert f"× 2 rounds of {strategy}" in r.output and str(tmp_path / "a" / "sim") in r.output
    # no staging folder or temporary left next to the output or inside it
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["sim"]
    assert not [p for p in (tmp_path / "a" / "sim").rglob(".*")]


def test_bare_paths_name_clients_and_consensus_reads_the_folder(tmp_path):
    gp = make_gmms(tmp_path, 3)
    fed = tmp_path / "fed"
    r = run("dadil-simulate", *gp.values(), "-o", fed, "--rounds", 2, *OPTS)   # c0.gmm.npz → c0
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (fed / "state").iterdir()) == [
        "c0.state.npz", "c1.state.npz", "tgt.state.npz"]
    r = run("consensus", f"agg={fed}", "-o", tmp_path / "cons.json", "-L", 2)
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "cons.json").read_text())["runs"]["agg"]
    assert rep["rounds"] == [0, 1, 2] and sorted(rep["clients"]) == ["c0", "c1", "tgt"]
    M = np.array(rep["M"])
    assert M.shape == (3, 3, 3) and np.all(M[:, [0, 1, 2], [0, 1, 2]] == 0) and np.all(M[0] >= 0)


@pytest.mark.parametrize("case, message", [
    ("duplicate", "client c0 given twice"), ("one", "at least 2 clients, got 1"),
    ("missing", "no such file"), ("rounds0", "--rounds"), ("existing", "already holds a federation"),
    ("strategy", "--strategy must be one of"), ("lr", "--lr must be > 0"),
    ("optimizer", "--optimizer must be one of gd, adam"), ("client_id", "invalid client id"),
])
def test_bad_input_one_error_line_exit_2_nothing_written(tmp_path, case, message):
    gp = make_gmms(tmp_path, 3)
    specs, extra = [f"{c}={g}" for c, g in gp.items()], []
    fed = tmp_path / "out" / "fed"
    if case == "duplicate":
        specs.append(str(gp["c0"]))     # bare path: its id is c0 too
    elif case == "one":
        specs = specs[:1]
    elif case == "missing":
        specs.append(f"c9={tmp_path / 'c9.gmm.npz'}")
    elif case == "rounds0":
        extra = ["--rounds", 0]
    elif case == "existing":
        (fed / "round_000").mkdir(parents=True)
        (fed / "round_000" / "x.atoms.npz").write_bytes(b"old")
    elif case == "strategy":
        extra = ["--strategy", "mean"]
    elif case == "lr":
        extra = ["--lr", 0]
    elif case == "optimizer":
        extra = ["--optimizer", "sgd"]
    elif case == "client_id":
        specs.append(f"bad/id={gp['c0']}")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = run("dadil-simulate", *specs, "-o", fed, "--rounds", 2, *extra)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.output
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    if case == "existing":
        assert (fed / "round_000" / "x.atoms.npz").read_bytes() == b"old"


def test_failure_mid_run_and_interrupt_at_commit_leave_nothing(tmp_path, monkeypatch):
    """A client whose GMM has another dimension fails in round 1, after the round-0 files were
    written (to the staging folder): nothing appears, the created folders are gone. An
    interrupt just before the commit leaves an existing federation as it was."""
    gp = make_gmms(tmp_path, 3)
    save_gmm(tmp_path / "g7.gmm.npz", GMM(np.full(4, 0.25), np.zeros((4, 7)), np.ones((4, 7)),
                                          np.eye(2)[[0, 1, 0, 1]]))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = run("dadil-simulate", gp["c0"], tmp_path / "g7.gmm.npz", "-o", tmp_path / "new" / "fed",
            "--rounds", 2, *OPTS)
    assert r.exit_code == 2 and r.output.startswith("error:") and "g7" in r.output, r.output
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before

    fed = tmp_path / "fed"
    assert simulate_cli(gp, fed).exit_code == 0
    old = files_of(fed)

    import fedalign.files.transactions

    seen = []

    def stop(paths):   # the command's commit (the staging folder's own commits pass)
        seen.append(len(paths))
        if len(paths) == 3 * 4 + 3:     # atoms of rounds 0..3 and the states
            raise KeyboardInterrupt

    monkeypatch.setattr(fedalign.files.transactions, "_before_commit", stop)
    r = simulate_cli(gp, fed, 3, "replacement", "--force")
    assert r.exit_code == 130 and "interrupted" in r.output and seen[-1] == 15, r.output
    assert files_of(fed) == old
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_force_replaces_the_earlier_federation(tmp_path):
    """--force over a longer federation with a client more: the result is the fresh run's
    folder (the earlier round_003 and the third client's files are removed)."""
    gp = make_gmms(tmp_path, 3)
    fed = tmp_path / "fed"
    assert simulate_cli(gp, fed, 3, "replacement").exit_code == 0
    (fed / ".done").write_text("")          # not a federation file: kept
    two = {c: gp[c] for c in ("c0", "tgt")}
    r = simulate_cli(two, fed, 2, "aggregation", "--force")
    assert r.exit_code == 0, r.output
    assert "removed 7 files of the earlier federation" in r.output
    assert simulate_cli(two, tmp_path / "fresh", 2).exit_code == 0
    assert files_of(fed) == dict(files_of(tmp_path / "fresh"), **{".done": b""})
    assert not (fed / "round_003").exists()


def test_subprocess_error_and_help(tmp_path):
    gp = make_gmms(tmp_path, 2)
    r = subprocess.run([sys.executable, "-m", "fedalign", "dadil-simulate", str(gp["c0"]),
                        f"c0={gp['tgt']}", "-o", str(tmp_path / "fed"), "--rounds", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: client c0 given twice")
    assert not (tmp_path / "fed").exists()
    h = run("dadil-simulate", "--help")
    assert h.exit_code == 0 and "Example: fedalign dadil-simulate " in " ".join(h.output.split())

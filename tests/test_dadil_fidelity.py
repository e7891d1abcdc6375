"""DeFed-GMM-DaDiL behaves like the paper: distinct starts, falling consensus, α that moves,
scale-free defaults, and the rotated-blobs federation through the CLI at its defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.files import write_features
from fedalign.gmm import fit_gmm, save_gmm

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
ANGLES = {"s1": -20, "s2": 20, "s3": 40, "t": 0}


def blobs(angle, n, seed, scale=1.0, shift=0.0, d=8, sd=0.5):
    """3 classes on a line (means −3, 0, 3 on axis 0) + N(0, σ²) noise in d dimensions, rotated
    by ``angle`` degrees in the first two axes about the pivot (0, −20); then × scale + shift."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    X = np.zeros((n, d))
    X[:, 0] = 3.0 * y - 3.0
    X += sd * rng.standard_normal((n, d))
    a = np.deg2rad(angle)
    R = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    p = np.array([0.0, -20.0])
    X[:, :2] = (X[:, :2] - p) @ R.T + p
    return X * scale + shift, y


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def cli_blobs_federation(tmp_path, scale, shift, rounds=20):
    """The federation of the issue, every step a fedalign subcommand, everything else default."""
    names = ["a", "b", "c"]
    for i, (c, ang) in enumerate(ANGLES.items()):
        X, y = blobs(ang, 240, i, scale, shift)
        write_features(tmp_path / f"{c}.h5", X.astype(np.float32),
                       y if c != "t" else np.full(240, -1), [f"{c}{k}" for k in range(240)],
                       class_names=names, provenance=dict(domain=c))
        extra = ["--unlabeled", "--n-classes", 3] if c == "t" else []
        run("fit-gmm", tmp_path / f"{c}.h5", "-o", tmp_path / f"{c}.gmm.npz", "-k", 2, *extra)
    Xt, yt = blobs(0, 150, 99, scale, shift)
    write_features(tmp_path / "t.test.h5", Xt.astype(np.float32), yt,
                   [f"t{k}" for k in range(150)], class_names=names, provenance=dict(domain="t"))
    fed = tmp_path / "fed"  # the whole gossip in one process: the dadil-round loop's files
    run("dadil-simulate", *(f"{c}={tmp_path / c}.gmm.npz" for c in ANGLES), "-o", fed,
        "--rounds", rounds, "--strategy", "aggregation", "--n-components", 6)
    run("evaluate", "-m", "dadil", "--input", fed / "state" / "t.state.npz", "--test",
        tmp_path / "t.test.h5", "--json", tmp_path / "dadil.json")
    rep = json.loads((tmp_path / "dadil.json").read_text())
    return rep["methods"]["dadil"]["per_seed"][0]["t"], fed


def test_pooled_source_only_fails_on_rotated_blobs():
    from sklearn.linear_model import LogisticRegression

    Xs = np.concatenate([blobs(a, 240, i)[0] for i, a in enumerate([-20, 20, 40])])
    ys = np.concatenate([blobs(a, 240, i)[1] for i, a in enumerate([-20, 20, 40])])
    Xt, yt = blobs(0, 150, 99)
    assert LogisticRegression(max_iter=1000).fit(Xs, ys).score(Xt, yt) < 0.5   # ≈ 33 %


@pytest.mark.parametrize("scale, shift", [(1.0, 0.0), (0.02, 0.1)])
def test_rotated_blobs_federation_through_the_cli_at_defaults(tmp_path, scale, shift):
    acc, fed = cli_blobs_federation(tmp_path, scale, shift)
    assert acc >= 0.85
    from fedalign.dadil.state import load_state

    st = load_state(fed / "state" / "t.state.npz")
    assert st.round == 20 and len(st.history) == 20                   # trajectory in the state
    assert all(len(h["alpha"]) == 6 for h in st.history)              # E = 5 steps: 6 α each
    assert st.settings["preset"] == "fedalign" and st.settings["role"] == "target"


@pytest.fixture(scope="module")
def blob_gmms(tmp_path_factory):
    """The four clients' GMMs (k = 2 per class; the target's unlabeled), fitted once."""
    tmp = tmp_path_factory.mktemp("blob_gmms")
    gp = {}
    for i, (c, ang) in enumerate(ANGLES.items()):
        X, y = blobs(ang, 240, i)
        save_gmm(tmp / f"{c}.gmm.npz", fit_gmm(X, y if c != "t" else None, 2, n_classes=3))
        gp[c] = tmp / f"{c}.gmm.npz"
    return gp


@pytest.fixture(scope="module")
def aggregation_run(blob_gmms, tmp_path_factory):
    """15 rounds of Wasserstein aggregation from per-client starts: (folder, final states).
    (One BLAS thread: conftest sets OPENBLAS_NUM_THREADS; the simulation uses no torch.)"""
    from fedalign.dadil.simulation import simulate

    out = tmp_path_factory.mktemp("aggregation") / "fed"
    return out, simulate(blob_gmms, out, 15, "aggregation", 5, n_atoms=3, n_components=6, seed=0)


def test_distinct_starts_and_consensus_falls(tmp_path, blob_gmms, aggregation_run):
    """From per-client starts M(0) > 0, and gossip brings the dictionaries together."""
    from fedalign.dadil.consensus import consensus_history
    from fedalign.dadil.simulation import simulate

    runs = {"aggregation": aggregation_run[0], "replacement": tmp_path / "replacement"}
    simulate(blob_gmms, runs["replacement"], 15, "replacement", 5, n_atoms=3, n_components=6,
             seed=0)
    ratios = {}
    for strat, folder in runs.items():
        h = consensus_history([folder], 6, 0, 5)
        assert h["rounds"][0] == 0 and h["max"][0] > 0                # distinct starts
        assert h["rounds"][-1] == 15
        ratios[strat] = h["max"][-1] / h["max"][0]
    assert ratios["aggregation"] <= 0.3 and ratios["replacement"] <= 0.6, ratios
    shared = simulate(blob_gmms, tmp_path / "shared", 0, "aggregation", 5, n_atoms=3,
                      n_components=6, shared_init=True)
    assert consensus_history([tmp_path / "shared"], 6, 0, 1)["max"][0] < 1e-6   # √ of round-off
    assert all(st.settings["shared_init"] for st in shared.values())


def test_alpha_moves_and_differs_between_domains(aggregation_run):
    """Sources rotated differently end with different α (not stuck at uniform)."""
    st = aggregation_run[1]
    alphas = [st[c].alpha for c in ("s1", "s2", "s3")]
    assert max(np.abs(a - 1 / 3).sum() for a in alphas) > 0.2
    assert max(np.abs(a - b).sum() for a in alphas for b in alphas) >= 0.1
    assert st["t"].alpha_received is not None and st["t"].received is not None


def test_unlabeled_target_keeps_its_atoms_in_the_fedalign_preset(tmp_path):
    """Its label-free loss moves α only; the reference preset moves the atoms too."""
    from fedalign.gmm import load_gmm
    from fedalign.dadil.gossip import gossip_round, init_client

    X, _ = blobs(0, 240, 3)
    save_gmm(tmp_path / "t.gmm.npz", fit_gmm(X, None, 2, n_classes=3))
    g = load_gmm(tmp_path / "t.gmm.npz")
    for preset, moves in (("fedalign", False), ("reference", True)):
        st = init_client("t", g, n_atoms=3, seed=0, n_components=6, preset=preset)
        m0 = st.means.copy()
        gossip_round(st, g, [], "none", 3)
        assert np.allclose(st.means, m0) != moves
        assert st.history[-1]["alpha"][0] != st.history[-1]["alpha"][-1] or preset == "reference"

"""DeFed-GMM-DaDiL gossip rounds: files, seeds, peer choice, strategies, simulation."""

from __future__ import annotations

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.gmm import GMM, fit_gmm, save_gmm
from fedalign.dadil.gossip import (aggregate_atoms, choose_peers, communicate, gossip_round,
                                   init_files, round_files)
from fedalign.dadil.simulation import federation_paths, simulate
from fedalign.dadil.state import (ClientState, PublishedAtoms, client_rng, init_client, load_atoms,
                                  load_state, rng_from_array, rng_to_array, save_atoms, save_state)

D, C, KPC = 4, 2, 2


#: (orientation, height) of the domains c0, c1 and the target: class 0 at x0 = +1.5 · orientation,
#: class 1 opposite, σ = 0.7 (overlapping classes: the Bayes accuracy is Φ(1.5 / 0.7) ≈ 0.984),
#: the domain at x1 = height. c1 and the target have the classes the other way round from c0,
#: so no single linear rule fits both sources (pooled, they are an XOR): the target is classified
#: well only through atoms that moved to where the domains are, labeled by the right source.
DOMAINS = ((+1.0, 2.0), (-1.0, -2.0), (-1.0, -1.7))


def blobs(domain, n=120, seed=None):
    """Rows of ``DOMAINS[domain]`` (X (n, D), y (n,)), drawn with ``seed`` (default: domain)."""
    sign, height = DOMAINS[domain]
    rng = np.random.default_rng(domain if seed is None else seed)
    y = rng.integers(0, C, n)
    X = rng.normal(size=(n, D)) * 0.7
    X[:, 0] += np.where(y == 0, 1.5, -1.5) * sign
    X[:, 1] += height
    return X, y


def make_gmms(tmp_path, n_clients=3):
    """Labeled sources c0..c{n-2} and an unlabeled target (last): {client: path}."""
    paths = {}
    for i in range(n_clients):
        X, y = blobs(i)
        target = i == n_clients - 1
        g = fit_gmm(X, None if target else y, KPC, n_classes=C, seed=0, class_names=["a", "b"])
        name = "tgt" if target else f"c{i}"
        save_gmm(tmp_path / f"{name}.gmm.npz", g)
        paths[name] = tmp_path / f"{name}.gmm.npz"
    return paths


def fresh_state(client="c0", A=2, K=3, d=D, Cc=C, seed=0):
    g = GMM(np.full(K, 1 / K), np.zeros((K, d)), np.ones((K, d)), np.eye(Cc)[np.arange(K) % Cc])
    return init_client(client, g, n_atoms=A, seed=seed)


def test_atoms_file_holds_exactly_atoms_round_producer(tmp_path):
    st = fresh_state()
    save_atoms(tmp_path / "a.npz", st.published())
    with np.load(tmp_path / "a.npz", allow_pickle=False) as z:
        keys = set(z.files)
        meta = str(z["__meta__"])
    assert keys == {"means", "variances", "label_logits", "round", "__kind__", "__format_version__",
                    "__meta__"}
    import json

    assert json.loads(meta) == {"producer": "c0"}
    pa = load_atoms(tmp_path / "a.npz")
    np.testing.assert_array_equal(pa.means, st.means)
    assert pa.round == 0 and pa.producer == "c0"


def test_state_round_trip_keeps_rng_floor_and_history(tmp_path):
    st = fresh_state()
    g = GMM(np.full(3, 1 / 3), np.ones((3, D)), np.ones((3, D)), np.eye(C)[[0, 1, 0]])
    gossip_round(st, g, [], "none", local_steps=2)
    st.rng.random(5)
    save_state(tmp_path / "s.npz", st)
    back = load_state(tmp_path / "s.npz")
    assert back.client == "c0" and back.round == 1
    np.testing.assert_array_equal(back.alpha, st.alpha)
    np.testing.assert_array_equal(back.var_floor, st.var_floor)
    assert back.history == st.history and len(back.history[0]["losses"]) == 2
    assert len(back.history[0]["alpha"]) == 3 and len(back.history[0]["step_mean"]) == 2
    np.testing.assert_array_equal(back.rng.random(4), st.rng.random(4))
    with np.load(tmp_path / "s.npz", allow_pickle=False) as z:       # no optimiser survives
        assert not any(k.startswith("adam") for k in z.files)


def test_rng_array_round_trip():
    rng = client_rng(3, "x")
    rng.random(7)
    a = rng_to_array(rng)
    assert a.dtype == np.uint64 and a.shape == (6,)
    np.testing.assert_array_equal(rng_from_array(a).integers(0, 1000, 10), rng.integers(0, 1000, 10))


def test_init_own_start_per_client_and_shared_option():
    """Algorithm 1: each client its own seeded start (federation seed and client id)."""
    rng = np.random.default_rng(0)
    mu = np.array([5.0, -2.0, 0.5, 10.0])
    g = GMM(np.full(3, 1 / 3), mu + rng.normal(size=(3, D)) * 0.1, np.full((3, D), 0.04),
            np.eye(C)[[0, 1, 0]])
    a1, a2 = (init_client("c0", g, n_atoms=2, seed=1) for _ in range(2))
    b = init_client("c1", g, n_atoms=2, seed=1)
    np.testing.assert_array_equal(a1.means, a2.means)          # seeded: reproducible
    assert not np.allclose(a1.means, b.means)                    # distinct starts
    assert not np.allclose(a1.means, init_client("c0", g, n_atoms=2, seed=2).means)
    assert a1.rng.integers(1 << 30) == a2.rng.integers(1 << 30) != b.rng.integers(1 << 30)
    # around the client's own data: mean μ, spread its per-dimension std
    from fedalign.dadil.atoms import data_moments

    m, var = data_moments(g)
    big = init_client("c0", g, n_atoms=50, seed=1, n_components=40)
    np.testing.assert_allclose(big.means.reshape(-1, D).mean(0), m, atol=4 * np.sqrt(var.max()) / 40)
    np.testing.assert_allclose(big.variances[0, 0], np.maximum(var, big.var_floor))
    np.testing.assert_allclose(big.var_floor, 0.01 * var)
    np.testing.assert_array_equal(a1.label_logits, 0.0)
    np.testing.assert_allclose(a1.alpha, 0.5)
    # --shared-init: the earlier common N(0, I) dictionary
    s0, s1 = (init_client(c, g, n_atoms=2, seed=1, shared_init=True) for c in ("c0", "c1"))
    np.testing.assert_array_equal(s0.means, s1.means)
    np.testing.assert_array_equal(s0.variances, 1.0)
    # reference preset: N(0, I) per client, absolute floor 0.05, Adam
    r = init_client("c0", g, n_atoms=2, seed=1, preset="reference")
    assert r.settings["optimizer"] == "adam" and np.all(r.var_floor == 0.05)
    assert not np.allclose(r.means, init_client("c1", g, n_atoms=2, seed=1, preset="reference").means)
    with pytest.raises(FedalignError, match="preset"):
        init_client("c0", g, n_atoms=2, seed=1, preset="paper")


def peers_of(n=4, A=2, K=3, seed=0, round=0):
    rng = np.random.default_rng(seed)
    return [PublishedAtoms(rng.normal(size=(A, K, D)), rng.uniform(0.5, 2, (A, K, D)),
                           rng.normal(size=(A, K, C)), round, f"p{i}") for i in range(n)]


def test_replacement_adopts_exactly_one_peer():
    st = fresh_state()
    peers = peers_of()
    rec = communicate(st, peers, "replacement")
    (chosen,) = [p for p in peers if p.producer == rec["peers"][0]]
    np.testing.assert_array_equal(st.means, chosen.means)
    np.testing.assert_array_equal(st.label_logits, chosen.label_logits)


def test_peer_choice_ignores_argument_order_and_own_atoms():
    peers = peers_of(5)
    own = PublishedAtoms(*[np.zeros(1)] * 3, 0, "c0")
    r1 = communicate(fresh_state(seed=4), peers + [own], "aggregation")["peers"]
    r2 = communicate(fresh_state(seed=4), [own] + peers[::-1], "aggregation")["peers"]
    assert r1 == r2 and len(set(r1)) == 2 and "c0" not in r1
    picks = {tuple(choose_peers(np.random.default_rng(s), list(range(5)), 2)) for s in range(30)}
    assert len(picks) > 5  # random, not always the same pair


def test_aggregation_matches_components_by_ot_not_index():
    """Three versions with permuted components: their Wasserstein mean is the same set."""
    rng = np.random.default_rng(0)
    A, K = 2, 4
    m = rng.normal(size=(A, K, D)) * 5
    v = rng.uniform(0.5, 2, (A, K, D))
    lg = np.log(np.eye(C)[np.arange(K) % C] * 0.98 + 0.01)[None].repeat(A, 0)
    versions = []
    for s in range(3):
        perm = np.random.default_rng(s + 10).permutation(K)
        versions.append((m[:, perm], v[:, perm], lg[:, perm]))
    bm, bv, bl = aggregate_atoms(versions)
    for a in range(A):
        order = [int(np.argmin(((m[a] - x) ** 2).sum(1))) for x in bm[a]]
        assert sorted(order) == list(range(K))
        np.testing.assert_allclose(bm[a], m[a, order], atol=1e-8)
        np.testing.assert_allclose(bv[a], v[a, order], rtol=1e-8)
    # index-wise averaging would have blurred the permuted components
    assert not np.allclose(np.mean([x[0] for x in versions], 0), m, atol=1e-3)


def test_aggregation_single_component_closed_form():
    """K = 1: the equal-weight W2 mean of diagonal Gaussians averages means and std devs."""
    rng = np.random.default_rng(1)
    vers = [(rng.normal(size=(1, 1, D)), rng.uniform(0.2, 3, (1, 1, D)), np.zeros((1, 1, C)))
            for _ in range(3)]
    bm, bv, _ = aggregate_atoms(vers)
    np.testing.assert_allclose(bm[0, 0], np.mean([x[0][0, 0] for x in vers], 0), rtol=1e-12)
    np.testing.assert_allclose(np.sqrt(bv[0, 0]), np.mean([np.sqrt(x[1][0, 0]) for x in vers], 0),
                               rtol=1e-12)


def test_strategy_none_and_errors():
    st = fresh_state()
    m0 = st.means.copy()
    g = GMM(np.full(3, 1 / 3), np.ones((3, D)), np.ones((3, D)), np.eye(C)[[0, 1, 0]])
    gossip_round(st, g, peers_of(), "none", local_steps=0)
    np.testing.assert_array_equal(st.means, m0)
    assert st.round == 1
    with pytest.raises(FedalignError, match="at least one peer"):
        communicate(fresh_state(), [], "replacement")
    with pytest.raises(FedalignError, match="strategy"):
        communicate(fresh_state(), peers_of(), "average")
    bad = peers_of(1, K=5)
    with pytest.raises(FedalignError, match="components K=5"):
        gossip_round(fresh_state(), g, bad, "replacement", 0)
    g5 = GMM(np.full(3, 1 / 3), np.ones((3, 5)), np.ones((3, 5)), np.eye(C)[[0, 1, 0]])
    with pytest.raises(FedalignError, match="dimension d=5"):
        gossip_round(fresh_state(), g5, [], "none", 0)
    st = fresh_state()                                 # round 1 reads atoms of round 0 only
    with pytest.raises(FedalignError, match="of round 1, but client c0 has completed only 0"):
        gossip_round(st, g, peers_of(2, round=1), "aggregation", 0)
    assert st.round == 0
    gossip_round(st, g, peers_of(2, round=0), "aggregation", 0)
    gossip_round(st, g, peers_of(2, round=1), "aggregation", 0)
    assert st.round == 2


def test_round_files_leave_state_untouched_on_bad_peer(tmp_path):
    gp = make_gmms(tmp_path, 2)
    sp, ap = tmp_path / "c0.state.npz", tmp_path / "c0.r0.npz"
    init_files("c0", gp["c0"], sp, ap, n_atoms=2)
    before = sp.read_bytes()
    bad = PublishedAtoms(np.zeros((2, 4, D)), np.ones((2, 4, D)), np.zeros((2, 4, 3)), 0, "x")
    save_atoms(tmp_path / "bad.npz", bad)
    with pytest.raises(FedalignError, match="classes C=3"):
        round_files(sp, [tmp_path / "bad.npz"], tmp_path / "out.npz", "replacement", 1)
    with pytest.raises(FedalignError, match="no such file"):
        round_files(sp, [tmp_path / "missing.npz"], tmp_path / "out.npz", "replacement", 1)
    with pytest.raises(FedalignError, match="state of client c0"):
        round_files(sp, [], tmp_path / "out.npz", "none", 1, client="c1")
    assert sp.read_bytes() == before and not (tmp_path / "out.npz").exists()
    with pytest.raises(FedalignError, match="exists"):
        init_files("c0", gp["c0"], sp, ap)


def test_simulation_learns_and_is_deterministic(tmp_path):
    gp = make_gmms(tmp_path, 3)
    s1 = simulate(gp, tmp_path / "f1", rounds=3, strategy="aggregation", local_steps=4, n_atoms=2)
    s2 = simulate(gp, tmp_path / "f2", rounds=3, strategy="aggregation", local_steps=4, n_atoms=2)
    for c in gp:
        _, a1 = federation_paths(tmp_path / "f1", c, 3)
        _, a2 = federation_paths(tmp_path / "f2", c, 3)
        assert a1.read_bytes() == a2.read_bytes()
    rec = s1["tgt"].history
    assert rec[-1]["losses"][-1] < rec[0]["losses"][0]
    assert all(len(r["peers"]) == 2 for r in rec)
    assert isinstance(s1["tgt"], ClientState) and s1["tgt"].round == 3
    s3 = simulate(gp, tmp_path / "f3", rounds=2, strategy="replacement", local_steps=1,
                  n_atoms=2, keep_history=False)
    assert not (tmp_path / "f3" / "round_001").exists()
    assert (tmp_path / "f3" / "round_002" / "tgt.atoms.npz").exists()
    assert s3["c0"].round == 2


def test_target_classifier_reaches_bayes_accuracy_where_no_source_rule_fits(tmp_path):
    """Overlapping classes (Bayes accuracy ≈ 0.984) and sources whose classes point opposite
    ways: one linear rule on the pooled sources scores ≈ 0.68 on the target, so ≥ 0.93 needs
    atoms that moved to the target's domain with the labels of the source that matches it (with
    the atoms' means never updated, the same run scores ≈ 0.48)."""
    from scipy.stats import norm
    from sklearn.linear_model import LogisticRegression

    from fedalign.dadil.classifiers import accuracy, target_classifier

    gp = make_gmms(tmp_path, 3)
    st = simulate(gp, tmp_path / "f", rounds=6, strategy="aggregation", local_steps=10,
                  n_atoms=2)["tgt"]
    X, y = blobs(2, n=2000, seed=50)
    bayes = norm.cdf(1.5 / 0.7)
    pooled = [np.concatenate(a) for a in zip(blobs(0), blobs(1))]
    assert LogisticRegression().fit(*pooled).score(X, y) < 0.75        # the fixture is not trivial
    for head in ("map", "linear"):
        acc = accuracy(target_classifier(st, head, 200), X, y)
        assert bayes - 0.05 <= acc <= bayes + 0.02, (head, acc)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_gossip_rounds_run_without_torch(tmp_path):
    """The numpy paths (rounds, aggregation, consensus) never import torch: a `dadil-round`
    process pays only for numpy/scipy/POT imports. POT is imported as the CLI imports it: its
    own torch backend switched off, and lean (without its scikit-learn integrations)."""
    import json
    import os
    import subprocess
    import sys

    gp = make_gmms(tmp_path, 3)
    (tmp_path / "gmms.json").write_text(json.dumps({k: str(v) for k, v in gp.items()}))
    code = f"""
import json, sys
from pathlib import Path
from fedalign.dadil.consensus import consensus_history
from fedalign.dadil.simulation import simulate
gp = {{k: Path(v) for k, v in json.loads(Path({str(tmp_path / "gmms.json")!r}).read_text()).items()}}
simulate(gp, Path({str(tmp_path / "fed")!r}), rounds=2, strategy="aggregation", local_steps=2,
         n_atoms=2)
consensus_history([Path({str(tmp_path / "fed")!r})], 3, 0, 1)
print("torch" in sys.modules)
"""
    env = dict(os.environ, POT_BACKEND_DISABLE_PYTORCH="1", FEDALIGN_POT_LEAN="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False"


def test_lr_decay_shrinks_the_atoms_step_harmonically_and_old_states_read_as_constant():
    import dataclasses

    from fedalign.dadil.state import client_settings, optim_for

    st = types_state(dict(client_settings("fedalign", lr_decay=0.5), lr=0.2))
    assert optim_for(st).lr == pytest.approx(0.2)
    st.round = 4
    assert optim_for(st).lr == pytest.approx(0.2 / 3.0)
    old = dict(st.settings)
    del old["lr_decay"]
    assert optim_for(dataclasses.replace(st, settings=old)).lr == pytest.approx(0.2)
    with pytest.raises(FedalignError):
        client_settings("fedalign", lr_decay=-1.0)


def types_state(settings):
    """A minimal ClientState carrying only what optim_for reads."""
    from fedalign.dadil.state import ClientState

    z = np.zeros((1, 1, 1))
    return ClientState("c", z, z + 1, z, np.ones(1), 0, np.random.default_rng(0),
                       np.full(1, 1e-6), [], "", "", settings)

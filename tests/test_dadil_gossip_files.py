"""DeFed-GMM-DaDiL's file-level round API, called in-process: what ``init_files`` /
``round_files`` / ``publish`` write (the state, its published-atoms record, the history), the
checks they make before writing, the republishing of a lost atoms file, the one-line round
summary, and the record of the local steps and of the target's re-fit.

Tiny federations (d = 2, K = 2, C = 2, A = 2): every test well under a second (the first one
to reach the barycenter also pays POT's import). Written against the survivors of
``tools/mutation.sh gossip``; every test was checked by planting the mutants it kills."""

from __future__ import annotations

import copy
import re
import shutil

import numpy as np
import pytest

from fedalign import defaults
from fedalign.dadil import dictionary, gossip
from fedalign.dadil.atoms import Atoms
from fedalign.dadil.gossip import (aggregate_atoms, communicate, dedupe, describe_round,
                                   gossip_round, init_files, local_update, refit_received,
                                   round_files)
from fedalign.dadil.barycenter import labeled_barycenter, softmax
from fedalign.dadil.simulation import federation_paths
from fedalign.dadil.state import (ClientState, PublishedAtoms, init_client, load_atoms,
                                  load_state, save_atoms, save_state)
from fedalign.errors import FedalignError
from fedalign.files import atomic_outputs, locked, read_npz, sha256_file
from fedalign.gmm import GMM, save_gmm

D, C = 2, 2
HISTORY_KEYS = {"strategy", "peers", "peer_rounds", "losses", "alpha", "step_mean", "step_std",
                "round"}


def source_gmm(shift=0.0, d=D):
    """A labeled two-component GMM: class 0 near the origin, class 1 near (3, 1), moved by shift."""
    m = np.zeros((2, d))
    m[1, :2] = [3.0, 1.0]
    return GMM(np.full(2, 0.5), m + shift, np.full((2, d), 0.3), np.eye(C), ["a", "b"])


def target_gmm():
    """The unlabeled target (class names only)."""
    return GMM(np.full(2, 0.5), np.array([[0.5, 2.0], [3.0, -1.0]]), np.full((2, D), 0.4), None,
               ["a", "b"])


def federation(tmp_path, clients=("c0", "c1", "c2")):
    """GMM files and round-0 states/atoms in the simulation's layout:
    {client: (gmm, state, atoms)}."""
    out = {}
    for i, c in enumerate(clients):
        gp = tmp_path / f"{c}.gmm.npz"
        save_gmm(gp, target_gmm() if c == "tgt" else source_gmm(0.5 * i))
        (tmp_path / "state").mkdir(exist_ok=True)
        (tmp_path / "round_000").mkdir(exist_ok=True)
        sp, ap = federation_paths(tmp_path, c, 0)
        init_files(c, gp, sp, ap, n_atoms=2, seed=3)
        out[c] = (gp, sp, ap)
    return out


def published_record(sp):
    return read_npz(sp, "state")[1].get("published")


def round_one(tmp_path, client="c0"):
    """The client's round-1 atoms path (its folder created)."""
    (tmp_path / "round_001").mkdir(exist_ok=True)
    return federation_paths(tmp_path, client, 1)[1]


# --------------------------------------------------------------------------------- init_files
def test_init_writes_a_round_zero_state_whose_published_record_points_at_its_atoms(tmp_path):
    fed = federation(tmp_path, ("c0",))
    gp, sp, ap = fed["c0"]
    st = load_state(sp)
    assert st.client == "c0" and st.round == 0 and st.history == []
    assert st.gmm_path == str(gp) and st.gmm_sha256 == sha256_file(gp)
    assert st.shape == (2, 2, D, C)                        # n_atoms=2 reached init_client
    assert st.settings["seed"] == 3
    # the record: the atoms file relative to the state's folder, its bytes' hash, the round
    assert published_record(sp) == {"path": "../round_000/c0.atoms.npz",
                                    "sha256": sha256_file(ap), "round": 0}
    pa = load_atoms(ap)
    assert pa.round == 0 and pa.producer == "c0"
    np.testing.assert_array_equal(pa.means, st.means)
    np.testing.assert_array_equal(pa.variances, st.variances)
    np.testing.assert_array_equal(pa.label_logits, st.label_logits)


def test_init_refuses_an_existing_state_unless_forced_and_force_takes_the_lock(tmp_path):
    gp, sp, ap = federation(tmp_path, ("c0",))["c0"]
    before = sp.read_bytes()
    with pytest.raises(FedalignError, match=re.escape("(use --force to start over)") + "$"):
        init_files("c0", gp, sp, ap, n_atoms=2, seed=3)
    assert sp.read_bytes() == before
    with locked(sp, "a test"):
        with pytest.raises(FedalignError, match="is locked by another dadil-round"):
            init_files("c0", gp, sp, ap, n_atoms=2, seed=4, force=True)
    assert sp.read_bytes() == before
    st = init_files("c0", gp, sp, ap, n_atoms=2, seed=4, force=True)
    assert load_state(sp).settings["seed"] == 4 and st.round == 0
    assert published_record(sp)["sha256"] == sha256_file(ap)


def test_init_uses_a_preloaded_gmm_and_hash_without_reading_the_gmm_file(tmp_path):
    gone = tmp_path / "not-there.gmm.npz"
    sp, ap = tmp_path / "c0.state.npz", tmp_path / "c0.r0.npz"
    g = source_gmm(100.0)
    st = init_files("c0", gone, sp, ap, gmm=g, gmm_sha256="ab" * 32, n_atoms=2)
    back = load_state(sp)
    assert back.gmm_path == str(gone) and back.gmm_sha256 == "ab" * 32
    assert np.all(st.means > 90)              # atoms drawn around the GMM that was passed


# -------------------------------------------------------------------------------- round_files
def test_round_writes_state_history_and_atoms_of_round_one(tmp_path):
    fed = federation(tmp_path)
    _, sp, ap0 = fed["c0"]
    ap1 = round_one(tmp_path)
    peers = [fed["c1"][2], fed["c2"][2], ap0]               # the client's own atoms are ignored
    st, rec = round_files(sp, peers, ap1, "replacement", 2, client="c0")
    assert set(rec) == HISTORY_KEYS                          # nothing republished
    assert rec["strategy"] == "replacement" and rec["round"] == 1 == st.round
    assert rec["peers"] in (["c1"], ["c2"]) and rec["peer_rounds"] == [0]
    assert len(rec["losses"]) == 2 and len(rec["step_mean"]) == 2 == len(rec["step_std"])
    assert len(rec["alpha"]) == 3 and rec["alpha"][-1] == st.alpha.tolist()
    back = load_state(sp)
    assert back.round == 1 and back.history == [rec]
    assert published_record(sp) == {"path": "../round_001/c0.atoms.npz",
                                    "sha256": sha256_file(ap1), "round": 1}
    pa = load_atoms(ap1)
    assert pa.round == 1 and pa.producer == "c0"
    np.testing.assert_array_equal(pa.means, back.means)
    assert not np.array_equal(pa.means, load_atoms(ap0).means)


def test_round_defaults_are_aggregation_of_two_peers_with_the_default_local_steps(tmp_path):
    fed = federation(tmp_path)
    _, sp, _ = fed["c0"]
    st, rec = round_files(sp, [fed["c1"][2], fed["c2"][2]], round_one(tmp_path))
    assert rec["strategy"] == "aggregation" and sorted(rec["peers"]) == ["c1", "c2"]
    assert len(rec["losses"]) == defaults.LOCAL_STEPS == 5   # the CLI's and Flower's E


def test_round_with_zero_local_steps_only_communicates(tmp_path):
    fed = federation(tmp_path)
    _, sp, _ = fed["c0"]
    alpha0 = load_state(sp).alpha.tolist()
    st, rec = round_files(sp, [fed["c1"][2]], round_one(tmp_path), "replacement", 0)
    np.testing.assert_array_equal(st.means, load_atoms(fed["c1"][2]).means)
    assert {k: rec[k] for k in ("losses", "alpha", "step_mean", "step_std")} == \
        dict(losses=[], alpha=[alpha0], step_mean=[], step_std=[])
    assert load_state(sp).round == 1


def test_round_refuses_negative_steps_a_missing_state_and_a_locked_one(tmp_path):
    fed = federation(tmp_path, ("c0",))
    _, sp, _ = fed["c0"]
    out = round_one(tmp_path)
    with pytest.raises(FedalignError, match="local_steps must be ≥ 0, got -1"):
        round_files(sp, [], out, "none", -1)
    missing = tmp_path / "state" / "c9.state.npz"
    with pytest.raises(FedalignError, match=re.escape(f"no such file: {missing}")):
        round_files(missing, [], out, "none", 0)
    with locked(sp, "a test"):
        with pytest.raises(FedalignError, match="is locked by another dadil-round"):
            round_files(sp, [], out, "none", 0)
    assert not out.exists() and load_state(sp).round == 0


def test_round_reads_the_gmm_given_and_refuses_one_that_is_not_the_clients(tmp_path):
    fed = federation(tmp_path, ("c0", "c1"))
    gp, sp, _ = fed["c0"]
    out = round_one(tmp_path)
    before = sp.read_bytes()
    wide = tmp_path / "wide.gmm.npz"
    save_gmm(wide, source_gmm(d=3))
    with pytest.raises(FedalignError, match=re.escape(f"{wide} has dimension d=3")):
        round_files(sp, [], out, "none", 0, gmm_path=wide)
    other = fed["c1"][0]
    old, new = sha256_file(gp), sha256_file(other)
    with pytest.raises(FedalignError, match=re.escape(
            f"{other} is not the GMM client c0 was initialised with "
            f"(sha256 {new[:12]}… ≠ {old[:12]}…)")):
        round_files(sp, [], out, "none", 0, gmm_path=other)
    assert sp.read_bytes() == before and not out.exists()
    moved = tmp_path / "moved.gmm.npz"                       # the GMM moved: --gmm finds it
    shutil.move(gp, moved)
    st, rec = round_files(sp, [], out, "none", 1, gmm_path=moved)
    assert st.round == 1 and len(rec["losses"]) == 1


def test_round_names_the_peer_file_it_refuses(tmp_path):
    fed = federation(tmp_path, ("c0", "c1"))
    _, sp, _ = fed["c0"]
    future = tmp_path / "future.npz"
    pa = load_atoms(fed["c1"][2])
    pa.round = 5
    save_atoms(future, pa)
    with pytest.raises(FedalignError, match=re.escape(f"{future} from c1 are of round 5")):
        round_files(sp, [future], round_one(tmp_path), "replacement", 0)


def test_round_republishes_a_published_atoms_file_that_went_missing(tmp_path):
    fed = federation(tmp_path, ("c0", "c1"))
    _, sp, ap0 = fed["c0"]
    sha0, means0 = sha256_file(ap0), load_atoms(ap0).means
    ap0.unlink()
    st, rec = round_files(sp, [fed["c1"][2]], round_one(tmp_path), "replacement", 1)
    assert ap0.is_file() and sha256_file(ap0) == sha0       # the same bytes as at --init
    np.testing.assert_array_equal(load_atoms(ap0).means, means0)
    assert rec["republished"] == str(sp.parent / "../round_000/c0.atoms.npz")
    assert set(rec) == HISTORY_KEYS | {"republished"} and rec["round"] == 1
    assert load_state(sp).round == 1


def test_round_republishes_a_stale_atoms_file(tmp_path):
    fed = federation(tmp_path, ("c0", "c1"))
    _, sp, ap0 = fed["c0"]
    sha0 = sha256_file(ap0)
    shutil.copyfile(fed["c1"][2], ap0)                       # another file under the name
    _, rec = round_files(sp, [fed["c1"][2]], round_one(tmp_path), "replacement", 0)
    assert sha256_file(ap0) == sha0 and "republished" in rec


def test_round_that_fails_on_a_peer_does_not_republish(tmp_path):
    """The repair of a lost atoms file is part of a successful round: a bad peer (checked
    after the repair is detected) leaves the lost file lost and the state untouched."""
    fed = federation(tmp_path, ("c0", "c1"))
    _, sp, ap0 = fed["c0"]
    state, sha0 = sp.read_bytes(), sha256_file(ap0)
    ap0.unlink()
    future = tmp_path / "future.npz"
    pa = load_atoms(fed["c1"][2])
    pa.round = 5
    save_atoms(future, pa)
    with pytest.raises(FedalignError, match="are of round 5"):
        round_files(sp, [future], round_one(tmp_path), "replacement", 0)
    assert not ap0.exists() and sp.read_bytes() == state
    assert sorted(p.name for p in (tmp_path / "round_001").iterdir()) == []
    _, rec = round_files(sp, [fed["c1"][2]], round_one(tmp_path), "replacement", 0)
    assert sha256_file(ap0) == sha0 and "republished" in rec


def test_round_publishing_onto_its_lost_file_replaces_it_without_republishing(tmp_path):
    """Atoms published to one path every round: the new atoms replace the stale file (one
    write in the transaction, not a repair and then an overwrite)."""
    fed = federation(tmp_path, ("c0", "c1"))
    _, sp, ap0 = fed["c0"]
    shutil.copyfile(fed["c1"][2], ap0)                       # stale
    st, rec = round_files(sp, [fed["c1"][2]], ap0, "replacement", 0)
    assert "republished" not in rec and load_atoms(ap0).round == 1 == st.round
    assert published_record(sp)["sha256"] == sha256_file(ap0)


def test_round_on_a_state_without_a_published_record_publishes_normally(tmp_path):
    fed = federation(tmp_path, ("c0", "c1"))
    _, sp, _ = fed["c0"]
    save_state(sp, load_state(sp))                           # an older state: no record
    assert published_record(sp) is None
    out = round_one(tmp_path)
    st, rec = round_files(sp, [fed["c1"][2]], out, "replacement", 0)
    assert set(rec) == HISTORY_KEYS and published_record(sp)["sha256"] == sha256_file(out)


def test_rounds_inside_an_enclosing_transaction_land_on_disk_at_once(tmp_path):
    """As the CLI runs them (inside its own transaction): init and round commit on their own,
    and a lost atoms file is republished before the round's state and atoms are written."""
    (tmp_path / "state").mkdir()
    (tmp_path / "round_000").mkdir()
    (tmp_path / "round_001").mkdir()
    gp = tmp_path / "c0.gmm.npz"
    save_gmm(gp, source_gmm())
    sp, ap0 = federation_paths(tmp_path, "c0", 0)
    ap1 = federation_paths(tmp_path, "c0", 1)[1]
    peer = tmp_path / "p.npz"
    save_atoms(peer, PublishedAtoms(*(np.ones((2, 2, k)) for k in (D, D, C)), 0, "p"))
    with atomic_outputs():
        init_files("c0", gp, sp, ap0, n_atoms=2)
        assert sp.is_file() and ap0.is_file()
        ap0.unlink()
        round_files(sp, [peer], ap1, "replacement", 0)
        assert ap0.is_file() and ap1.is_file() and load_state(sp).round == 1


# ------------------------------------------------------------------ peers and communication
def test_dedupe_accepts_identical_copies_and_refuses_files_that_differ_in_any_array():
    rng = np.random.default_rng(0)
    a = PublishedAtoms(rng.normal(size=(2, 2, D)), rng.uniform(0.5, 2, (2, 2, D)),
                       rng.normal(size=(2, 2, C)), 1, "p0")
    twin = copy.deepcopy(a)
    (kept,) = dedupe([a, twin])
    assert kept.round == 1 and kept.producer == "p0"
    for field in ("means", "variances", "label_logits"):
        b = copy.deepcopy(a)
        getattr(b, field)[0, 0, 0] += 0.5
        with pytest.raises(FedalignError, match="two different atoms files from p0 for round 1"):
            dedupe([a, b])


def test_communicate_records_strategy_peers_and_their_rounds():
    st = init_client("c0", source_gmm(), n_atoms=2, seed=0)
    peer = PublishedAtoms(np.ones((2, 2, D)), np.ones((2, 2, D)), np.zeros((2, 2, C)), 0, "p1")
    assert communicate(st, [peer], "replacement") == \
        dict(strategy="replacement", peers=["p1"], peer_rounds=[0])
    before = st.means.copy()
    assert communicate(st, [peer], "none") == dict(strategy="none", peers=[], peer_rounds=[])
    np.testing.assert_array_equal(st.means, before)
    with pytest.raises(FedalignError, match="one of replacement, aggregation, none"):
        communicate(st, [peer], "gossip")


def test_aggregate_of_a_single_version_is_that_version():
    rng = np.random.default_rng(1)
    m, v = rng.normal(size=(2, 3, D)), rng.uniform(0.5, 2, (2, 3, D))
    lg = np.log(softmax(rng.normal(size=(2, 3, C))))
    bm, bv, bl = aggregate_atoms([(m, v, lg)])
    for got, want in ((bm, m), (bv, v), (bl, lg)):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.sort(got, axis=1), np.sort(want, axis=1), atol=1e-9)


def test_aggregate_runs_the_barycenter_fixed_point_to_convergence():
    """Versions whose barycenter needs four fixed-point iterations (plans change after the
    second): stopping early leaves the means up to 0.65 away."""
    rng = np.random.default_rng(142)
    M = rng.normal(size=(3, 3, D)) * 2
    V = rng.uniform(0.3, 2, (3, 3, D))
    L = softmax(rng.normal(size=(3, 3, C)) * 2)
    ref = labeled_barycenter(np.full(3, 1 / 3), M, V, L, tol=0.0, max_iter=200)
    early = labeled_barycenter(np.full(3, 1 / 3), M, V, L, max_iter=1)
    assert np.abs(early.means - ref.means).max() > 0.1      # the fixture is not trivial
    versions = [(M[i][None], V[i][None], np.log(L[i])[None]) for i in range(3)]
    bm, bv, bl = aggregate_atoms(versions)
    np.testing.assert_allclose(bm[0], ref.means, atol=1e-6)
    np.testing.assert_allclose(bv[0], ref.variances, atol=1e-6)
    # its tol and max_iter are the fixed point's
    np.testing.assert_allclose(aggregate_atoms(versions, max_iter=1)[0][0], early.means, atol=1e-12)
    loose = labeled_barycenter(np.full(3, 1 / 3), M, V, L, tol=1.0)
    np.testing.assert_allclose(aggregate_atoms(versions, tol=1.0)[0][0], loose.means, atol=1e-12)
    assert np.abs(loose.means - ref.means).max() > 0.1


# --------------------------------------------------------------------------- local steps
def test_local_update_records_each_step_and_moves_by_the_clients_own_step_size():
    st = init_client("c0", source_gmm(), n_atoms=2, seed=0)
    g = source_gmm()
    sts = [copy.deepcopy(st) for _ in range(2)]
    sts[0].settings["lr"], sts[1].settings["lr"] = 0.05, 0.15
    recs = [local_update(s, g, 1) for s in sts]
    for s, rec in zip(sts, recs):
        assert len(rec["losses"]) == 1 == len(rec["step_mean"]) == len(rec["step_std"])
        assert rec["alpha"] == [st.alpha.tolist(), s.alpha.tolist()]
        assert s.alpha.dtype == np.float64
    # gd removes the fraction lr of the residual: three times the lr, three times the step
    assert recs[1]["step_mean"][0] == pytest.approx(3 * recs[0]["step_mean"][0], rel=1e-9)
    assert recs[0]["step_mean"][0] > 0
    with pytest.raises(FedalignError, match="the number of local steps must be ≥ 0, got -1"):
        local_update(st, g, -1)


def test_local_update_with_zero_steps_records_only_the_start():
    st = init_client("c0", source_gmm(), n_atoms=2, seed=0)
    before = st.means.copy()
    assert local_update(st, source_gmm(), 0) == dict(losses=[], alpha=[st.alpha.tolist()],
                                                      step_mean=[], step_std=[])
    np.testing.assert_array_equal(st.means, before)


@pytest.mark.parametrize("target_atoms, moves", [(False, False), (True, True), (None, True)])
def test_target_moves_its_atoms_only_when_its_settings_say_so(target_atoms, moves):
    """fedalign preset: the target moves α only; ``target_atoms=True`` (the reference preset)
    moves its atoms too; a state written before the setting existed (no key) moves them."""
    st = init_client("tgt", target_gmm(), n_atoms=2, seed=0,
                     target_atoms=bool(target_atoms))
    if target_atoms is None:
        del st.settings["target_atoms"]
    before = st.means.copy(), st.variances.copy()
    rec = local_update(st, target_gmm(), 2)
    assert len(rec["losses"]) == 2
    assert (not np.array_equal(st.means, before[0])) is moves
    if not moves:
        np.testing.assert_array_equal(st.variances, before[1])
        assert rec["step_mean"] == [0.0, 0.0]


# -------------------------------------------------------------- gossip_round and the target
def test_gossip_round_defaults_to_aggregation_with_the_default_steps_and_records_the_round():
    st = init_client("c0", source_gmm(), n_atoms=2, seed=0)
    rng = np.random.default_rng(0)
    peers = [PublishedAtoms(rng.normal(size=(2, 2, D)), rng.uniform(0.5, 2, (2, 2, D)),
                            rng.normal(size=(2, 2, C)), 0, f"p{i}") for i in range(3)]
    st, pub, rec = gossip_round(st, source_gmm(), peers)
    assert rec["strategy"] == "aggregation" and len(rec["peers"]) == 2
    assert len(rec["losses"]) == defaults.LOCAL_STEPS == 5
    assert set(rec) == HISTORY_KEYS and rec["round"] == 1 == st.round == pub.round
    assert st.history == [rec] and st.received is None      # a source keeps no received copy


def test_target_round_keeps_the_received_atoms_and_records_their_alpha():
    st = init_client("tgt", target_gmm(), n_atoms=2, seed=0)
    peer = PublishedAtoms(np.array([[[0.5, 2.0], [3.0, -1.0]], [[0.0, 0.0], [2.0, 2.0]]]),
                          np.full((2, 2, D), 0.5), np.zeros((2, 2, C)), 0, "c1")
    st, _, rec = gossip_round(st, target_gmm(), [peer], "replacement", 2)
    assert set(rec) == HISTORY_KEYS | {"alpha_received"}
    assert rec["alpha_received"] == st.alpha_received.tolist()
    for got, want in zip(st.received, (peer.means, peer.variances, peer.label_logits)):
        np.testing.assert_array_equal(got, want)


def _refit_fixture():
    """Atoms and a target where the re-fit takes 5 Newton steps and ends elsewhere from
    another start, by another rule or without the relative-decrease stop."""
    rng = np.random.default_rng(8)
    A, K = 3, 3
    at = Atoms(rng.normal(size=(A, K, D)) * 2, rng.uniform(0.2, 1, (A, K, D)),
               rng.normal(size=(A, K, C)))
    g = GMM(np.full(3, 1 / 3), rng.normal(size=(3, D)) * 2, rng.uniform(0.2, 1, (3, D)), None,
            ["a", "b"])
    st = ClientState("tgt", at.means, at.variances, at.label_logits, np.array([0.7, 0.2, 0.1]),
                     1, np.random.default_rng(0), np.full(D, 1e-3))
    return st, g, (at.means, at.variances, at.label_logits)


def test_target_refits_alpha_by_newton_from_its_own_alpha_on_the_received_atoms(monkeypatch):
    st, g, received = _refit_fixture()
    a0 = st.alpha.copy()

    def fit(n=gossip.REFIT_STEPS, **kw):
        kw = dict(dict(labeled=False, alpha0=a0, rule="newton", rtol=gossip.REFIT_RTOL), **kw)
        return dictionary.fit_alpha(Atoms(*received), g, n, **kw).alpha

    refit_received(st, g, received)
    assert st.received is received
    np.testing.assert_allclose(st.alpha_received, fit(), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(st.alpha, a0)            # its own α is left alone
    for other in (fit(alpha0=None), fit(rule="projected"), fit(rtol=0.0), fit(n=1)):
        assert np.abs(other - st.alpha_received).max() > 1e-5   # each choice matters here
    monkeypatch.setattr(gossip, "REFIT_STEPS", 1)          # the step budget is REFIT_STEPS
    refit_received(st, g, received)
    np.testing.assert_allclose(st.alpha_received, fit(n=1), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------ describe_round
def _described(losses, peers=("c1", "c2"), step_mean=None, alpha=(0.25, 0.75)):
    z = np.zeros((2, 1, 1))
    st = ClientState("c0", z, z, z, np.array(alpha), 3, None)
    rec = dict(round=3, strategy="aggregation", peers=list(peers), losses=list(losses),
               step_mean=list(step_mean if step_mean is not None else [0.5] * len(losses)))
    return describe_round(st, rec)


def test_describe_round_samples_a_long_loss_curve_at_four_points():
    line = _described([10.0, 9.1, 8.2, 7.3, 6.4, 5.5, 4.6],
                      step_mean=[0.51, 0.4, 0.3, 0.2, 0.15, 0.13, 0.12])
    assert line == ("c0 round 3 aggregation (peers: c1, c2), loss 10 → 8.2 → 6.4 → 4.6, "
                    "α (0.250, 0.750), step mean 0.51→0.12")
    assert _described([5.0, 4.0, 3.0, 2.0, 1.0]).split(", α")[0].endswith(
        "loss 5 → 4 → 2 → 1")


def test_describe_round_shows_a_short_curve_whole_and_no_steps_or_peers_plainly():
    assert _described([3.0, 2.0], peers=(), step_mean=[0.25, 0.125]) == (
        "c0 round 3 aggregation (peers: —), loss 3 → 2, α (0.250, 0.750), "
        "step mean 0.25→0.12")
    assert _described([], peers=("c1",)) == (
        "c0 round 3 aggregation (peers: c1), no local steps, α (0.250, 0.750)")


def test_describe_round_of_a_real_round_names_its_numbers(tmp_path):
    fed = federation(tmp_path, ("c0", "c1"))
    st, rec = round_files(fed["c0"][1], [fed["c1"][2]], round_one(tmp_path),
                          "replacement", 2)
    line = describe_round(st, rec)
    assert line.startswith("c0 round 1 replacement (peers: c1), loss ")
    assert f"{rec['losses'][0]:.4g} → {rec['losses'][-1]:.4g}" in line
    assert line.endswith(f"step mean {rec['step_mean'][0]:.2g}→{rec['step_mean'][-1]:.2g}")

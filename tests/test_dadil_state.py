"""fedalign.dadil.state: a client's files, their validation, its seeded start and its settings.

Round trips of every field of the ``state`` and ``atoms`` files, each refusal of a bad file
(built with :func:`fedalign.files.write_npz` directly), the seeded starts of
:func:`init_client` against the draws written out here, the presets of
:func:`client_settings` and :func:`client_barycenter` against
:func:`fedalign.dadil.barycenter.atoms_barycenter` (see docs/mutation.md, the ``state`` run).
"""

from __future__ import annotations

import json
import zlib

import re

import numpy as np
import pytest

from fedalign.dadil.atoms import Atoms
from fedalign.dadil.barycenter import atoms_barycenter
from fedalign.dadil.optim import PRESETS
from fedalign.dadil.state import (ClientState, PublishedAtoms, check_client_id, check_gmm_for_state,
                                  check_peer, client_barycenter, client_rng, client_settings,
                                  gmm_n_classes, init_client, load_atoms, load_state, optim_for,
                                  rng_from_array, rng_to_array, save_atoms, save_state)
from fedalign.errors import FedalignError
from fedalign.files import read_npz, write_npz
from fedalign.gmm import GMM

A, K, D, C = 2, 3, 4, 2


def labeled_gmm(n_classes=C, d=D, k=K, **kw):
    """A labeled GMM with unequal weights and per-dimension spreads (μ, σ² not automatic)."""
    rng = np.random.default_rng(7)
    w = np.arange(1.0, k + 1)
    return GMM(w / w.sum(), rng.normal(size=(k, d)) * [1.0, 3.0, 0.5, 2.0][:d] + [5.0, -2.0, 0.5, 10.0][:d],
               rng.uniform(0.1, 2.0, (k, d)), np.eye(n_classes)[np.arange(k) % n_classes], **kw)


def unlabeled_gmm(class_names=(), meta=None, d=D, k=K):
    rng = np.random.default_rng(8)
    return GMM(np.full(k, 1 / k), rng.normal(size=(k, d)), rng.uniform(0.5, 1.5, (k, d)), None,
               list(class_names), meta=dict(meta or {}))


def moments(g):
    """Per-dimension mean and variance of a diagonal mixture, written out: E[x], E[x²] − E[x]²."""
    w = g.weights / g.weights.sum()
    mu = np.einsum("k,kd->d", w, g.means)
    return mu, np.einsum("k,kd->d", w, g.variances + g.means**2) - mu**2


def init_draws(seed, client, shape):
    """ε of a client's own start: N(0, I) from SeedSequence(seed, spawn_key=(crc32(id), 1))."""
    ss = np.random.SeedSequence(seed, spawn_key=(zlib.crc32(client.encode()), 1))
    return np.random.default_rng(ss).standard_normal(shape)


def state_arrays(**changes):
    """The arrays of a valid (A, K, D, C) state file, with ``changes`` (None drops an array)."""
    rng = np.random.default_rng(3)
    arrays = dict(means=rng.normal(size=(A, K, D)), variances=rng.uniform(0.5, 2.0, (A, K, D)),
                  label_logits=rng.normal(size=(A, K, C)), alpha=np.array([0.25, 0.75]),
                  round=np.int64(2), rng_state=rng_to_array(client_rng(0, "c0")),
                  var_floor=np.full(D, 0.01))
    arrays.update(changes)
    return {k: v for k, v in arrays.items() if v is not None}


def received_arrays(**changes):
    rng = np.random.default_rng(4)
    out = dict(received_means=rng.normal(size=(A, K, D)),
               received_variances=rng.uniform(0.5, 2.0, (A, K, D)),
               received_label_logits=rng.normal(size=(A, K, C)),
               alpha_received=np.array([0.6, 0.4]))
    out.update(changes)
    return out


def a_state(client="c0", round_=1, **kw):
    rng = np.random.default_rng(5)
    return ClientState(client, rng.normal(size=(A, K, D)), rng.uniform(0.5, 2.0, (A, K, D)),
                       rng.normal(size=(A, K, C)) * 2, np.array([0.3, 0.7]), round_,
                       client_rng(1, client), np.full(D, 0.02), **kw)


# -------------------------------------------------------------------------- ids and generators
@pytest.mark.parametrize("good", ["c0", "site-1.a_b", "A" * 64, "9"])
def test_client_ids_of_letters_digits_and_separators_are_accepted(good):
    assert check_client_id(good) == good


@pytest.mark.parametrize("bad", ["bad id", "", "-x", ".x", "A" * 65, "../x", "a/b", 42, None])
def test_other_client_ids_are_refused_by_name(bad):
    with pytest.raises(FedalignError, match="invalid client id"):
        check_client_id(bad)


def test_rng_serialisation_refuses_a_generator_other_than_pcg64():
    with pytest.raises(ValueError, match="^only PCG64 generators are serialisable$"):
        rng_to_array(np.random.Generator(np.random.MT19937(0)))


def test_rng_words_stored_as_signed_integers_restore_the_same_generator():
    """Words given as int64 are read as their unsigned bits, so the generator continues with
    the same draws (a state file's int64 words must be ≥ 0: the schema's "u" kind)."""
    rng = client_rng(0, "c0")
    rng.random(3)
    words = rng_to_array(rng).astype(np.int64)
    assert np.any(words < 0)                     # the case where signedness matters
    np.testing.assert_array_equal(rng_from_array(words).random(5), rng.random(5))


# ------------------------------------------------------------------------------- atoms files
def test_atoms_file_round_trips_every_field(tmp_path):
    st = a_state(round_=4)
    pa = load_atoms(save_atoms(tmp_path / "a.npz", st.published()))
    for got, want in ((pa.means, st.means), (pa.variances, st.variances),
                      (pa.label_logits, st.label_logits)):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float64
    assert (pa.round, pa.producer, pa.shape) == (4, "c0", (A, K, D, C))


def test_files_store_float64_arrays_whatever_the_input_dtype(tmp_path):
    """Published atoms (whose bytes are hashed) and the state's floor are float64 on disk."""
    st = a_state()
    pa = PublishedAtoms(st.means.astype(np.float32), np.ones((A, K, D), np.int64),
                        np.zeros((A, K, C), np.float32), 0, "c0")
    a, _ = read_npz(save_atoms(tmp_path / "a.npz", pa), "atoms")
    assert {k: a[k].dtype for k in ("means", "variances", "label_logits")} == \
        dict.fromkeys(("means", "variances", "label_logits"), np.dtype(np.float64))
    st.var_floor = np.full(D, 0.5, np.float32)
    a, _ = read_npz(save_state(tmp_path / "s.npz", st), "state")
    assert a["var_floor"].dtype == np.float64


def test_atoms_file_with_unknown_arrays_is_refused_with_their_names(tmp_path):
    st = a_state()
    arrays = dict(means=st.means, variances=st.variances, label_logits=st.label_logits,
                  round=np.int64(1), alpha=st.alpha, seed=np.int64(0))
    write_npz(tmp_path / "a.npz", "atoms", arrays, {"producer": "c0"})
    with pytest.raises(FedalignError, match=r"unknown arrays \(alpha, seed\); a published atoms "
                       r"file holds only means, variances, label_logits, round"):
        load_atoms(tmp_path / "a.npz")


@pytest.mark.parametrize("meta", [{}, {"producer": "bad id"}, {"producer": "../c0"},
                                  {"producer": 3}])
def test_atoms_file_without_a_valid_producer_is_refused(tmp_path, meta):
    st = a_state()
    write_npz(tmp_path / "a.npz", "atoms", dict(means=st.means, variances=st.variances,
                                                label_logits=st.label_logits, round=np.int64(1)),
              meta)
    with pytest.raises(FedalignError, match="atoms file without a valid producer id"):
        load_atoms(tmp_path / "a.npz")


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_atoms_file_with_a_variance_not_positive_is_refused(tmp_path, bad):
    st = a_state()
    v = st.variances.copy()
    v[1, 2, 3] = bad
    write_npz(tmp_path / "a.npz", "atoms", dict(means=st.means, variances=v,
                                                label_logits=st.label_logits, round=np.int64(1)),
              {"producer": "c0"})
    with pytest.raises(FedalignError, match="atoms variances must be > 0"):
        load_atoms(tmp_path / "a.npz")


def test_atoms_file_of_a_negative_round_is_refused(tmp_path):
    st = a_state()
    write_npz(tmp_path / "a.npz", "atoms", dict(means=st.means, variances=st.variances,
                                                label_logits=st.label_logits, round=np.int64(-7)),
              {"producer": "c0"})
    with pytest.raises(FedalignError, match="atoms round must be ≥ 0, got -7"):
        load_atoms(tmp_path / "a.npz")


# ------------------------------------------------------------------------------- state files
def test_state_round_trip_keeps_every_field_and_the_generator_continues(tmp_path):
    rec = received_arrays()
    st = a_state(round_=3, history=[{"strategy": "aggregation", "peers": ["c1"], "losses": [1.5]}],
                 gmm_path="gmms/c0.gmm.npz", gmm_sha256="ab" * 32,
                 settings=dict(client_settings("reference"), seed=1),
                 received=(rec["received_means"], rec["received_variances"],
                           rec["received_label_logits"]),
                 alpha_received=rec["alpha_received"])
    st.rng.random(7)
    back = load_state(save_state(tmp_path / "s.npz", st))
    assert (back.client, back.round, back.gmm_path, back.gmm_sha256) == \
        ("c0", 3, "gmms/c0.gmm.npz", "ab" * 32)
    assert back.history == st.history and back.settings == st.settings
    for name in ("means", "variances", "label_logits", "alpha", "var_floor", "alpha_received"):
        np.testing.assert_array_equal(getattr(back, name), getattr(st, name), err_msg=name)
        assert getattr(back, name).dtype == np.float64, name
    assert len(back.received) == 3
    for got, want in zip(back.received, st.received):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(back.rng.random(6), st.rng.random(6))
    # without a received dictionary, none is read back
    st.received, st.alpha_received = None, None
    back = load_state(save_state(tmp_path / "s2.npz", st))
    assert back.received is None and back.alpha_received is None


def test_state_file_meta_records_its_producer_and_the_atoms_it_publishes(tmp_path):
    st = a_state(gmm_path="g.npz", gmm_sha256="cd" * 32)
    pub = {"path": "c0.r1.npz", "sha256": "ef" * 32, "round": 1}
    _, meta = read_npz(save_state(tmp_path / "s.npz", st, published=pub), "state")
    assert meta["producer"] == "fedalign dadil-round"
    assert meta["published"] == pub
    assert (meta["client"], meta["gmm_path"], meta["gmm_sha256"]) == ("c0", "g.npz", "cd" * 32)
    _, meta = read_npz(save_state(tmp_path / "s2.npz", st), "state")
    assert "published" not in meta


def test_state_file_with_only_a_client_id_reads_with_empty_defaults(tmp_path):
    write_npz(tmp_path / "s.npz", "state", state_arrays(), {"client": "c0"})
    st = load_state(tmp_path / "s.npz")
    assert (st.history, st.gmm_path, st.gmm_sha256, st.settings) == ([], "", "", {})
    assert st.received is None and st.alpha_received is None
    assert st.round == 2 and st.shape == (A, K, D, C)


def _floor(values):
    return np.array(values, dtype=np.float64)


BAD_STATES = {
    "no client": (dict(), {}, "state file without a valid client id"),
    "bad client": (dict(), {"client": "bad id"}, "state file without a valid client id"),
    "alpha for 3 atoms": (dict(alpha=np.full(3, 1 / 3)), None, "'alpha' has A=3"),
    "variance 0": (dict(variances=np.where(np.arange(D) == 2, 0.0, np.ones((A, K, D)))), None,
                   "state variances must be > 0"),
    "variance < 0": (dict(variances=-np.ones((A, K, D))), None, "state variances must be > 0"),
    "round < 0": (dict(round=np.int64(-1)), None, "state round must be ≥ 0, got -1"),
    "floor 0": (dict(var_floor=_floor([0.1, 0.0, 0.1, 0.1])), None,
                "var_floor must be 4 values > 0"),
    "floor < 0": (dict(var_floor=_floor([0.1, 0.1, 0.1, -1.0])), None,
                  "var_floor must be 4 values > 0"),
    "floor of 3": (dict(var_floor=_floor([0.1, 0.1, 0.1])), None, "'var_floor' has d=3"),
    "history dict": (dict(), {"client": "c0", "history": {"round": 1}},
                     "metadata 'history' must be a list, got dict"),
    "rng of 5 words": (dict(rng_state=np.arange(5, dtype=np.uint64)), None,
                       "rng_state must be the 6 words of a PCG64 state"),
    "rng negative": (dict(rng_state=np.array([-1, 0, 0, 1, 0, 0])), None,
                     "array 'rng_state' must hold unsigned words, got -1"),
    "rng of floats": (dict(rng_state=np.array([0.0, 1, 0, 1, 0, 0])), None,
                      "array 'rng_state' must be integer, got float64"),
    "rng all zero": (dict(rng_state=np.zeros(6, dtype=np.uint64)), None,   # looped forever
                     r"rng_state is not a PCG64 state \(even increment\)"),
    "rng has_uint32 2": (dict(rng_state=np.array([0, 1, 0, 1, 2, 0], dtype=np.uint64)), None,
                         r"rng_state is not a PCG64 state \(bad cached 32-bit word\)"),
    "rng uinteger 2^32": (dict(rng_state=np.array([0, 1, 0, 1, 1, 1 << 32], dtype=np.uint64)),
                          None, r"rng_state is not a PCG64 state \(bad cached 32-bit word\)"),
    "received variance 0": (received_arrays(received_variances=np.zeros((A, K, D))), None,
                            "state received_variances must be > 0"),
    "received variance < 0": (received_arrays(received_variances=-np.ones((A, K, D))), None,
                              "state received_variances must be > 0"),
    "received means only": (dict(received_means=np.zeros((A, K, D))), None,
                            "received dictionary without received_variances, "
                            "received_label_logits, alpha_received"),
    "received without alpha": (received_arrays(alpha_received=None), None,
                               "received dictionary without alpha_received"),
}


@pytest.mark.parametrize("case", list(BAD_STATES))
def test_a_bad_state_file_is_refused_naming_the_problem(tmp_path, case):
    changes, meta, message = BAD_STATES[case]
    meta = {"client": "c0"} if meta is None else meta
    arrays = state_arrays(**changes)
    if case in ("alpha for 3 atoms", "floor of 3", "rng negative", "rng of floats"):
        # write_npz itself refuses these: by hand
        np.savez(tmp_path / "s.npz", **arrays, __kind__=np.array("state"),
                 __format_version__=np.array(2), __meta__=np.array(json.dumps(meta)))
    else:
        write_npz(tmp_path / "s.npz", "state", arrays, meta)
    with pytest.raises(FedalignError, match=message):
        load_state(tmp_path / "s.npz")


# ------------------------------------------------------------------------------------ checks
def test_class_count_comes_from_labels_names_fit_record_or_argument():
    assert gmm_n_classes(labeled_gmm(3)) == 3
    assert gmm_n_classes(labeled_gmm(3), 3) == 3
    assert gmm_n_classes(unlabeled_gmm(["a", "b"])) == 2
    assert gmm_n_classes(unlabeled_gmm(meta={"n_classes": 4})) == 4
    assert gmm_n_classes(unlabeled_gmm(meta={"n_classes": 4}), 4) == 4
    assert gmm_n_classes(unlabeled_gmm(), 5) == 5


@pytest.mark.parametrize("gmm, n, message", [
    (labeled_gmm(3), 2, "n_classes 2 disagrees with the GMM's 3 classes"),
    (unlabeled_gmm(["a", "b"]), 3, "n_classes 3 disagrees with the GMM's 2 classes"),
    (unlabeled_gmm(meta={"n_classes": 4}), 5, "n_classes 5 disagrees with the GMM's 4 classes"),
    (unlabeled_gmm(), None, "the GMM has neither labels nor class names: give n_classes"),
])
def test_class_count_refused_when_absent_or_contradicted(gmm, n, message):
    with pytest.raises(FedalignError, match=f"^{re.escape(message)}$"):
        gmm_n_classes(gmm, n)


def test_gmm_must_have_the_atoms_dimension_and_class_count():
    st = a_state()
    check_gmm_for_state(st, labeled_gmm(C))
    check_gmm_for_state(st, unlabeled_gmm())             # no class count to disagree with
    with pytest.raises(FedalignError, match="^GMM has dimension d=3, client c0's atoms have d=4"):
        check_gmm_for_state(st, labeled_gmm(C, d=3))
    with pytest.raises(FedalignError, match="^GMM has 3 classes, client c0's atoms have C=2"):
        check_gmm_for_state(st, labeled_gmm(3))
    with pytest.raises(FedalignError, match="^test GMM has 3 classes"):
        check_gmm_for_state(st, unlabeled_gmm(["a", "b", "c"]), where="test GMM")


def test_peer_of_another_shape_is_refused_naming_every_difference():
    st = a_state(round_=1)
    rng = np.random.default_rng(0)
    same = PublishedAtoms(rng.normal(size=(A, K, D)), np.ones((A, K, D)),
                          np.zeros((A, K, C)), 1, "p1")
    check_peer(st, same)
    other = PublishedAtoms(np.zeros((A + 1, K + 1, D + 1)), np.ones((A + 1, K + 1, D + 1)),
                           np.zeros((A + 1, K + 1, C + 1)), 0, "p1")
    with pytest.raises(FedalignError, match=r"^peer atoms from p1: atoms A=3 \(expected 2\), "
                       r"components K=4 \(expected 3\), dimension d=5 \(expected 4\), "
                       r"classes C=3 \(expected 2\)$"):
        check_peer(st, other)
    one = PublishedAtoms(np.zeros((A, K, D + 1)), np.ones((A, K, D + 1)), np.zeros((A, K, C)), 0,
                         "p1")
    with pytest.raises(FedalignError, match=r"^x from p1: dimension d=5 \(expected 4\)$"):
        check_peer(st, one, where="x")


def test_peer_atoms_from_a_later_round_are_refused():
    st = a_state(round_=1)
    future = PublishedAtoms(np.zeros((A, K, D)), np.ones((A, K, D)), np.zeros((A, K, C)), 2, "p1")
    with pytest.raises(FedalignError, match=r"^peer atoms from p1 are of round 2, but client c0 "
                       r"has completed only 1 rounds \(round 2 reads atoms of rounds ≤ 1\)$"):
        check_peer(st, future)


# ---------------------------------------------------------------------------------- settings
def test_settings_default_to_the_fedalign_preset_and_record_its_name():
    assert client_settings() == dict(PRESETS["fedalign"], preset="fedalign")
    assert client_settings("reference") == dict(PRESETS["reference"], preset="reference")


def test_explicit_settings_override_the_preset_and_none_keeps_it():
    s = client_settings("fedalign", lr=0.05, optimizer="adam", lr_decay=0.0, lr_alpha=None)
    assert (s["lr"], s["optimizer"], s["lr_decay"]) == (0.05, "adam", 0.0)
    assert s["lr_alpha"] == PRESETS["fedalign"]["lr_alpha"]


def test_an_absolute_and_a_relative_floor_exclude_each_other():
    s = client_settings("fedalign", min_var=0.2)
    assert s["min_var"] == 0.2 and s["var_floor_rel"] is None
    s = client_settings("reference", var_floor_rel=0.05)
    assert s["var_floor_rel"] == 0.05 and s["min_var"] is None
    assert client_settings("fedalign", min_var=None)["var_floor_rel"] == 0.01
    assert client_settings("reference", var_floor_rel=None)["min_var"] == 0.05


@pytest.mark.parametrize("kw, message", [
    (dict(preset="paper"), "preset must be one of fedalign, reference, got 'paper'"),
    (dict(lr_decy=0.1), "unknown DaDiL setting 'lr_decy'"),
    (dict(init="uniform"), "init must be 'data' or 'normal', got 'uniform'"),
    (dict(min_var=0.0), "min_var must be > 0, got 0.0"),
    (dict(min_var=-1.0), "min_var must be > 0, got -1.0"),
    (dict(min_var=np.inf), "min_var must be > 0, got inf"),
    (dict(var_floor_rel=0.0), "var_floor_rel must be > 0, got 0.0"),
    (dict(var_floor_rel=-0.5), "var_floor_rel must be > 0, got -0.5"),
    (dict(lr_decay=-1.0), "lr_decay must be ≥ 0, got -1.0"),
])
def test_bad_settings_are_refused_naming_the_setting(kw, message):
    preset = kw.pop("preset", "fedalign")
    with pytest.raises(FedalignError, match=message):
        client_settings(preset, **kw)


def test_the_optimiser_carries_the_clients_own_floor():
    st = a_state()
    st.settings = client_settings()
    np.testing.assert_array_equal(optim_for(st).var_floor, st.var_floor)


# ------------------------------------------------------------------------------ a fresh client
def test_fedalign_start_is_drawn_around_the_data_mean_with_its_spread():
    """means = μ + s ⊙ ε, variances s², s² = max(σ², floor), floor = 1 % σ² (per dimension)."""
    g = labeled_gmm()
    mu, var = moments(g)
    st = init_client("c0", g, n_atoms=A, seed=11)
    floor = 0.01 * var
    np.testing.assert_allclose(st.var_floor, floor, rtol=1e-12)
    eps = init_draws(11, "c0", (A, K, D))
    np.testing.assert_allclose(st.means, mu + np.sqrt(var) * eps, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(st.variances, np.broadcast_to(var, (A, K, D)), rtol=1e-12)
    np.testing.assert_array_equal(st.label_logits, np.zeros((A, K, C)))
    np.testing.assert_array_equal(st.alpha, [0.5, 0.5])
    assert st.round == 0 and st.history == [] and st.received is None
    np.testing.assert_array_equal(st.rng.random(3), client_rng(11, "c0").random(3))


def test_reference_start_is_a_clients_own_standard_normal():
    g = labeled_gmm()
    r = init_client("c1", g, n_atoms=A, seed=3, preset="reference")
    np.testing.assert_array_equal(r.means, init_draws(3, "c1", (A, K, D)))
    np.testing.assert_array_equal(r.variances, np.ones((A, K, D)))
    np.testing.assert_array_equal(r.var_floor, np.full(D, 0.05))
    assert not np.allclose(r.means, init_client("c2", g, n_atoms=A, seed=3,
                                                preset="reference").means)


def test_shared_start_is_the_federations_standard_normal_for_every_client():
    g = labeled_gmm()
    s0, s1 = (init_client(c, g, n_atoms=A, seed=5, shared_init=True) for c in ("c0", "c1"))
    want = np.random.default_rng(5).standard_normal((A, K, D))
    np.testing.assert_array_equal(s0.means, want)
    np.testing.assert_array_equal(s1.means, want)
    np.testing.assert_array_equal(s0.variances, np.ones((A, K, D)))
    assert s0.settings["shared_init"] is True


def test_floor_follows_the_relative_or_absolute_setting():
    g = labeled_gmm()
    _, var = moments(g)
    np.testing.assert_allclose(init_client("c0", g, var_floor_rel=0.05).var_floor, 0.05 * var,
                               rtol=1e-12)
    st = init_client("c0", g, min_var=3.0)
    np.testing.assert_array_equal(st.var_floor, np.full(D, 3.0))
    assert st.variances.min() >= 3.0 and st.settings["min_var"] == 3.0


def test_fresh_client_defaults_and_settings_record():
    g = labeled_gmm()
    st = init_client("c0", g)
    assert st.shape == (3, K, D, C) and (st.gmm_path, st.gmm_sha256) == ("", "")
    np.testing.assert_array_equal(st.means, init_client("c0", g, seed=0, n_atoms=3).means)
    assert st.settings == dict(client_settings(), seed=0, n_atoms=3, n_components=K, n_classes=C,
                               shared_init=False, role="source")
    assert st.settings["shared_init"] is False
    t = init_client("t", unlabeled_gmm(["a", "b"]), n_atoms=1, n_components=5, seed=2,
                    gmm_path="t.gmm.npz", gmm_sha256="00" * 32)
    assert t.shape == (1, 5, D, 2) and (t.gmm_path, t.gmm_sha256) == ("t.gmm.npz", "00" * 32)
    assert (t.settings["role"], t.settings["seed"], t.settings["n_atoms"],
            t.settings["n_components"]) == ("target", 2, 1, 5)
    np.testing.assert_array_equal(t.alpha, [1.0])


def test_fresh_client_takes_the_class_count_from_the_argument_when_the_gmm_has_none():
    st = init_client("t", unlabeled_gmm(), n_atoms=1, n_components=1, n_classes=3)
    assert st.shape == (1, 1, D, 3) and st.settings["n_classes"] == 3
    with pytest.raises(FedalignError, match="disagrees"):
        init_client("c0", labeled_gmm(2), n_classes=3)


def test_state_writer_refuses_what_the_reader_refuses(tmp_path):
    """write_npz checks the same schema: negative words or a round beyond 2**53 are never
    written (the state the client holds is unchanged on disk)."""
    for changes, message in ((dict(rng_state=np.array([-1, 0, 0, 1, 0, 0])),
                              "array 'rng_state' must hold unsigned words, got -1"),
                             (dict(round=np.int64(2**53 + 1)),
                              r"array 'round' holds the integer 9007199254740993, beyond ±2\*\*53")):
        with pytest.raises(FedalignError, match=message):
            write_npz(tmp_path / "s.npz", "state", state_arrays(**changes), {"client": "c0"})
        assert not (tmp_path / "s.npz").exists()
    top = np.array([2**64 - 1, 2**64 - 1, 0, 1, 0, 0], dtype=np.uint64)   # the largest words
    write_npz(tmp_path / "s.npz", "state", state_arrays(rng_state=top), {"client": "c0"})
    np.testing.assert_array_equal(read_npz(tmp_path / "s.npz", "state")[0]["rng_state"], top)
    assert load_state(tmp_path / "s.npz").rng.bit_generator.state["state"]["state"] == 2**128 - 1


@pytest.mark.parametrize("kw, message", [
    (dict(seed=-1), r"^seed must be an integer in \[0, 2\*\*32 − 1 = 4294967295\] \(.*\), got -1$"),
    (dict(seed=2**32), r"^seed must be an integer in \[0, 2\*\*32 − 1 = 4294967295\] \(.*\), "
                       r"got 4294967296$"),
    (dict(seed=True), r"seed must be an integer .*got True"),
    (dict(seed=1.5), r"seed must be an integer .*got 1.5"),
    (dict(n_atoms=0), "the number of atoms must be ≥ 1, got 0"),
    (dict(n_components=0), "the number of components must be ≥ 1, got 0"),
    (dict(client="bad id"), "invalid client id"),
    (dict(lr_decy=1.0), "unknown DaDiL setting"),
])
def test_fresh_client_refuses_bad_arguments(kw, message):
    client = kw.pop("client", "c0")
    with pytest.raises(FedalignError, match=message):
        init_client(client, labeled_gmm(), **kw)


# ------------------------------------------------------------------------ the client's model
def test_client_barycenter_is_the_atoms_barycenter_of_its_own_atoms_and_alpha():
    st = a_state()
    atoms = Atoms(st.means, st.variances, st.label_logits)
    for got, want in ((client_barycenter(st), atoms_barycenter(atoms, st.alpha, tol=1e-6, max_iter=50)),
                      (client_barycenter(st, [1.0, 0.0]), atoms_barycenter(atoms, [1.0, 0.0])),
                      (client_barycenter(st, tol=0.5), atoms_barycenter(atoms, st.alpha, tol=0.5)),
                      (client_barycenter(st, max_iter=1), atoms_barycenter(atoms, st.alpha,
                                                                           max_iter=1))):
        np.testing.assert_array_equal(got.means, want.means)
        np.testing.assert_array_equal(got.variances, want.variances)
        np.testing.assert_array_equal(got.labels, want.labels)
        assert got.meta == want.meta
    assert client_barycenter(st).meta["barycenter"]["iterations"] > 1   # tol matters here
    assert client_barycenter(st, tol=0.5).meta["barycenter"]["iterations"] == 1
    assert client_barycenter(st, max_iter=1).meta["barycenter"]["converged"] is False
    np.testing.assert_allclose(client_barycenter(st, [1.0, 0.0]).means.sum(0),
                               st.means[0].sum(0), rtol=1e-12)


def test_target_barycenter_uses_the_received_dictionary_and_its_alpha():
    rec = received_arrays()
    received = (rec["received_means"], rec["received_variances"], rec["received_label_logits"])
    st = a_state(received=received, alpha_received=rec["alpha_received"])
    atoms = Atoms(*received)
    for got, want in ((client_barycenter(st), atoms_barycenter(atoms, rec["alpha_received"])),
                      (client_barycenter(st, [0.0, 1.0]), atoms_barycenter(atoms, [0.0, 1.0]))):
        np.testing.assert_array_equal(got.means, want.means)
        np.testing.assert_array_equal(got.labels, want.labels)


@pytest.mark.parametrize("key", ["alpha", "alpha_received"])
@pytest.mark.parametrize("bad", [[2.0, -1.0], [0.3, 0.3], [1.5, 0.0]])  # NaN: refused by the writer
def test_a_state_whose_weights_leave_the_simplex_is_refused(tmp_path, key, bad):
    st = a_state()
    if key == "alpha_received":
        st.received = (st.means, st.variances, st.label_logits)
        st.alpha_received = np.array([0.5, 0.5])
    setattr(st, key, np.array(bad))
    save_state(tmp_path / "s.npz", st)
    with pytest.raises(FedalignError, match=re.escape(f"s.npz: {key} must be nonnegative weights "
                                                      "summing to 1")):
        load_state(tmp_path / "s.npz")  # the file is named

"""DeFed-GMM-DaDiL behaviours that carry the method's meaning, each with a fixture where the
property is not automatic (checked by planting the bug: every test here fails when its
behaviour breaks; see docs/mutation.md)."""

from __future__ import annotations

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.gmm import GMM, fit_gmm, save_gmm
from fedalign.dadil.barycenter import atoms_barycenter, labeled_barycenter
from fedalign.dadil.consensus import consensus_matrix
from fedalign.dadil.gossip import choose_peers, communicate, dedupe
from fedalign.dadil.simulation import simulate
from fedalign.dadil.state import PublishedAtoms, init_client, load_atoms, save_atoms

pytestmark = pytest.mark.usefixtures("one_thread")


def fresh_state(client="c0", A=2, K=3, d=4, C=2, seed=0):
    g = GMM(np.full(K, 1 / K), np.zeros((K, d)), np.ones((K, d)), np.eye(C)[np.arange(K) % C])
    return init_client(client, g, n_atoms=A, seed=seed)


def random_atoms(producer, round_, seed, A=2, K=3, d=4, C=2):
    rng = np.random.default_rng(seed)
    return PublishedAtoms(rng.normal(size=(A, K, d)), rng.uniform(0.5, 2, (A, K, d)),
                          rng.normal(size=(A, K, C)), round_, producer)


# ------------------------------------------------------------------- the labeled barycenter
def _crossed_atoms():
    """Two 1-d atoms whose feature-nearest pairing mixes labels: atom 0 has class 0 at 0 and
    class 1 at 9, atom 1 class 0 at 10 and class 1 at 0.5. Matching by features alone pairs
    {0, 0.5} and {9, 10}; with the label term (β = max cost ⇒ a label mismatch costs more than
    any feature saving) class 0 pairs with class 0: B = {5 (class 0), 4.75 (class 1)}."""
    M = np.array([[[0.0], [9.0]], [[10.0], [0.5]]])
    V = np.ones_like(M)
    L = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    return M, V, L


def test_labeled_barycenter_matches_components_of_the_same_class():
    M, V, L = _crossed_atoms()
    B = labeled_barycenter([0.5, 0.5], M, V, L)
    np.testing.assert_allclose(B.labels, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(B.means[:, 0], [5.0, 4.75], atol=1e-12)
    np.testing.assert_allclose(B.variances, 1.0, atol=1e-12)
    # the fixture is not trivial: without the label term the plans pair by features and mix labels
    F = labeled_barycenter([0.5, 0.5], M, V, L, label_term=False)
    np.testing.assert_allclose(F.labels, 0.5, atol=1e-12)
    # the builder every classifier uses keeps the label term
    class A_:
        means, variances, label_logits = M, V, np.log(np.maximum(L, 1e-300))
    G = atoms_barycenter(A_, np.array([0.5, 0.5]))
    np.testing.assert_allclose(G.labels, np.eye(2), atol=1e-9)


# ------------------------------------------------------------------------- communication
def test_replacement_adopts_a_peers_atoms_never_the_clients_own():
    for seed in range(6):
        st = fresh_state(seed=seed)
        before = st.means.copy()
        own = PublishedAtoms(st.means + 100.0, st.variances.copy(), st.label_logits.copy(), 0, "c0")
        peers = [random_atoms(f"p{i}", 0, 10 * seed + i) for i in range(3)]
        rec = communicate(st, [own] + peers, "replacement")
        (chosen,) = [p for p in peers if p.producer == rec["peers"][0]]
        np.testing.assert_array_equal(st.means, chosen.means)
        np.testing.assert_array_equal(st.variances, chosen.variances)
        np.testing.assert_array_equal(st.label_logits, chosen.label_logits)
        assert not np.allclose(st.means, before) and not np.allclose(st.means, own.means)
        assert rec["peers"] != ["c0"]


def test_peers_are_drawn_without_replacement():
    for seed in range(200):
        got = choose_peers(np.random.default_rng(seed), list(range(3)), 2)
        assert len(set(got)) == 2
        assert sorted(choose_peers(np.random.default_rng(seed), ["a", "b"], 2)) == ["a", "b"]
    st = fresh_state(seed=3)
    rec = communicate(st, [random_atoms("p0", 0, 1), random_atoms("p1", 0, 2)], "aggregation")
    assert sorted(rec["peers"]) == ["p0", "p1"]


def test_deduplication_keeps_each_peers_latest_round():
    old, new = random_atoms("p0", 1, 1), random_atoms("p0", 3, 2)
    other = random_atoms("p1", 2, 3)
    for order in ([old, new, other], [new, old, other], [other, new, old]):
        out = dedupe(order)
        assert [p.producer for p in out] == ["p0", "p1"]
        assert out[0].round == 3
        np.testing.assert_array_equal(out[0].means, new.means)
    with pytest.raises(FedalignError, match="two different atoms files"):
        dedupe([old, random_atoms("p0", 1, 9)])


# --------------------------------------------------------------------- what is published
def _blob_gmms(tmp_path, n_clients=3):
    paths = {}
    for i in range(n_clients):
        rng = np.random.default_rng(i)
        y = rng.integers(0, 2, 120)
        X = np.array([[3.0, 0, 0, 0], [-3.0, 0, 0, 0]])[y] + rng.normal(size=(120, 4)) * 0.5 + 0.3 * i
        target = i == n_clients - 1
        g = fit_gmm(X, None if target else y, 2, n_classes=2, seed=0, class_names=["a", "b"])
        name = "tgt" if target else f"c{i}"
        save_gmm(tmp_path / f"{name}.gmm.npz", g)
        paths[name] = tmp_path / f"{name}.gmm.npz"
    return paths


def test_alpha_is_never_published_in_any_round(tmp_path):
    gp = _blob_gmms(tmp_path)
    states = simulate(gp, tmp_path / "fed", rounds=3, strategy="aggregation", local_steps=2, n_atoms=3)
    files = sorted((tmp_path / "fed").glob("round_*/*.atoms.npz"))
    assert len(files) == 4 * len(gp)
    import json

    for f in files:
        with np.load(f, allow_pickle=False) as z:
            keys = set(z.files)
            arrays = {k: z[k] for k in z.files}
        assert keys == {"means", "variances", "label_logits", "round", "__kind__",
                        "__format_version__", "__meta__"}, f
        meta = json.loads(str(arrays["__meta__"]))
        assert set(meta) == {"producer"}, f
        st = states[meta["producer"]]
        for a in (st.alpha, *(h["alpha"][-1] for h in st.history)):
            assert not any(np.shape(v) == np.shape(a) and np.allclose(v, a)
                           for v in arrays.values() if v.dtype.kind == "f"), f


def test_reader_rejects_an_atoms_file_with_unknown_arrays(tmp_path):
    st = fresh_state()
    p = save_atoms(tmp_path / "ok.atoms.npz", st.published())
    with np.load(p, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(tmp_path / "leak.atoms.npz", **arrays, alpha=st.alpha)
    assert load_atoms(p).producer == "c0"
    with pytest.raises(FedalignError, match="unknown arrays.*alpha"):
        load_atoms(tmp_path / "leak.atoms.npz")


# --------------------------------------------------------------------------------- consensus
def test_consensus_is_the_max_over_weight_vectors_not_the_mean():
    """Two dictionaries equal in atom 1, atom 0 translated by s: W2(B(e_0)) = s exactly
    (a translation), W2(B(e_1)) = 0, so the max is s and the mean s/2."""
    rng = np.random.default_rng(0)
    m, v, z = rng.normal(size=(2, 3, 4)) * 3, rng.uniform(0.5, 1.5, (2, 3, 4)), rng.normal(size=(2, 3, 2))
    shift = np.zeros_like(m)
    shift[0] = [0.4, -0.3, 0.0, 0.0]      # |s| = 0.5
    W = np.array([[1.0, 0.0], [0.0, 1.0]])
    _, M = consensus_matrix({"a": (m, v, z), "b": (m + shift, v, z)}, W)
    assert M[0, 1] == pytest.approx(0.5, rel=1e-6)
    _, M1 = consensus_matrix({"a": (m, v, z), "b": (m + shift, v, z)}, W[1:])
    assert M1[0, 1] == pytest.approx(0.0, abs=1e-6)


# ------------------------------------------------------------------------ target classifier
def _two_labelings_state():
    """Atom 0 labels the component at +3 class 0 and at −3 class 1; atom 1 swaps them."""
    st = fresh_state(client="tgt", A=2, K=2, d=1, C=2)
    st.means = np.array([[[3.0], [-3.0]], [[3.0], [-3.0]]])
    st.variances = np.full((2, 2, 1), 0.25)
    big = 8.0
    st.label_logits = np.array([[[big, -big], [-big, big]], [[-big, big], [big, -big]]])
    return st


def test_target_classifier_uses_its_own_alpha():
    from fedalign.dadil.classifiers import accuracy, target_classifier

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    X = np.where(y == 0, 3.0, -3.0)[:, None] + 0.5 * rng.normal(size=(200, 1))
    st = _two_labelings_state()
    st.alpha = np.array([1.0, 0.0])
    assert accuracy(target_classifier(st, "map"), X, y) == 1.0
    st.alpha = np.array([0.0, 1.0])
    assert accuracy(target_classifier(st, "map"), X, y) == 0.0
    # a target with a received dictionary uses α re-fitted on it, not its own-steps α
    st.received = (st.means.copy(), st.variances.copy(), st.label_logits.copy())
    st.alpha, st.alpha_received = np.array([0.0, 1.0]), np.array([1.0, 0.0])
    assert accuracy(target_classifier(st, "map"), X, y) == 1.0

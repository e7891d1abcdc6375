"""fedalign.dadil.barycenter: vertices, closed forms, translations, determinism, the one GMM
builder; gradients through the frozen plans of the torch reference."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

import dadil_torch_reference as ref
from fedalign.errors import FedalignError
from fedalign.dadil.atoms import init_atoms
from fedalign.dadil.barycenter import LabeledBarycenter, atoms_barycenter, labeled_barycenter


def rand_atoms(rng, A=3, K=4, d=3, C=2):
    means = rng.normal(size=(A, K, d)) * 3
    variances = rng.uniform(0.3, 2.0, (A, K, d))
    labels = np.eye(C)[np.arange(K) % C][None].repeat(A, 0) * 0.8 + 0.2 / C
    return means, variances, labels


def sort_rows(*arrays):
    order = np.lexsort(arrays[0].T[::-1])
    return [a[order] for a in arrays]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_vertex_alpha_reproduces_atom(k):
    rng = np.random.default_rng(k)
    M, V, L = rand_atoms(rng)
    alpha = np.eye(3)[k]
    B = labeled_barycenter(alpha, M, V, L)
    assert isinstance(B, LabeledBarycenter) and B.converged
    got = sort_rows(B.means, B.variances, B.labels)
    want = sort_rows(M[k], V[k], L[k])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_single_component_is_gaussian_w2_barycenter():
    """K = 1: the barycenter of diagonal Gaussians (POT's Bures–Wasserstein barycenter)."""
    rng = np.random.default_rng(3)
    A, d = 3, 4
    M = rng.normal(size=(A, 1, d))
    V = rng.uniform(0.2, 3.0, (A, 1, d))
    L = np.ones((A, 1, 2)) / 2
    alpha = rng.dirichlet(np.ones(A))
    B = labeled_barycenter(alpha, M, V, L)
    ref_m, ref_C = ot.gaussian.bures_wasserstein_barycenter(
        M[:, 0], np.stack([np.diag(x) for x in V[:, 0]]), weights=alpha)
    np.testing.assert_allclose(B.means[0], ref_m, rtol=1e-10)
    np.testing.assert_allclose(np.diag(B.variances[0]), ref_C, rtol=1e-6, atol=1e-8)


def test_translated_atoms_give_translated_barycenter():
    rng = np.random.default_rng(4)
    K, d, C = 6, 2, 3
    base = rng.normal(size=(K, d)) * 10
    var = rng.uniform(0.5, 1.5, (K, d))
    shifts = rng.normal(size=(3, d)) * 0.3
    M = base[None] + shifts[:, None]
    V = var[None].repeat(3, 0)
    L = np.eye(C)[np.arange(K) % C][None].repeat(3, 0)
    alpha = np.array([0.2, 0.5, 0.3])
    B = labeled_barycenter(alpha, M, V, L)
    got = sort_rows(B.means, B.variances, B.labels)
    want = sort_rows(base + alpha @ shifts, var, L[0])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_twice_the_components_split_each_translated_component_in_two():
    """K_B = 2K on translated atoms: B is base + α·shift with every component twice (component
    j is atom component j mod K), and each atom component sends half its mass, 1/(2K), to each
    copy. The deterministic start has these means and stds but one-hot labels: the first
    iteration moves the labels only, the second finds the same plans and stops with no change."""
    rng = np.random.default_rng(5)
    A, K, d, C = 2, 4, 3, 2
    base = rng.normal(size=(K, d)) * 10
    var = rng.uniform(0.5, 1.5, (K, d))
    shifts = rng.normal(size=(A, d)) * 0.3
    M, V = base[None] + shifts[:, None], var[None].repeat(A, 0)
    L = (np.eye(C)[np.arange(K) % C] * 0.8 + 0.1)[None].repeat(A, 0)
    alpha = np.array([0.3, 0.7])
    B = labeled_barycenter(alpha, M, V, L, n_components=2 * K)
    j = np.arange(2 * K) % K
    np.testing.assert_allclose(B.means, base[j] + alpha @ shifts, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(B.variances, var[j], rtol=1e-12)
    np.testing.assert_allclose(B.labels, L[0, j], rtol=1e-12)
    split = (j[None, :] == np.arange(K)[:, None]) / (2 * K)
    for a in range(A):
        np.testing.assert_array_equal(B.plans[a], split)
    assert B.record() == dict(iterations=2, rel_change=0.0, converged=True)


def test_plans_are_optimal_to_b_and_b_is_their_projection():
    """Random atoms, K_B = 2K: every plan is an optimal transport plan from its atom to B for the
    labeled cost (POT's emd2 gives the same cost), and B is the α-weighted barycentric
    projection through the plans (means and standard deviations averaged)."""
    rng = np.random.default_rng(5)
    M, V, L = rand_atoms(rng, A=2, K=4, d=3, C=2)
    alpha = np.array([0.3, 0.7])
    B = labeled_barycenter(alpha, M, V, L, n_components=8)
    assert B.converged and B.rel_change <= 1e-6
    S, SB = np.sqrt(V), np.sqrt(B.variances)
    for a in range(2):
        feat = (((M[a][:, None] - B.means[None]) ** 2).sum(-1)
                + ((S[a][:, None] - SB[None]) ** 2).sum(-1))
        cost = feat + feat.max() * ((L[a][:, None] - B.labels[None]) ** 2).sum(-1)
        np.testing.assert_allclose(B.plans[a].sum(1), 1 / 4, rtol=1e-12)
        np.testing.assert_allclose(B.plans[a].sum(0), 1 / 8, rtol=1e-12)
        best = ot.emd2(np.full(4, 1 / 4), np.full(8, 1 / 8), cost)
        assert float((B.plans[a] * cost).sum()) == pytest.approx(best, rel=1e-6, abs=1e-9)
    W = 8 * alpha[:, None, None] * B.plans                              # (A, K, K_B)
    np.testing.assert_allclose(B.means, np.einsum("aij,aid->jd", W, M), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(SB, np.einsum("aij,aid->jd", W, S), rtol=1e-12)
    np.testing.assert_allclose(B.labels, np.einsum("aij,aic->jc", W, L), rtol=1e-12)
    np.testing.assert_allclose(B.labels.sum(1), 1.0, rtol=1e-12)


def test_deterministic_and_logits():
    atoms = init_atoms(3, 5, 4, 3, seed=1)
    atoms.label_logits = np.random.default_rng(0).normal(size=atoms.label_logits.shape)
    alpha = np.array([0.1, 0.6, 0.3])
    a = labeled_barycenter(alpha, atoms.means, atoms.variances, atoms.labels)
    b = labeled_barycenter(alpha, atoms.means, atoms.variances, atoms.label_logits,
                           labels_are_logits=True)
    for name in ("means", "variances", "labels"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12)
    g = atoms_barycenter(atoms, alpha)      # the one GMM builder, equal to the torch reference
    t = ref.labeled_barycenter(alpha, atoms.means, atoms.variances, atoms.labels)
    np.testing.assert_allclose(g.means, t[0].detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g.labels, t[2].detach().numpy(), rtol=1e-12, atol=1e-12)
    assert g.K == 5 and g.labels.shape == (5, 3) and g.meta["barycenter"]["converged"]


def test_gradcheck_through_frozen_plans():
    rng = np.random.default_rng(6)
    M, V, L = rand_atoms(rng, A=2, K=3, d=2, C=2)
    t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731

    def f(alpha, means, variances, labels):
        m, v, lab, _ = ref.labeled_barycenter(alpha, means, variances, labels)
        return m, v, lab

    assert torch.autograd.gradcheck(f, (t([0.4, 0.6]), t(M), t(V), t(L)), eps=1e-6, atol=1e-6)


# ------------------------------------------------------------------ mutation survivors (mutmut)
def test_softmax_is_scipys_on_large_logits_of_any_rank():
    from scipy.special import softmax as sp_softmax

    from fedalign.dadil.barycenter import softmax

    z = np.random.default_rng(0).normal(size=(3, 4, 5)) * 300 + np.arange(4)[:, None] * 1e3
    assert np.allclose(softmax(z), sp_softmax(z, axis=-1), rtol=1e-12, atol=0)
    assert np.all(np.isfinite(softmax(z)))


def test_feature_cost_of_a_point_to_itself_is_exactly_zero():
    from fedalign.dadil.barycenter import _Features

    rng = np.random.default_rng(1)
    M, S = rng.normal(size=(2, 3, 4)), rng.uniform(0.1, 1, size=(2, 3, 4))
    Q = np.zeros((6, 3))                   # B = atom 0's components: Xᴮ = Qᵀ X
    Q[np.arange(3), np.arange(3)] = 1.0
    C = _Features(M, S).cost(Q)
    assert C.shape == (2, 3, 3) and np.all(np.diag(C[0]) == 0.0) and np.all(C >= 0.0)
    brute = ((M[1][:, None] - M[0][None]) ** 2).sum(-1) + ((S[1][:, None] - S[0][None]) ** 2).sum(-1)
    assert np.allclose(C[1], brute, rtol=1e-10)


def test_feature_cost_of_a_weighted_barycenter_is_the_brute_force_one():
    """The Gram form's cost of Xᴮ = Qᵀ X equals the cost formed in feature space."""
    from fedalign.dadil.barycenter import _Features

    rng = np.random.default_rng(2)
    M, S = rng.normal(size=(3, 4, 7)), rng.uniform(0.1, 1, size=(3, 4, 7))
    Q = rng.dirichlet(np.ones(12), size=5).T                       # (A·K, K_B), K_B = 5
    f = _Features(M, S)
    mB, sB = Q.T @ M.reshape(12, 7), Q.T @ S.reshape(12, 7)
    brute = ((M[..., None, :] - mB) ** 2).sum(-1) + ((S[..., None, :] - sB) ** 2).sum(-1)
    assert np.allclose(f.cost(Q), brute, rtol=1e-10, atol=1e-12)
    assert np.isclose(f.sq_norm(Q), (mB**2).sum() + (sB**2).sum(), rtol=1e-12)


@pytest.mark.parametrize("bad", ["means2d", "variances", "labels2d", "labels_k", "alpha"])
def test_every_shape_disagreement_is_refused_naming_all_shapes(bad):
    from fedalign.dadil.barycenter import labeled_barycenter

    a, m, v, L = np.full(2, 0.5), np.zeros((2, 3, 4)), np.ones((2, 3, 4)), np.full((2, 3, 2), 0.5)
    if bad == "means2d":
        m, v = m[0], v[0]
    elif bad == "variances":
        v = np.ones((2, 3, 5))
    elif bad == "labels2d":
        L = L[0]
    elif bad == "labels_k":
        L = np.full((2, 4, 2), 0.5)
    else:
        a = np.full(3, 1 / 3)
    with pytest.raises(FedalignError) as e:
        labeled_barycenter(a, m, v, L)
    msg = str(e.value)
    for x in (a, m, v, L):
        assert str(tuple(x.shape)) in msg


def test_atoms_barycenter_gmm_float64_simplex_labels_names_and_record():
    from fedalign.dadil.atoms import Atoms
    from fedalign.dadil.barycenter import atoms_barycenter

    rng = np.random.default_rng(2)
    atoms = Atoms(rng.normal(size=(2, 4, 3)).astype(np.float32),
                  rng.uniform(0.5, 1, size=(2, 4, 3)).astype(np.float32),
                  (rng.normal(size=(2, 4, 2)) * 3).astype(np.float32))
    g = atoms_barycenter(atoms, np.array([0.3, 0.7]), class_names=["a", "b"])
    assert g.means.dtype == np.float64 and g.means.shape == (4, 3)
    assert np.all(g.labels >= 0) and np.allclose(g.labels.sum(1), 1.0, rtol=0, atol=1e-12)
    assert list(g.class_names) == ["a", "b"]
    rec = g.meta["barycenter"]
    assert rec["converged"] and rec["rel_change"] <= 1e-6


def _reference_fixed_point(alpha, M, S, L, KB, n_iter):
    """The fixed point written out with POT (independent of fedalign's code): per iteration the
    plans (feature cost + max(cost)·label cost, uniform weights), the projection and
    ‖ΔB‖/‖B‖; returns the list of relative changes."""
    A, K, _ = M.shape
    C = L.shape[2]
    idx = np.arange(KB) % K
    mB, sB = np.einsum("a,ajd->jd", alpha, M[:, idx]), np.einsum("a,ajd->jd", alpha, S[:, idx])
    LB = np.zeros((KB, C))
    LB[np.arange(KB), np.arange(KB) % C] = 1.0
    rels = []
    for _ in range(n_iter):
        P = []
        for a in range(A):
            cost = ((M[a][:, None] - mB[None]) ** 2).sum(-1) + ((S[a][:, None] - sB[None]) ** 2).sum(-1)
            cost = cost + cost.max() * ((L[a][:, None] - LB[None]) ** 2).sum(-1)
            P.append(ot.emd(np.full(K, 1 / K), np.full(KB, 1 / KB), cost))
        new = [KB * sum(alpha[a] * P[a].T @ X[a] for a in range(A)) for X in (M, S, L)]
        num = sum(((n - o) ** 2).sum() for n, o in zip(new, (mB, sB, LB)))
        rels.append(float(np.sqrt(num / sum((n ** 2).sum() for n in new))))
        mB, sB, LB = new
    return rels


def test_fixed_point_record_counts_iterations_and_relative_change_like_a_reference():
    from fedalign.dadil.barycenter import barycenter_plans

    rng = np.random.default_rng(0)
    M, S = rng.normal(size=(3, 6, 3)), rng.uniform(0.2, 1.0, size=(3, 6, 3))
    L = np.eye(2)[rng.integers(0, 2, (3, 6))] * 0.8 + 0.1
    alpha = np.array([0.2, 0.3, 0.5])
    rels = _reference_fixed_point(alpha, M, S, L, 6, 4)
    assert rels[0] > rels[1] > 0                     # the fixture moves for more than one step
    _, rec = barycenter_plans(alpha, M, S, L, 6, tol=1e-12, max_iter=1)
    assert rec == dict(iterations=1, rel_change=pytest.approx(rels[0], rel=1e-9), converged=False)
    tol = 0.5 * (rels[0] + rels[1])                  # met at the second iteration, not the first
    _, rec = barycenter_plans(alpha, M, S, L, 6, tol=tol, max_iter=50)
    assert rec == dict(iterations=2, rel_change=pytest.approx(rels[1], rel=1e-9), converged=True)
    _, rec = barycenter_plans(alpha, M, S, L, 6, tol=rels[1], max_iter=50)   # ≤ tol, not < tol
    assert rec["iterations"] == 2 and rec["converged"]


def test_barycentric_weights_must_lie_on_the_simplex():
    from fedalign.dadil.barycenter import SIMPLEX_ATOL, check_simplex

    atoms = init_atoms(3, 2, 2, 2, seed=0)
    for bad in ([2.0, -1.0, 0.0], [0.3, 0.3, 0.3], [np.inf, 0.0, 0.0], [], [[1.0]]):
        with pytest.raises(FedalignError, match="^alpha must be nonnegative weights summing to 1"):
            atoms_barycenter(atoms, bad)
    ok = np.array([0.5, 0.5 + SIMPLEX_ATOL, -SIMPLEX_ATOL])  # round-off of a projected step
    np.testing.assert_array_equal(check_simplex(ok), ok)
    check_simplex([0.5, 0.5 + 2 * SIMPLEX_ATOL, 0.0])  # the sum's slack grows with A
    with pytest.raises(FedalignError) as e:
        check_simplex([1 / 3, 1 / 3, 0.5], "alpha_T")
    assert str(e.value) == "alpha_T must be nonnegative weights summing to 1, got [0.3333 0.3333 0.5   ]"
    assert check_simplex([0, 1, 0]).dtype == np.float64


@pytest.mark.parametrize("kw, msg", [
    (dict(max_iter=0), "max_iter must be an integer ≥ 1, got 0"),
    (dict(max_iter=-3), "max_iter must be an integer ≥ 1, got -3"),
    (dict(max_iter=2.5), "max_iter must be an integer ≥ 1, got 2.5"),
    (dict(max_iter=True), "max_iter must be an integer ≥ 1, got True"),
    (dict(max_iter="10"), "max_iter must be an integer ≥ 1, got '10'"),
    (dict(n_components=0), "n_components must be an integer ≥ 1, got 0"),
    (dict(n_components=1.0), "n_components must be an integer ≥ 1, got 1.0"),
    (dict(tol=-1e-6), "tol must be a finite number ≥ 0, got -1e-06"),
    (dict(tol=float("nan")), "tol must be a finite number ≥ 0, got nan"),
    (dict(tol="1e-6"), "tol must be a finite number ≥ 0, got '1e-6'"),
])
def test_fixed_point_settings_are_checked_with_one_error(kw, msg):
    """max_iter = 0 ended in an AttributeError (no plans), n_components = 0 meant K."""
    atoms = init_atoms(2, 3, 2, 2, seed=0)
    with pytest.raises(FedalignError) as e:
        labeled_barycenter(np.ones(2) / 2, atoms.means, atoms.variances, atoms.label_logits,
                           labels_are_logits=True, **kw)
    assert str(e.value) == msg


def test_one_fixed_point_iteration_and_integer_types_of_numpy():
    atoms = init_atoms(2, 3, 2, 2, seed=0)
    args = (np.ones(2) / 2, atoms.means, atoms.variances, atoms.label_logits)
    one = labeled_barycenter(*args, labels_are_logits=True, max_iter=1, tol=0)
    assert one.iterations == 1 and not one.converged and one.plans.shape == (2, 3, 3)
    four = labeled_barycenter(*args, labels_are_logits=True, n_components=np.int64(4),
                              max_iter=np.int32(50), tol=np.float32(1e-6))
    assert four.means.shape == (4, 2) and four.converged

"""fedalign.dadil.barycenter: vertices, closed forms, translations, determinism, the one GMM
builder; gradients through the frozen plans of the torch reference."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

import dadil_torch_reference as ref
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


def test_shapes_n_components_and_simplex_labels():
    rng = np.random.default_rng(5)
    M, V, L = rand_atoms(rng, A=2, K=4, d=3, C=2)
    B = labeled_barycenter([0.3, 0.7], M, V, L, n_components=8)
    assert B.means.shape == (8, 3) and B.variances.shape == (8, 3) and B.labels.shape == (8, 2)
    np.testing.assert_allclose(B.labels.sum(1), 1.0, rtol=1e-12)
    assert float(B.variances.min()) >= V.min() - 1e-12
    assert B.plans.shape == (2, 4, 8)
    assert B.record() == dict(iterations=B.iterations, rel_change=B.rel_change, converged=True)


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

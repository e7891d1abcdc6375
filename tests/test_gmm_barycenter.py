"""fedalign.gmm_barycenter: vertices, closed forms, translations, gradients, determinism."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

from fedalign.dictionary import init_atoms
from fedalign.gmm_barycenter import barycenter_gmm, labeled_barycenter


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
    m, v, lab, info = labeled_barycenter(alpha, M, V, L)
    assert info["converged"]
    got = sort_rows(m.detach().numpy(), v.detach().numpy(), lab.detach().numpy())
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
    m, v, _, _ = labeled_barycenter(alpha, M, V, L)
    ref_m, ref_C = ot.gaussian.bures_wasserstein_barycenter(
        M[:, 0], np.stack([np.diag(x) for x in V[:, 0]]), weights=alpha)
    np.testing.assert_allclose(m.detach().numpy()[0], ref_m, rtol=1e-10)
    np.testing.assert_allclose(np.diag(v.detach().numpy()[0]), ref_C, rtol=1e-6, atol=1e-8)


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
    m, v, lab, _ = labeled_barycenter(alpha, M, V, L)
    got = sort_rows(m.detach().numpy(), v.detach().numpy(), lab.detach().numpy())
    want = sort_rows(base + alpha @ shifts, var, L[0])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_shapes_n_components_and_simplex_labels():
    rng = np.random.default_rng(5)
    M, V, L = rand_atoms(rng, A=2, K=4, d=3, C=2)
    m, v, lab, info = labeled_barycenter([0.3, 0.7], M, V, L, n_components=8)
    assert m.shape == (8, 3) and v.shape == (8, 3) and lab.shape == (8, 2)
    np.testing.assert_allclose(lab.detach().sum(1).numpy(), 1.0, rtol=1e-12)
    assert float(v.min()) >= V.min() - 1e-12
    assert info["plans"].shape == (2, 4, 8)


def test_deterministic_and_logits():
    atoms = init_atoms(3, 5, 4, 3, seed=1)
    atoms.label_logits = np.random.default_rng(0).normal(size=atoms.label_logits.shape)
    alpha = np.array([0.1, 0.6, 0.3])
    a = labeled_barycenter(alpha, atoms.means, atoms.variances, atoms.labels)
    b = labeled_barycenter(alpha, atoms.means, atoms.variances, atoms.label_logits,
                           labels_are_logits=True)
    for x, y in zip(a[:3], b[:3]):
        np.testing.assert_allclose(x.detach().numpy(), y.detach().numpy(), rtol=1e-12)
    g = barycenter_gmm(alpha, atoms)  # the numpy path: equal to the torch path
    np.testing.assert_allclose(g.means, a[0].detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g.labels, a[2].detach().numpy(), rtol=1e-12, atol=1e-12)
    assert g.K == 5 and g.labels.shape == (5, 3)


def test_gradcheck_through_frozen_plans():
    rng = np.random.default_rng(6)
    M, V, L = rand_atoms(rng, A=2, K=3, d=2, C=2)
    t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731

    def f(alpha, means, variances, labels):
        m, v, lab, _ = labeled_barycenter(alpha, means, variances, labels)
        return m, v, lab

    assert torch.autograd.gradcheck(f, (t([0.4, 0.6]), t(M), t(V), t(L)), eps=1e-6, atol=1e-6)

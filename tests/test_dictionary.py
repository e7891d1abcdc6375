"""fedalign.dictionary: simplex projection, Adam, local steps, centralized GMM-DaDiL toy."""

from __future__ import annotations

import numpy as np
import pytest

from fedalign.dictionary import (AdamState, Atoms, adam_update, init_atoms, learn_dictionary,
                                 local_steps, project_simplex)
from fedalign.errors import FedalignError
from fedalign.gmm import fit_gmm, map_predict, train_head_from_gmm
from fedalign.gmm_barycenter import barycenter_gmm


def test_project_simplex_optimality():
    rng = np.random.default_rng(0)
    V = rng.normal(size=(50, 5)) * 2
    P = project_simplex(V)
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-12)
    assert P.min() >= 0
    # KKT: ⟨v − p, q − p⟩ ≤ 0 for every vertex q of the simplex
    for v, p in zip(V, P):
        assert np.all((np.eye(5) - p) @ (v - p) <= 1e-10)
    x = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_simplex(x), x, rtol=1e-12)
    np.testing.assert_allclose(project_simplex([5.0, 0.0, 0.0]), [1.0, 0.0, 0.0])


def test_adam_closed_forms_and_roundtrip():
    """Adam's bias-corrected step is lr·g/(|g| + ε) for a constant gradient g, at every step."""
    g = np.array([[3.0, -0.5], [1e-3, -2e2]])
    p = {"means": np.zeros((2, 2))}
    st = AdamState()
    for t in range(1, 6):
        adam_update(p, {"means": g}, st, 0.1)
        np.testing.assert_allclose(p["means"], -t * 0.1 * g / (np.abs(g) + 1e-8), rtol=1e-9)
    # a changed gradient: m̂ / √v̂ by the formula after two steps
    g2 = -2 * g
    adam_update(p, {"means": g2}, st, 0.1)
    b1, b2 = 0.9, 0.999
    m = b1 * (1 - b1**5) * g + (1 - b1) * g2
    v = b2 * (1 - b2**5) * g * g + (1 - b2) * g2 * g2
    step = 0.1 * (m / (1 - b1 ** 6)) / (np.sqrt(v / (1 - b2 ** 6)) + 1e-8)
    np.testing.assert_allclose(p["means"], -5 * 0.1 * g / (np.abs(g) + 1e-8) - step, rtol=1e-9)
    st2 = AdamState.from_arrays(st.to_arrays())
    assert st2.step == 6
    np.testing.assert_array_equal(st2.exp_avg_sq["means"], st.exp_avg_sq["means"])


def _domain(seed, C=3, d=4, n=150, shift=0.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    X = np.eye(C, d)[y] * 4 + rng.normal(size=(n, d)) + shift
    return X, y


def test_local_steps_decrease_loss_and_respect_constraints():
    X, y = _domain(2)
    g = fit_gmm(X, y, components_per_class=2)
    atoms = init_atoms(3, 6, 4, 3, seed=0)
    alpha = np.full(3, 1 / 3)
    a1, al1, st, losses = local_steps(atoms, alpha, g, 10, lr=0.2, min_var=0.5)
    assert len(losses) == 10 and losses[-1] < 0.6 * losses[0]
    assert a1.variances.min() >= 0.5 and np.all(al1 >= 0) and al1.sum() == pytest.approx(1.0)
    np.testing.assert_array_equal(atoms.means, init_atoms(3, 6, 4, 3, seed=0).means)  # not modified
    # deterministic, and resuming with the saved state equals one long run
    a2, al2, _, losses2 = local_steps(atoms, alpha, g, 10, lr=0.2, min_var=0.5)
    np.testing.assert_array_equal(a1.means, a2.means)
    assert losses == losses2
    h1 = local_steps(atoms, alpha, g, 4, lr=0.2, min_var=0.5)
    h2 = local_steps(h1[0], h1[1], g, 6, lr=0.2, min_var=0.5, optim_state=h1[2].to_arrays())
    np.testing.assert_allclose(h2[0].means, a1.means, rtol=1e-12)
    assert h2[2].step == 10


def test_local_steps_unlabeled_leaves_labels_alone():
    X, _ = _domain(3)
    g = fit_gmm(X, None, components_per_class=2, n_classes=3)
    atoms = init_atoms(2, 6, 4, 3, seed=1)
    atoms.label_logits[:] = np.random.default_rng(0).normal(size=atoms.label_logits.shape)
    a1, _, _, losses = local_steps(atoms, [0.5, 0.5], g, 10)
    assert losses[-1] < losses[0]
    np.testing.assert_array_equal(a1.label_logits, atoms.label_logits)
    with pytest.raises(FedalignError, match="labeled loss needs"):
        local_steps(atoms, [0.5, 0.5], g, 1, labeled=True)
    with pytest.raises(FedalignError, match="d=5"):
        local_steps(init_atoms(2, 6, 5, 3), [0.5, 0.5], g, 1)
    with pytest.raises(FedalignError, match="alpha"):
        local_steps(atoms, [1.0], g, 1)


def test_closed_form_gradients_equal_autograd():
    from fedalign.dictionary import _grads, _tensors, domain_loss, domain_loss_and_grads
    from fedalign.gmm import GMM

    rng = np.random.default_rng(4)
    atoms = init_atoms(3, 6, 4, 3, seed=2)
    p = dict(means=atoms.means, variances=rng.uniform(0.3, 2, atoms.variances.shape),
             label_logits=rng.normal(size=atoms.label_logits.shape), alpha=np.array([0.2, 0.5, 0.3]))
    for labeled in (True, False):
        g = GMM(rng.dirichlet(np.ones(5)), rng.normal(size=(5, 4)), rng.uniform(0.3, 2, (5, 4)),
                np.eye(3)[rng.integers(0, 3, 5)] if labeled else None)
        loss, grads = domain_loss_and_grads(p, g, labeled)
        t = _tensors(p)
        loss_t, _ = domain_loss(t["alpha"], t["means"], t["variances"], t["label_logits"], g, labeled)
        ref = _grads(loss_t, t)
        assert loss == pytest.approx(float(loss_t.detach()), rel=1e-12)
        for name in ref:
            np.testing.assert_allclose(grads[name], ref[name], rtol=1e-9, atol=1e-12)
    X, y = _domain(5)
    g = fit_gmm(X, y, components_per_class=2)
    a = local_steps(atoms, [0.3, 0.3, 0.4], g, 3, backend="numpy")
    b = local_steps(atoms, [0.3, 0.3, 0.4], g, 3, backend="torch")
    np.testing.assert_allclose(a[0].means, b[0].means, rtol=1e-9)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-9, atol=1e-12)


def rotated_blobs(angle, n=240, seed=0, sd=0.5, pivot_distance=20.0):
    """Three classes on a line, rotated by ``angle`` degrees about a distant pivot (0, −R)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = np.stack([3.0 * y - 3.0, np.zeros(n)], 1) + sd * rng.standard_normal((n, 2))
    a = np.deg2rad(angle)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    p = np.array([0.0, -pivot_distance])
    return (X - p) @ rot.T + p, y


def test_rotated_blobs_dictionary_beats_source_only():
    """Sources rotated by −20°, 20°, 40°, target 0°: pooled source-only fails, GMM-DaDiL recovers."""
    from sklearn.linear_model import LogisticRegression

    doms = [rotated_blobs(a, seed=i) for i, a in enumerate([-20, 20, 40, 0])]
    Xt, yt = doms[3]
    gmms = [fit_gmm(X, y if i < 3 else None, components_per_class=2, n_classes=3)
            for i, (X, y) in enumerate(doms)]
    Xs = np.concatenate([X for X, _ in doms[:3]])
    ys = np.concatenate([y for _, y in doms[:3]])
    source_only = LogisticRegression().fit(Xs, ys).score(Xt, yt)
    atoms, alphas, hist = learn_dictionary(gmms, 3, n_atoms=3, n_iter=40, lr=0.1, init="sources")
    assert isinstance(atoms, Atoms) and alphas.shape == (4, 3)
    np.testing.assert_allclose(alphas.sum(1), 1.0)
    assert hist["loss"][-1] < 0.05 * hist["loss"][0]
    B = barycenter_gmm(alphas[3], atoms)
    map_acc = (map_predict(B, Xt) == yt).mean()
    head_acc = train_head_from_gmm(B, n_per_class=200).score(Xt, yt)
    assert map_acc >= 0.9 and head_acc >= 0.9
    assert source_only <= 0.6

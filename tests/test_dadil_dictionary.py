"""fedalign.dadil dictionary learning: simplex projection, Adam, local steps, the closed-form
gradients against torch autograd (tests/dadil_torch_reference.py), centralized GMM-DaDiL toy."""

from __future__ import annotations

import numpy as np
import pytest

import dadil_torch_reference as ref
from fedalign.dadil.atoms import Atoms, init_atoms, project_simplex
from fedalign.dadil.barycenter import atoms_barycenter
from fedalign.dadil.dictionary import learn_dictionary, local_steps
from fedalign.dadil.optim import AdamState, Optim, adam_update
from fedalign.errors import FedalignError
from fedalign.gmm import GMM, fit_gmm, map_predict
from fedalign.gmm_head import train_head_from_gmm


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
    for optim in (Optim(var_floor=0.5), Optim("adam", 0.2, "projected", var_floor=0.5)):
        s1 = local_steps(atoms, alpha, g, 10, optim)
        a1, al1, losses = s1.atoms, s1.alpha, s1.losses
        assert len(losses) == 10 and losses[-1] < 0.6 * losses[0]
        assert a1.variances.min() >= 0.5 and np.all(al1 >= 0) and al1.sum() == pytest.approx(1.0)
        assert len(s1.alphas) == 11 and len(s1.step_mean) == 10
        assert list(s1.record) == ["losses", "alpha", "step_mean", "step_std"]
        assert s1.record["alpha"] is s1.alphas
        np.testing.assert_array_equal(atoms.means, init_atoms(3, 6, 4, 3, seed=0).means)
        s2 = local_steps(atoms, alpha, g, 10, optim)                  # deterministic
        np.testing.assert_array_equal(a1.means, s2.atoms.means)
        assert losses == s2.losses
    # Adam restarts at every call: 4 + 6 steps differ from 10 steps (the moments are reset)
    opt = Optim("adam", 0.2, "projected", var_floor=0.5)
    h1 = local_steps(atoms, alpha, g, 4, opt)
    h2 = local_steps(h1.atoms, h1.alpha, g, 6, opt)
    one = local_steps(atoms, alpha, g, 10, opt)
    assert not np.allclose(h2.atoms.means, one.atoms.means)
    fresh = local_steps(h1.atoms, h1.alpha, g, 1, opt)            # first Adam step: lr·sign(g)
    moved = np.abs(fresh.atoms.means - h1.atoms.means)
    np.testing.assert_allclose(moved[moved > 1e-6], 0.2, rtol=1e-4)   # |g| ≫ Adam's ε


def test_gd_step_removes_lr_of_the_residual():
    """One atom, one component, the barycenter is the atom: Δm = −lr (m − target)."""
    g = GMM(np.ones(1), np.array([[3.0, -1.0]]), np.array([[4.0, 0.25]]), np.eye(2)[[0]])
    atoms = Atoms(np.zeros((1, 1, 2)), np.ones((1, 1, 2)), np.zeros((1, 1, 2)))
    steps = local_steps(atoms, [1.0], g, 1, Optim(lr=0.3, var_floor=1e-6))
    a1 = steps.atoms
    np.testing.assert_allclose(a1.means[0, 0], 0.3 * np.array([3.0, -1.0]), rtol=1e-12)
    np.testing.assert_allclose(np.sqrt(a1.variances[0, 0]), 1 + 0.3 * (np.array([2.0, 0.5]) - 1),
                               rtol=1e-12)
    feature = 9 + 1 + 1 + 0.25                       # ‖Δm‖² + ‖Δs‖²
    assert steps.losses[0] == pytest.approx(feature * (1 + 0.5))   # + β‖V − (½, ½)‖², β = max


def test_alpha_rules_move_alpha_to_the_true_weights():
    """Target = B((0.8, 0.2); atoms): every rule recovers α although ∇α has one sign."""
    from fedalign.dadil.dictionary import fit_alpha
    from fedalign.dadil.gradients import domain_loss_and_grads
    from fedalign.dadil.optim import ALPHA_RULES, alpha_update

    rng = np.random.default_rng(0)
    M = rng.normal(size=(2, 3, 4)) * 3 + 20          # far from 0: a large common part of ∇α
    atoms = Atoms(M, np.full((2, 3, 4), 0.5), np.zeros((2, 3, 2)))
    B = atoms_barycenter(atoms, np.array([0.8, 0.2]))
    Bu = GMM(B.weights, B.means, B.variances)
    _, grads = domain_loss_and_grads(dict(means=M, variances=atoms.variances,
                                          label_logits=atoms.label_logits,
                                          alpha=np.array([0.5, 0.5])), Bu, False)
    assert np.all(grads["alpha"] < 0) or np.all(grads["alpha"] > 0)   # one sign: Adam stalls
    fit = fit_alpha(atoms, Bu, 300, labeled=False, rule="newton")
    np.testing.assert_allclose(fit.alpha, [0.8, 0.2], atol=1e-6)
    assert fit.loss < 1e-9 * fit.losses[0] and fit.converged
    assert fit.loss == fit.losses[-1] and len(fit.alphas) == len(fit.losses)
    # the loss jumps where the barycenter's plans change (here between α₀ = 0.5 and 0.6), so
    # the local rules (projected, eg) may stop before the bump; every accepted step descends
    for rule in ALPHA_RULES:
        fit = fit_alpha(atoms, Bu, 50, labeled=False, rule=rule)
        assert np.all(np.diff(fit.losses) <= 1e-12)
    # Adam on α then projection: equal steps, removed by the projection
    st = AdamState()
    p = {"alpha": np.array([0.5, 0.5])}
    adam_update(p, {"alpha": grads["alpha"]}, st, 0.1)
    np.testing.assert_allclose(project_simplex(p["alpha"]), [0.5, 0.5], atol=1e-6)
    with pytest.raises(FedalignError, match="alpha rule"):
        alpha_update(np.array([0.5, 0.5]), grads["alpha"], None, "sgd", 0.1)


def test_local_steps_unlabeled_leaves_labels_alone():
    X, _ = _domain(3)
    g = fit_gmm(X, None, components_per_class=2, n_classes=3)
    atoms = init_atoms(2, 6, 4, 3, seed=1)
    atoms.label_logits[:] = np.random.default_rng(0).normal(size=atoms.label_logits.shape)
    s1 = local_steps(atoms, [0.5, 0.5], g, 10)
    assert s1.losses[-1] < s1.losses[0]
    np.testing.assert_array_equal(s1.atoms.label_logits, atoms.label_logits)
    s2 = local_steps(atoms, [0.5, 0.5], g, 3, update_atoms=False)   # α only
    np.testing.assert_array_equal(s2.atoms.means, atoms.means)
    assert not np.allclose(s2.alpha, [0.5, 0.5])
    with pytest.raises(FedalignError, match="labeled loss needs"):
        local_steps(atoms, [0.5, 0.5], g, 1, labeled=True)
    with pytest.raises(FedalignError, match="d=5"):
        local_steps(init_atoms(2, 6, 5, 3), [0.5, 0.5], g, 1)
    with pytest.raises(FedalignError, match="alpha"):
        local_steps(atoms, [1.0], g, 1)
    with pytest.raises(FedalignError, match="optimizer"):
        Optim("sgd")


def test_default_steps_are_scale_free():
    """Features × s + c: the fedalign steps give atoms × s + c and the same α (exactly)."""
    X, y = _domain(2)
    s, c = 0.02, 0.1
    out = []
    for Xs in (X, X * s + c):
        g = fit_gmm(Xs, y, components_per_class=2)
        from fedalign.dadil.atoms import data_moments, relative_floor

        mu, var = data_moments(g)
        atoms = init_atoms(3, 6, 4, 3, seed=0, center=mu, scale=np.sqrt(var))
        out.append(local_steps(atoms, np.full(3, 1 / 3), g, 8,
                               Optim(var_floor=relative_floor(g, 1e-2))))
    # equal up to EM's own tolerance (the GMM fits are scale-equivariant to ~1e-5 relative)
    np.testing.assert_allclose(out[1].atoms.means, out[0].atoms.means * s + c, rtol=0,
                               atol=2e-4 * s)
    np.testing.assert_allclose(out[1].alpha, out[0].alpha, atol=1e-4)
    np.testing.assert_allclose(out[1].losses, np.array(out[0].losses) * s * s, rtol=1e-4)


def test_closed_form_gradients_equal_autograd(monkeypatch):
    import fedalign.dadil.dictionary as dictionary
    from fedalign.dadil.gradients import domain_loss_and_grads

    rng = np.random.default_rng(4)
    atoms = init_atoms(3, 6, 4, 3, seed=2)
    p = dict(means=atoms.means, variances=rng.uniform(0.3, 2, atoms.variances.shape),
             label_logits=rng.normal(size=atoms.label_logits.shape), alpha=np.array([0.2, 0.5, 0.3]))
    for labeled in (True, False):
        g = GMM(rng.dirichlet(np.ones(5)), rng.normal(size=(5, 4)), rng.uniform(0.3, 2, (5, 4)),
                np.eye(3)[rng.integers(0, 3, 5)] if labeled else None)
        loss, grads = domain_loss_and_grads(p, g, labeled)
        t = ref.tensors(p)
        loss_t = ref.domain_loss(t["alpha"], t["means"], t["variances"], t["label_logits"], g,
                                 labeled)
        want = ref.grads(loss_t, t)
        assert loss == pytest.approx(float(loss_t.detach()), rel=1e-12)
        for name in want:
            np.testing.assert_allclose(grads[name], want[name], rtol=1e-9, atol=1e-12)
    X, y = _domain(5)
    g = fit_gmm(X, y, components_per_class=2)
    a = local_steps(atoms, [0.3, 0.3, 0.4], g, 3)
    monkeypatch.setattr(dictionary, "_loss_grads", ref.loss_grads)   # autograd steps
    b = local_steps(atoms, [0.3, 0.3, 0.4], g, 3)
    np.testing.assert_allclose(a.losses, b.losses, rtol=1e-9)
    np.testing.assert_allclose(a.atoms.means, b.atoms.means, rtol=1e-9)
    np.testing.assert_allclose(a.alpha, b.alpha, rtol=1e-9, atol=1e-12)


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
    learned = learn_dictionary(gmms, 3, n_atoms=3, n_iter=40, init="sources")
    atoms, alphas = learned.atoms, learned.alphas
    assert isinstance(atoms, Atoms) and alphas.shape == (4, 3)
    np.testing.assert_allclose(alphas.sum(1), 1.0)
    assert learned.losses[-1] < 0.05 * learned.losses[0]
    assert learned.history == dict(loss=learned.losses, domain_losses=learned.domain_losses)
    assert len(learned.domain_losses) == 40 and len(learned.domain_losses[0]) == 4
    B = atoms_barycenter(atoms, alphas[3])
    map_acc = (map_predict(B, Xt) == yt).mean()
    head_acc = train_head_from_gmm(B, n_per_class=200).score(Xt, yt)
    assert map_acc >= 0.9 and head_acc >= 0.9
    assert source_only <= 0.6


def test_simplex_qp_by_faces_equals_an_independent_solver():
    """The exact face-enumeration QP against scipy's SLSQP from many starts (independent)."""
    from scipy.optimize import minimize

    from fedalign.dadil.optim import _qp_simplex

    rng = np.random.default_rng(3)
    for _ in range(40):
        A = int(rng.integers(2, 6))
        R = rng.standard_normal((A, int(rng.integers(1, A + 2)))) * 10 ** rng.uniform(-2, 3)
        G = R @ R.T
        b = rng.standard_normal(A) * 10 ** rng.uniform(-2, 3)

        def f(x):
            return x @ G @ x - 2 * b @ x

        x = _qp_simplex(G, b, np.full(A, 1.0 / A))
        assert x.min() >= 0 and abs(x.sum() - 1) < 1e-12
        best = min(f(project_simplex(minimize(  # made exactly feasible before comparing
            f, x0, jac=lambda z: 2 * G @ z - 2 * b, method="SLSQP", bounds=[(0, 1)] * A,
            tol=1e-14, constraints=[dict(type="eq", fun=lambda z: z.sum() - 1)]).x))
            for x0 in rng.dirichlet(np.ones(A), size=5))
        assert f(x) <= best + 1e-9 * (abs(best) + np.abs(G).max() + np.abs(b).max())

"""fedalign.dadil.distances: oracles against POT's GMM-OT, identities; the envelope-theorem
gradients of the torch reference (tests/dadil_torch_reference.py)."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

import dadil_torch_reference as ref
from fedalign.dadil.distances import diag_w2_cost, gmm_mw2, mixture_cost, mw2, ot_plan
from fedalign.gmm import GMM


def rand_gmm(rng, K, d, C=None):
    labels = rng.dirichlet(np.ones(C), size=K) if C else None
    return (rng.dirichlet(np.ones(K)), rng.normal(size=(K, d)), rng.uniform(0.2, 2.0, (K, d)), labels)


def full(v):
    return np.stack([np.diag(x) for x in v])


def test_component_cost_matches_pot_bures():
    rng = np.random.default_rng(0)
    _, m1, v1, _ = rand_gmm(rng, 4, 3)
    _, m2, v2, _ = rand_gmm(rng, 5, 3)
    ref = ot.gmm.dist_bures_squared(m1, m2, full(v1), full(v2))
    np.testing.assert_allclose(diag_w2_cost(m1, v1, m2, v2), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("K1,K2,d", [(3, 3, 2), (4, 6, 5), (7, 2, 3)])
def test_mw2_matches_pot_gmm_ot_loss(K1, K2, d):
    rng = np.random.default_rng(K1 * 10 + K2)
    w1, m1, v1, _ = rand_gmm(rng, K1, d)
    w2, m2, v2, _ = rand_gmm(rng, K2, d)
    ref = ot.gmm.gmm_ot_loss(m1, m2, full(v1), full(v2), w1, w2)
    val, plan = mw2(w1, m1, v1, w2, m2, v2, return_plan=True)
    assert float(val) == pytest.approx(ref, rel=1e-10)
    ref_plan = ot.gmm.gmm_ot_plan(m1, m2, full(v1), full(v2), w1, w2)
    np.testing.assert_allclose(plan, ref_plan, atol=1e-12)
    np.testing.assert_allclose(plan.sum(1), w1, atol=1e-12)


def test_mw2_identity_symmetry_and_triangle():
    rng = np.random.default_rng(1)
    P = rand_gmm(rng, 5, 3, C=2)
    Q = rand_gmm(rng, 4, 3, C=2)
    R = rand_gmm(rng, 6, 3, C=2)
    assert float(mw2(*P[:3], *P[:3])) == pytest.approx(0.0, abs=1e-12)
    assert float(mw2(*P[:3], *P[:3], P[3], P[3])) == pytest.approx(0.0, abs=1e-12)
    pq = float(mw2(*P[:3], *Q[:3]))
    assert pq == pytest.approx(float(mw2(*Q[:3], *P[:3])), rel=1e-12)
    qr, pr = float(mw2(*Q[:3], *R[:3])), float(mw2(*P[:3], *R[:3]))
    assert np.sqrt(pr) <= np.sqrt(pq) + np.sqrt(qr) + 1e-12   # MW2 is a metric
    # a Dirac-weight mixture: MW2 equals the W2² of two Gaussians in closed form
    one = (np.ones(1), P[1][:1], P[2][:1])
    two = (np.ones(1), Q[1][:1], Q[2][:1])
    w2 = np.sum((P[1][0] - Q[1][0]) ** 2) + np.sum((np.sqrt(P[2][0]) - np.sqrt(Q[2][0])) ** 2)
    assert float(mw2(*one, *two)) == pytest.approx(w2, rel=1e-12)


def test_smw2_label_term_and_beta_default():
    rng = np.random.default_rng(2)
    w, m, v, _ = rand_gmm(rng, 4, 2)
    L1 = np.eye(2)[[0, 0, 1, 1]]
    L2 = np.eye(2)[[1, 1, 0, 0]]
    Cf = diag_w2_cost(m, v, m, v)
    C = mixture_cost(m, v, m, v, L1, L2)
    beta = float(Cf.max())
    np.testing.assert_allclose(C, Cf + beta * 2 * (L1 @ L2.T == 0), rtol=1e-12)
    # swapped labels on identical features cost more than the unlabeled distance (zero)
    assert float(mw2(w, m, v, w, m, v)) == pytest.approx(0.0, abs=1e-12)
    assert float(mw2(w, m, v, w, m, v, L1, L2)) > 0
    assert float(mw2(w, m, v, w, m, v, L1, L2, beta=0.0)) == pytest.approx(0.0, abs=1e-12)
    P = GMM(w, m, v, L1)
    Q = GMM(w, m, v, L2)
    assert gmm_mw2(P, Q) > 0 and gmm_mw2(P, Q, labeled=False) == pytest.approx(0.0, abs=1e-12)


def test_plan_rows_and_columns():
    rng = np.random.default_rng(3)
    w1, m1, v1, L1 = rand_gmm(rng, 5, 3, C=3)
    w2, m2, v2, L2 = rand_gmm(rng, 3, 3, C=3)
    plan = ot_plan(w1 * 3, m1, v1, w2, m2, v2, L1, L2)      # weights are normalised
    np.testing.assert_allclose(plan.sum(1), w1, atol=1e-12)
    np.testing.assert_allclose(plan.sum(0), w2, atol=1e-12)


def test_gradcheck_envelope():
    """With a unique optimal plan, the loss is locally Σ π c(θ): autograd matches finite differences."""
    rng = np.random.default_rng(4)
    w1, m1, v1, L1 = rand_gmm(rng, 3, 2, C=2)
    w2, m2, v2, L2 = rand_gmm(rng, 4, 2, C=2)
    t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731
    inputs = (t(m1), t(v1), t(L1))

    def f(m, v, L):
        return ref.mw2(w1, m, v, w2, m2, v2, L, L2, beta=1.7)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)

    def g(m, v):
        return ref.mw2(w1, m, v, w2, m2, v2)

    assert torch.autograd.gradcheck(g, inputs[:2], eps=1e-6, atol=1e-6)


def test_gradient_is_plan_weighted_cost_gradient():
    rng = np.random.default_rng(5)
    w1, m1, v1, _ = rand_gmm(rng, 4, 3)
    w2, m2, v2, _ = rand_gmm(rng, 4, 3)
    m = torch.tensor(m1, requires_grad=True)
    loss, plan = ref.mw2(w1, m, v1, w2, m2, v2, return_plan=True)
    loss.backward()
    expected = 2 * (plan.sum(1)[:, None] * m1 - plan @ m2)
    np.testing.assert_allclose(m.grad.numpy(), expected, rtol=1e-10)


def test_numpy_and_torch_reference_agree():
    rng = np.random.default_rng(6)
    w1, m1, v1, L1 = rand_gmm(rng, 6, 4, C=3)
    w2, m2, v2, L2 = rand_gmm(rng, 5, 4, C=3)
    m = torch.tensor(m1, requires_grad=True)
    for labs in ((None, None), (L1, L2)):
        a, pa = ref.mw2(w1, m, v1, w2, m2, v2, *labs, return_plan=True)    # autograd reference
        b, pb = mw2(w1, m1, v1, w2, m2, v2, *labs, return_plan=True)       # production (numpy)
        assert a.requires_grad and isinstance(b, np.floating)
        assert float(a.detach()) == pytest.approx(float(b), rel=1e-12)
        np.testing.assert_array_equal(pa, pb)


def test_label_term_needs_labels_on_both_sides():
    """One side unlabeled: the feature cost alone (MW2², whatever β); both labeled: cost
    c_ij + β‖L1_i − L2_j‖² for a given β too."""
    rng = np.random.default_rng(7)
    w1, m1, v1, L1 = rand_gmm(rng, 4, 3, C=2)
    w2, m2, v2, L2 = rand_gmm(rng, 5, 3, C=2)
    Cf = diag_w2_cost(m1, v1, m2, v2)
    np.testing.assert_array_equal(mixture_cost(m1, v1, m2, v2, L1, None), Cf)
    np.testing.assert_array_equal(mixture_cost(m1, v1, m2, v2, None, L2, beta=3.0), Cf)
    sq = ((L1[:, None] - L2[None]) ** 2).sum(-1)
    np.testing.assert_allclose(mixture_cost(m1, v1, m2, v2, L1, L2, beta=2.5), Cf + 2.5 * sq,
                               rtol=1e-12, atol=1e-12)
    P, Q, Qu = GMM(w1, m1, v1, L1), GMM(w2, m2, v2, L2), GMM(w2, m2, v2, None)
    plain = float(mw2(w1, m1, v1, w2, m2, v2))
    assert gmm_mw2(P, Qu) == pytest.approx(plain, rel=1e-12)             # auto: unlabeled
    assert gmm_mw2(P, Q, beta=0.0) == pytest.approx(plain, rel=1e-12)
    ref = ot.emd2(w1, w2, Cf + Cf.max() * sq)                              # SMW2², default β
    assert gmm_mw2(P, Q) == pytest.approx(ref, rel=1e-10)
    assert gmm_mw2(P, Q, labeled=True) == pytest.approx(ref, rel=1e-10)
    assert gmm_mw2(P, Q) > plain


def test_both_weight_vectors_are_normalised():
    rng = np.random.default_rng(8)
    w1, m1, v1, _ = rand_gmm(rng, 4, 2)
    w2, m2, v2, _ = rand_gmm(rng, 3, 2)
    plan = ot_plan(w1 * 3, m1, v1, w2 * 0.25, m2, v2)
    np.testing.assert_allclose(plan.sum(1), w1, atol=1e-12)
    np.testing.assert_allclose(plan.sum(0), w2, atol=1e-12)
    assert float(mw2(w1 * 3, m1, v1, w2 * 0.25, m2, v2)) == pytest.approx(
        float(mw2(w1, m1, v1, w2, m2, v2)), rel=1e-12)


def test_component_cost_is_a_nonnegative_brute_force_distance():
    """c_ij against a double loop, below 1 as well as above; identical far-away components cost
    0, never a rounding negative."""
    rng = np.random.default_rng(9)
    m1, m2 = rng.normal(size=(3, 2)) * 0.3, rng.normal(size=(4, 2)) * 0.3
    v1, v2 = rng.uniform(0.2, 0.6, (3, 2)), rng.uniform(0.2, 0.6, (4, 2))
    want = np.array([[np.sum((m1[i] - m2[j]) ** 2) + np.sum((np.sqrt(v1[i]) - np.sqrt(v2[j])) ** 2)
                      for j in range(4)] for i in range(3)])
    assert want.min() < 1
    np.testing.assert_allclose(diag_w2_cost(m1, v1, m2, v2), want, rtol=1e-10, atol=1e-14)
    far = rng.normal(size=(5, 3)) * 1e4
    c = diag_w2_cost(far, np.ones((5, 3)), far, np.ones((5, 3)))
    assert np.all(c >= 0) and np.all(np.diag(c) <= 1e-4)


def test_ot_plan_is_the_plan_of_the_labeled_cost_with_its_beta():
    # two components each; features pair 0↔0 and 1↔1, the labels pair them crosswise
    w = np.array([0.5, 0.5])
    m1, m2 = np.array([[0.0], [1.0]]), np.array([[0.1], [1.1]])
    v = np.ones((2, 1))
    L1, L2 = np.eye(2), np.eye(2)[::-1]
    straight, cross = np.eye(2) / 2, np.eye(2)[::-1] / 2
    np.testing.assert_allclose(ot_plan(w, m1, v, w, m2, v), straight)
    np.testing.assert_allclose(ot_plan(w, m1, v, w, m2, v, L1, L2), cross)  # β = max cost
    np.testing.assert_allclose(ot_plan(w, m1, v, w, m2, v, L1, L2, beta=0.0), straight)
    for L1_, L2_, beta in ((L1, L2, None), (L1, L2, 0.0), (L1, L2, 5.0), (None, None, None)):
        _, plan = mw2(w, m1, v, w, m2, v, L1_, L2_, beta, return_plan=True)
        np.testing.assert_array_equal(ot_plan(w, m1, v, w, m2, v, L1_, L2_, beta), plan)


def test_costs_of_float32_inputs_are_computed_in_float64():
    rng = np.random.default_rng(3)
    m1, m2 = rng.normal(size=(4, 16)) * 100, rng.normal(size=(5, 16)) * 100
    v1, v2 = rng.uniform(0.5, 2, (4, 16)), rng.uniform(0.5, 2, (5, 16))
    L1, L2 = np.eye(3)[rng.integers(0, 3, 4)], np.eye(3)[rng.integers(0, 3, 5)]
    f32 = [a.astype(np.float32) for a in (m1, v1, m2, v2, L1, L2)]
    exact = mixture_cost(*(a.astype(np.float64) for a in f32))
    got = mixture_cost(*f32)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, exact)
    np.testing.assert_array_equal(diag_w2_cost(*f32[:4]), diag_w2_cost(*(a.astype(np.float64) for a in f32[:4])))


def test_hidden_modules_block_imports_inside_only_and_spare_loaded_ones():
    import importlib
    import sys

    from fedalign.dadil.distances import hidden_modules

    fake = "fedalign_test_never_a_module"
    assert fake not in sys.modules and "numpy" in sys.modules
    with hidden_modules((fake, "numpy")) as hidden:
        assert hidden == [fake]  # numpy is loaded: left alone
        assert sys.modules[fake] is None and sys.modules["numpy"] is np
        with pytest.raises(ImportError):
            importlib.import_module(fake)
    assert fake not in sys.modules and sys.modules["numpy"] is np
    with pytest.raises(ModuleNotFoundError):  # importable (here: looked up) again
        importlib.import_module(fake)
    with pytest.raises(RuntimeError), hidden_modules((fake,)):
        raise RuntimeError("the block failed")
    assert fake not in sys.modules


@pytest.mark.parametrize("loaded,lean,hides", [(False, "1", True), (True, "1", False),
                                                (False, None, False), (False, "0", False)])
def test_lean_pot_import_hides_only_sklearn_and_networkx_on_a_first_import(monkeypatch, loaded,
                                                                           lean, hides):
    import sys

    from fedalign.dadil import distances

    seen = []
    real = distances.hidden_modules

    def spy(names):
        seen.append(tuple(names))
        return real(names)

    monkeypatch.setattr(distances, "hidden_modules", spy)
    if lean is None:
        monkeypatch.delenv("FEDALIGN_POT_LEAN", raising=False)
    else:
        monkeypatch.setenv("FEDALIGN_POT_LEAN", lean)
    if not loaded:  # POT's submodules stay cached: re-running its __init__ is cheap
        monkeypatch.delitem(sys.modules, "ot")
    pot = distances._pot()
    assert seen == ([("sklearn", "networkx")] if hides else [])
    np.testing.assert_allclose(pot.emd(np.ones(2) / 2, np.ones(2) / 2, np.eye(2)[::-1]), np.eye(2) / 2)


def test_exact_plans_get_a_million_network_simplex_iterations(monkeypatch):
    # POT's default (100,000) leaves plans of a few thousand components unconverged
    import ot as pot

    from fedalign.dadil import distances

    seen = {}
    real = pot.emd

    def spy(a, b, M, **kw):
        seen.update(kw)
        return real(a, b, M, **kw)

    monkeypatch.setattr(pot, "emd", spy)
    distances.emd_plan(np.ones(3), np.ones(2), np.arange(6.0).reshape(3, 2))
    assert seen.get("numItermax") == distances.EMD_MAX_ITER == 1_000_000
    # the plan only: no dual centring, no mass assertion (both weights are normalised)
    assert seen.get("center_dual") is False and seen.get("check_marginals") is False


@pytest.mark.parametrize("K1, K2, seed", [(5, 7, 0), (30, 30, 1), (60, 40, 2)])
def test_plan_equals_pot_default_emd_bit_for_bit(K1, K2, seed):
    """Skipping the duals' centring and the mass check leaves the network simplex's plan
    unchanged, to the last bit (POT's ot.emd at its defaults as the oracle)."""
    import ot as pot

    from fedalign.dadil.distances import emd_plan

    rng = np.random.default_rng(seed)
    w1, w2 = rng.random(K1) + 0.1, rng.random(K2) + 0.1
    C = rng.random((K1, K2)) ** 2
    expected = pot.emd(w1 / w1.sum(), w2 / w2.sum(), C, numItermax=1_000_000)
    np.testing.assert_array_equal(emd_plan(w1, w2, C), expected)

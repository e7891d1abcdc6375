"""The trained heads and their options, each against an independent oracle or a closed form
(the mutation survivors of fedalign/heads/{linear,fedpft,ofedavg,centralized,__init__}.py,
issue 19; every test runs in-process so that mutmut sees it).

- linear: the loss and its gradient against finite differences of the cross-entropy written
  out; the numpy trainer against PyTorch's SGD and AdamW update rules as their documentation
  states them (one parameter at a time, in plain numpy); ``default_init``; ``epochs_for``.
- fedpft: the few-sample component rule, the GMM seed, the samplers' draws, ``synthesize``'s
  counts and dtypes, the server head = the trainer on the synthetic set.
- ofedavg: option ranges, the τ and broadcast of each round, the local trainer's options.
- centralized: the head trained on the pooled rows.
- heads/__init__: ``--param`` parsing (types, bounds, unknown keys, the error names the
  option), round seeds, ``run_method``'s plumbing.
"""

from __future__ import annotations

import re
import sys
import types
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.heads import (LinearHead, Method, centralized, client_seed, fedpft, get_method,
                            linear, make_config, ofedavg, round_seed, run_method)

from heads_data import C, D, blobs, clients, pooled  # noqa: F401 (clients: a fixture)


def _raises(message):
    """pytest.raises for a FedalignError whose message is exactly ``message``."""
    return pytest.raises(FedalignError, match="^" + re.escape(message) + "$")


# ------------------------------------------------------------------------ the loss, written out
def _softmax(Z):
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def _objective(W, b, X, y, off=None, softmax_before_ce=False):
    """(1/m) Σ −log softmax(u_i)_{y_i}, u = z or softmax(z), z = X Wᵀ + b (+ o)."""
    Z = X @ W.T + b + (0.0 if off is None else off)
    U = _softmax(Z) if softmax_before_ce else Z
    top = U.max(axis=1)
    lse = top + np.log(np.exp(U - top[:, None]).sum(axis=1))
    return float(np.mean(lse - U[np.arange(len(y)), y]))


def _gradients(W, b, X, y, off, softmax_before_ce):
    """∂L/∂W, ∂L/∂b: ∂L/∂u_i = (softmax(u_i) − e_{y_i})/m, through a softmax s = softmax(z)
    ∂L/∂z_i = (diag(s_i) − s_i s_iᵀ) ∂L/∂s_i."""
    m = len(y)
    Z = X @ W.T + b + (0.0 if off is None else off)
    onehot = np.eye(W.shape[0])[y]
    if softmax_before_ce:
        S = _softmax(Z)
        Gs = (_softmax(S) - onehot) / m
        G = np.stack([(np.diag(s) - np.outer(s, s)) @ g for s, g in zip(S, Gs)])
    else:
        G = (_softmax(Z) - onehot) / m
    return G.T @ X, G.sum(axis=0)


@pytest.mark.parametrize("softmax_before_ce", [False, True])
def test_loss_and_gradient_are_the_cross_entropy_and_its_derivative(softmax_before_ce):
    rng = np.random.default_rng(0)
    m, d, c = 7, 3, 4
    X = rng.normal(size=(m, d))
    Xb = np.hstack([X, np.ones((m, 1))])
    y = rng.integers(0, c, m)
    Wb = rng.normal(size=(c, d + 1))
    off = np.log([0.1, 0.2, 0.3, 0.4])

    def loss(P):
        return _objective(P[:, :d], P[:, d], X, y, off, softmax_before_ce)

    got, G = linear._loss_grad(Xb, y, Wb, off, softmax_before_ce)
    assert got == pytest.approx(loss(Wb), rel=1e-12)
    fd = np.zeros_like(Wb)
    for idx in np.ndindex(*Wb.shape):
        E = np.zeros_like(Wb)
        E[idx] = 1e-6
        fd[idx] = (loss(Wb + E) - loss(Wb - E)) / 2e-6
    np.testing.assert_allclose(G, fd, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("softmax_before_ce", [False, True])
def test_loss_is_stable_under_a_large_logit_shift_of_each_row(softmax_before_ce):
    """Adding a_i to every logit of row i changes no probability: each softmax subtracts its
    own row's maximum (a_i = ±900 overflows or underflows exp otherwise)."""
    rng = np.random.default_rng(1)
    m, d, c = 5, 3, 4
    X, y = rng.normal(size=(m, d)), rng.integers(0, c, m)
    shift = np.array([0.0, 900.0, -900.0, 300.0, 0.0])
    Wb = np.hstack([rng.normal(size=(c, d)), np.ones((c, 1)), rng.normal(size=(c, 1))])
    plain = np.hstack([X, np.zeros((m, 1)), np.ones((m, 1))])
    shifted = np.hstack([X, shift[:, None], np.ones((m, 1))])
    l0, g0 = linear._loss_grad(plain, y, Wb, None, softmax_before_ce)
    l1, g1 = linear._loss_grad(shifted, y, Wb, None, softmax_before_ce)
    keep = [0, 1, 2, 4]  # every column but the shift's own
    assert np.isfinite(l1) and l1 == pytest.approx(l0, rel=1e-9)
    np.testing.assert_allclose(g1[:, keep], g0[:, keep], rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------- the trainer against PyTorch's rules
def _torch_rules_train(X, y, n_classes, *, epochs, lr, batch_size, optimizer="sgd", momentum=0.9,
                       weight_decay=1e-5, softmax_before_ce=False, seed=0, init=None, logit_offset=None):
    """torch.optim.SGD (coupled weight decay, dampening 0, buffer = g at the first step) and
    torch.optim.AdamW (decoupled decay, β = (0.9, 0.999), ε = 1e-8, bias-corrected moments)
    as their documentation writes them, W and b two parameters; nn.Linear's U(−1/√d, 1/√d)
    start drawn from a generator seeded by the run generator's first integer below 2³¹; each
    epoch's mini-batches in the order of one permutation (none for a single batch)."""
    X = np.asarray(X, np.float64)
    n, d = X.shape
    rng = np.random.default_rng(seed)
    if init is None:
        start = np.random.default_rng(int(rng.integers(2**31)))
        bound = 1.0 / np.sqrt(d)
        init = (start.uniform(-bound, bound, (n_classes, d)), start.uniform(-bound, bound, n_classes))
    params = [np.array(init[0], np.float64), np.array(init[1], np.float64)]
    state = [{}, {}]
    t = 0
    for _ in range(epochs):
        order = rng.permutation(n) if n > batch_size else np.arange(n)
        for s in range(0, n, batch_size):
            idx = order[s:s + batch_size]
            grads = _gradients(*params, X[idx], y[idx], logit_offset, softmax_before_ce)
            t += 1
            for p, g, st in zip(params, grads, state):
                if optimizer == "sgd":
                    g = g + weight_decay * p
                    if momentum:
                        st["buf"] = g.copy() if t == 1 else momentum * st["buf"] + g
                        g = st["buf"]
                    p -= lr * g
                else:
                    p *= 1.0 - lr * weight_decay
                    st["m"] = 0.9 * st.get("m", 0.0) + 0.1 * g
                    st["v"] = 0.999 * st.get("v", 0.0) + 0.001 * g * g
                    m_hat, v_hat = st["m"] / (1 - 0.9**t), st["v"] / (1 - 0.999**t)
                    p -= lr * m_hat / (np.sqrt(v_hat) + 1e-8)
    return params[0], params[1], t


def _trainer_data():
    """45 rows (three batches of 16, the last of 13); a last feature of scale 1e-6, whose
    weights get gradients small enough for AdamW's ε to matter."""
    X, y = blobs(45, 8)
    X = X.astype(np.float64)
    X[:, -1] *= 1e-6
    return X, y


@pytest.mark.parametrize("case", ["sgd", "sgd-plain", "sgd-softmax-offset", "adamw", "adamw-no-decay",
                                  "full-batch"])
def test_trainer_follows_pytorchs_sgd_and_adamw_step_for_step(case):
    X, y = _trainer_data()
    kw = dict(epochs=4, lr=0.05, batch_size=16, seed=3, weight_decay=1e-3)
    kw.update({"sgd": {}, "sgd-plain": dict(momentum=0.0, weight_decay=0.0),
               "sgd-softmax-offset": dict(softmax_before_ce=True, lr=0.5),
               "adamw": dict(optimizer="adamw", lr=0.01, weight_decay=0.05),
               "adamw-no-decay": dict(optimizer="adamw", lr=0.01, weight_decay=0.0),
               "full-batch": dict(batch_size=64)}[case])
    if case == "sgd-softmax-offset":  # class 3 absent: offset −inf, its logits never count
        y = y % 3
        with np.errstate(divide="ignore"):
            kw["logit_offset"] = np.log(np.bincount(y, minlength=C) / len(y))
    info = {}
    W, b = linear.train_softmax(X, y, C, info=info, **kw)
    Wo, bo, steps = _torch_rules_train(X, y, C, **kw)
    np.testing.assert_allclose(W, Wo, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(b, bo, rtol=1e-9, atol=1e-13)
    assert info["steps"] == steps == 4 * (1 if case == "full-batch" else 3) and info["epochs"] == 4
    want = _objective(W, b, X, y, kw.get("logit_offset"), kw.get("softmax_before_ce", False))
    assert info["final_loss"] == pytest.approx(want, rel=1e-12)


def test_trainer_seed_defaults_to_zero_and_labels_may_be_any_integral_dtype():
    X, y = _trainer_data()
    kw = dict(epochs=2, lr=0.05, batch_size=16)
    W, b = linear.train_softmax(X, y, C, seed=0, **kw)
    for labels in (y, y.astype(np.float64), y.astype(np.int32)):
        W2, b2 = linear.train_softmax(X, labels, C, **kw)
        assert np.array_equal(W, W2) and np.array_equal(b, b2)


def test_a_single_batch_is_not_shuffled():
    """n = batch_size is one full batch, as n < batch_size: the same head bit for bit."""
    X, y = _trainer_data()
    kw = dict(epochs=5, lr=0.1, seed=2)
    a = linear.train_softmax(X, y, C, batch_size=45, **kw)
    b = linear.train_softmax(X, y, C, batch_size=60, **kw)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_trainer_refuses_what_it_cannot_train():
    X, y = _trainer_data()
    W, b = linear.train_softmax(X[:1], y[:1], C, epochs=1, lr=0.1, batch_size=8)  # one row trains
    assert W.shape == (C, D) and np.all(np.isfinite(W))
    with _raises("cannot train a head on zero samples"):
        linear.train_softmax(X[:0], y[:0], C, epochs=1, lr=0.1, batch_size=8)
    with _raises("optimizer must be sgd or adamw, got 'adam'"):
        linear.train_softmax(X, y, C, epochs=1, lr=0.1, batch_size=8, optimizer="adam")
    A, t = np.eye(D), np.zeros(D)
    with _raises("a transport layer needs one τ per epoch (3), got none"):
        linear.train_softmax(X, y, C, epochs=3, lr=0.1, batch_size=8, transport=(A, t))
    with _raises("a transport layer needs one τ per epoch (3), got 2"):
        linear.train_softmax(X, y, C, epochs=3, lr=0.1, batch_size=8, transport=(A, t), taus=[0.1, 0.2])


def test_default_init_is_torch_linears_uniform_from_the_seed():
    W, b = linear.default_init(9, 40, 3)
    rng = np.random.default_rng(3)
    assert np.array_equal(W, rng.uniform(-1 / 3, 1 / 3, (40, 9)))
    assert np.array_equal(b, rng.uniform(-1 / 3, 1 / 3, 40))


@pytest.mark.parametrize("n,batch,epochs,min_steps,want", [
    (130, 64, 1, 300, 100), (130, 64, 1, 301, 101), (20, 64, 100, 300, 300), (1000, 64, 100, 300, 100),
    (0, 64, 3, 5, 5), (10, 4, 0, 0, 0)])
def test_epochs_for_is_max_of_epochs_and_the_ceiling_of_min_steps_per_epoch(n, batch, epochs, min_steps, want):
    """max(E, ⌈S / ⌈n / B⌉⌉), an int; S defaults to 0 (E epochs, even E = 0)."""
    got = linear.epochs_for(n, batch, epochs, min_steps)
    assert got == want and type(got) is int
    if min_steps == 0:
        assert linear.epochs_for(n, batch, epochs) == want


# --------------------------------------------------------------------------------- FedPFT
def test_fedpft_config_fills_only_unset_options_from_the_preset():
    cfg = fedpft.Config(components=1, epochs=0, batch_size=1)
    cfg.validate()
    assert (cfg.components, cfg.epochs, cfg.batch_size, cfg.covariance, cfg.lr) == (1, 0, 1, "diag", 0.01)
    for kw in (dict(components=-2), dict(components=0), dict(epochs=-3), dict(batch_size=0),
               dict(batch_size=-2)):
        with _raises("fedpft: components and batch_size must be ≥ 1, epochs ≥ 0"):
            fedpft.Config(**kw).validate()
    with _raises("fedpft.preset must be one of k10-diag, k1-spherical, got 'k3'"):
        fedpft.Config(preset="k3").validate()
    with _raises("fedpft.covariance must be diag, spherical or full, got 'tied'"):
        fedpft.Config(covariance="tied").validate()


@pytest.mark.parametrize("n,K,want,want_ref", [
    (0, 10, 0, 0), (1, 10, 0, 0), (2, 10, 1, 0), (3, 10, 1, 0), (4, 10, 2, 0), (8, 10, 4, 0),
    (11, 10, 5, 10), (25, 10, 10, 10), (100, 3, 3, 3), (3, 2, 1, 2)])
def test_fedpft_components_per_class(n, K, want, want_ref):
    """fedalign: 0 below 2 samples, else max(1, min(K, ⌊n/2⌋)); reference: K when n > K."""
    assert fedpft.n_components_for(n, K) == want
    assert fedpft.n_components_for(n, K, "reference") == want_ref


def test_fedpft_gmm_seed_is_the_client_seed_as_it_is(monkeypatch):
    """scikit-learn's random_state takes [0, 2**32 − 1]: the seed goes in unchanged (the
    largest one too: it was wrapped onto seed 0's stream), and one beyond is refused."""
    from sklearn import mixture

    seen = []
    real = mixture.GaussianMixture

    class Spy(real):
        def fit(self, X_, y_=None):
            seen.append(self.random_state)
            return super().fit(X_)

    monkeypatch.setattr(mixture, "GaussianMixture", Spy)
    X, y = blobs(20, 1, classes=1)
    cfg = get_method("fedpft").config({"components": "1"})
    for seed in (None, 2**32 - 1, 100):
        fedpft.client_update(X, y, C, cfg, **({} if seed is None else {"seed": seed}))
    assert seen == [0, 2**32 - 1, 100]  # default seed 0
    for bad in (2**32, -1):
        with pytest.raises(FedalignError, match=r"^seed must be an integer in \[0, 2\*\*32 − 1"):
            fedpft.client_update(X, y, C, cfg, seed=bad)


def test_fedpft_em_runs_in_float64_and_counts_are_int64():
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(120, D)) * rng.uniform(0.1, 3, D) + rng.normal(size=D) * 5).astype(np.float32)
    y = rng.integers(0, 3, 120)
    cfg = get_method("fedpft").config({"components": "3"})
    a = fedpft.client_update(X, y, C, cfg, seed=0)
    b = fedpft.client_update(X.astype(np.float64), y, C, cfg, seed=0)
    for key in fedpft.MESSAGE_KEYS:
        assert np.array_equal(a[key], b[key]), key
    assert a["counts"].dtype == np.int64 and a["n_components"].dtype == np.int64


def _clusters(sizes, centers, seed=0):
    """Tight clusters (σ = 0.01) of the given sizes at the given first coordinates."""
    rng = np.random.default_rng(seed)
    rows = [np.eye(D)[0] * c + 0.01 * rng.normal(size=(s, D)) for s, c in zip(sizes, centers)]
    return np.concatenate(rows)


def test_fedpft_lowers_components_one_at_a_time_until_each_has_enough_samples():
    """K = 3, min_per_component 2: three clusters of 10 keep 3 components; two clusters of 2
    keep 2 (weight · n = 2 exactly is enough); 3 + 3 + 1 outlier starts at 3, whose outlier
    component carries 1 sample, and keeps 2 (one step down, not straight to 1); 4 + 1 outlier
    starts at 2 and keeps 1."""
    parts = [_clusters([10, 10, 10], [0, 10, 20]), _clusters([2, 2], [0, 10]),
             _clusters([3, 3, 1], [0, 10, 13]), _clusters([4, 1], [0, 10])]
    X = np.concatenate(parts).astype(np.float32)
    y = np.concatenate([np.full(len(p), c) for c, p in enumerate(parts)])
    cfg = get_method("fedpft").config({"components": "3"})
    msg = fedpft.client_update(X, y, C, cfg, seed=0)
    assert list(msg["n_components"]) == [3, 2, 2, 1]
    w = msg["weights"].astype(np.float64) * msg["counts"][:, None]
    assert np.all(w[msg["weights"] > 0] >= 2 - 0.01)


def test_fedpft_sends_variances_clamped_to_float16s_range():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, D)) * np.array([1000.0] + [1.0] * (D - 1))  # variance 1e6 > 65504
    y = np.zeros(40, dtype=np.int64)
    msg = fedpft.client_update(X, y, C, get_method("fedpft").config({"components": "1"}), seed=0)
    cov = msg["covariances"][0, 0]
    assert np.all(np.isfinite(cov)) and cov[0] == np.finfo(np.float16).max and cov[1] < 10


def _gmm_message(weights, means, covariances):
    k = len(weights)
    return {"counts": np.array([1000]), "n_components": np.array([k]),
            "weights": np.asarray(weights, np.float16)[None], "means": np.asarray(means, np.float16)[None],
            "covariances": np.asarray(covariances, np.float16)[None]}


@pytest.mark.parametrize("kind", ["spherical", "diag", "full"])
def test_fedpft_sampler_draws_labels_then_normals_from_the_generator(kind):
    """Reproducible draw for draw: component labels j ~ w (one rng.choice), then one (n, d)
    block z of standard normals; x = μ_j + L_j z with L_j = σ_j (spherical, diag) or
    V Λ^½ of Σ_j = V Λ Vᵀ (full)."""
    mu = np.array([[5.0, -1.0], [-3.0, 2.0]])
    cov = {"spherical": np.array([2.0, 0.5]), "diag": np.array([[2.0, 0.5], [3.0, 1.5]]),
           "full": np.array([[[2.0, 0.6], [0.6, 1.0]], [[1.0, -0.3], [-0.3, 0.5]]])}[kind]
    msg = _gmm_message([0.25, 0.75], mu, cov)
    X = fedpft.sample_class(msg, 0, 500, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    comp = rng.choice(2, size=500, p=[0.25, 0.75])
    Z = rng.standard_normal((500, 2))
    S = msg["covariances"][0].astype(np.float64)
    for j in range(2):
        if kind == "full":
            lam, V = np.linalg.eigh(S[j])
            want = mu[j] + Z[comp == j] @ (V * np.sqrt(lam)).T
        else:
            want = mu[j] + Z[comp == j] * np.sqrt(S[j])
        np.testing.assert_allclose(X[comp == j], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sampler", ["fedalign", "reference"])
def test_fedpft_zero_weights_sample_the_components_uniformly(sampler):
    """float16 weights that all underflow to 0: every component equally likely."""
    msg = _gmm_message([0.0, 0.0, 0.0], [[0.0, 0.0], [100.0, 0.0], [200.0, 0.0]], [[1.0, 1.0]] * 3)
    if sampler == "reference":
        X = fedpft.sample_class_sklearn(msg, 0, 30_000, "diag", 0)
    else:
        X = fedpft.sample_class(msg, 0, 30_000, np.random.default_rng(0))
    freq = np.bincount(np.rint(X[:, 0] / 100).astype(int), minlength=3) / 30_000
    np.testing.assert_allclose(freq, [1 / 3] * 3, atol=0.015)


def _sklearn_sample(msg, n, covariance, seed):
    """The reference's draw: GaussianMixture with float32 parameters, the float16 weights
    renormalised in float64, sample(n) from RandomState(seed)."""
    from sklearn.mixture import GaussianMixture

    k = int(msg["n_components"][0])
    w = msg["weights"][0, :k].astype(np.float64)
    g = GaussianMixture(k, covariance_type=covariance, random_state=seed)
    g.weights_ = w / w.sum()
    g.means_ = msg["means"][0, :k].astype(np.float32)
    g.covariances_ = msg["covariances"][0, :k].astype(np.float32)
    return g.sample(n)[0]


@pytest.mark.parametrize("kind", ["diag", "full"])
def test_fedpft_reference_sampler_is_sklearns_sample_with_renormalised_weights(kind):
    # float16 weights 0.1, 0.1, 0.8 sum to 0.99976: renormalised, not used as sent
    mu = [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]
    cov = {"diag": [[2.0, 0.5], [3.0, 1.5], [0.7, 5.0]],
           "full": [[[2.0, 0.6], [0.6, 1.0]], [[1.0, -0.3], [-0.3, 0.5]], [[3.0, 0.0], [0.0, 0.2]]]}[kind]
    msg = _gmm_message([0.1, 0.1, 0.8], mu, cov)
    assert msg["weights"].astype(np.float64).sum() < 1
    got = fedpft.sample_class_sklearn(msg, 0, 200_000, kind, 2**32 - 1)
    np.testing.assert_array_equal(got, _sklearn_sample(msg, 200_000, kind, 2**32 - 1))  # as it is


def _fitted_and_unfitted_message():
    """Class 0: one sample (not fitted, count sent); class 1: a 2-component GMM of 40 rows."""
    msg = _gmm_message([0.5, 0.5], [[0.0, 0.0], [10.0, 0.0]], [[1.0, 2.0], [0.5, 0.5]])
    pad = {k: np.concatenate([np.zeros_like(v), v]) for k, v in msg.items()}
    pad["counts"] = np.array([1, 40])
    return pad


def _full_covariances():
    """Full covariances of _fitted_and_unfitted_message's classes (class 0: padding)."""
    return np.stack([np.zeros((2, 2, 2)), np.array([np.eye(2), 2 * np.eye(2)])]).astype(np.float16)


def test_fedpft_synthesize_draws_each_fitted_class_after_an_unfitted_one():
    msg = _fitted_and_unfitted_message()
    for sampler in ("fedalign", "reference"):
        X, y, report = fedpft.synthesize([msg], 2, seed=3, sampler=sampler)
        assert X.dtype == np.float32 and X.shape == (40, 2) and y.dtype == np.int64
        assert np.bincount(y, minlength=2).tolist() == [0, 40]
        assert report == {"unfitted": [(0, 0, 1)], "n_synthetic": 40}
    full = dict(msg, covariances=_full_covariances())
    X, _, _ = fedpft.synthesize([full], 2, seed=3, sampler="reference", covariance="full")
    np.testing.assert_array_equal(X, fedpft.sample_class_sklearn(full, 1, 40, "full", 3).astype(np.float32))
    only = dict(msg, counts=np.array([1, 0]))
    with _raises("fedpft: no client sent a fitted class GMM (every class has < 2 samples)"):
        fedpft.synthesize([only], 2, seed=0)


@pytest.mark.parametrize("case", ["sgd", "adamw", "reference"])
def test_fedpft_server_head_is_the_trainer_on_the_synthetic_set(case):
    msg = _fitted_and_unfitted_message()
    opts = {"epochs": "2", "components": "2", "weight_decay": "0.001"}
    if case == "reference":  # the reference's sampler, with the full covariances it names
        msg["covariances"] = _full_covariances()
        cfg = get_method("fedpft").config({"variant": "reference", "covariance": "full", **opts})
    else:
        name = "fedpft" if case == "sgd" else "fedpft-k1"
        cfg = get_method(name).config({"momentum": "0.5", "covariance": "diag", **opts})
    assert cfg.optimizer == ("sgd" if case == "sgd" else "adamw")
    seed = 0 if case == "sgd" else 5
    head = fedpft.server_aggregate([msg], 2, cfg, **({} if case == "sgd" else {"seed": seed}))
    X, y, _ = fedpft.synthesize([msg], 2, seed, "reference" if case == "reference" else "fedalign",
                                cfg.covariance)
    W, b = linear.train_softmax(X, y, 2, epochs=2, lr=cfg.lr, batch_size=cfg.batch_size,
                                optimizer=cfg.optimizer, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay, seed=seed)
    assert np.array_equal(head.W, W) and np.array_equal(head.b, b)


# ------------------------------------------------------------------------------- O-FedAvg
def test_ofedavg_option_ranges():
    for ok in ({"tau_min": "0"}, {"tau_min": "1"}, {"tau_max": "0"}, {"tau_max": "1"},
               {"epochs": "1", "min_steps": "0"}, {"epochs": "0", "min_steps": "1"}):
        get_method("ofedavg").config(ok)
    with _raises("ofedavg.tau_min must be in [0, 1], got 1.5"):
        get_method("ofedavg").config({"tau_min": "1.5"})
    with _raises("ofedavg.tau_max must be in [0, 1], got 1.5"):
        get_method("ofedavg").config({"tau_max": "1.5"})
    with _raises("ofedavg: epochs or min_steps must be ≥ 1"):
        get_method("ofedavg").config({"epochs": "0", "min_steps": "0"})
    with _raises("a τ schedule needs at least one step"):
        ofedavg.cosine_schedule(0, 0.0, 1.0)


def test_ofedavg_epoch_taus():
    cfg = get_method("ofedavg").config({"variant": "reference", "tau_max": "0.6", "rounds": "3"})
    assert ofedavg.epoch_taus(cfg, 2) == ofedavg.epoch_taus(cfg, 2, 0) == [ofedavg.cosine_schedule(3, 0, 0.6)[0]] * 2
    assert ofedavg.epoch_taus(get_method("ofedavg").config({"tau_max": "0"}), 3) == [0.0] * 3
    with _raises("ofedavg: a transport layer needs ofedavg.tau_max (the evaluation τ)"):
        ofedavg.epoch_taus(get_method("ofedavg").config({}), 3)


def _transport():
    rng = np.random.default_rng(3)
    return np.eye(D) + 0.05 * rng.normal(size=(D, D)), 0.1 * rng.normal(size=D)


def _spy_trainer(monkeypatch):
    calls = []
    real = linear.train_softmax

    def spy(*args, **kw):
        out = real(*args, **kw)
        calls.append(dict(kw, out=out))
        return out

    monkeypatch.setattr(ofedavg, "train_softmax", spy)
    return calls


def test_ofedavg_round_r_starts_from_the_previous_average_at_the_rth_tau(clients, monkeypatch):
    calls = _spy_trainer(monkeypatch)
    params = {"variant": "reference", "tau_max": "0.6", "rounds": "3", "epochs": "2"}
    run_method("ofedavg", clients, C, seed=0, transports=[_transport()] * 3, params=params)
    sched = ofedavg.cosine_schedule(3, 0.0, 0.6)
    assert [c["taus"] for c in calls] == [[sched[r]] * 2 for r in range(3) for _ in range(3)]
    first = ofedavg.server_init(D, C, get_method("ofedavg").config(params), 0)
    assert all(np.array_equal(c["init"][0], first["W"]) for c in calls[:3])
    for r in (1, 2):  # equal weighting (reference): the mean of the previous round's heads
        W = np.mean([c["out"][0] for c in calls[3 * (r - 1):3 * r]], axis=0)
        for c in calls[3 * r:3 * r + 3]:
            np.testing.assert_allclose(c["init"][0], W, rtol=1e-12, atol=1e-15)


def test_ofedavg_client_without_a_round_number_is_in_round_zero(monkeypatch):
    calls = _spy_trainer(monkeypatch)
    cfg = get_method("ofedavg").config({"variant": "reference", "tau_max": "0.6", "rounds": "3", "epochs": "2"})
    X, y = blobs(30, 1)
    W0, b0 = linear.default_init(D, C, 5)
    ofedavg.client_update(X, y, C, cfg, seed=1, transport=_transport())  # no broadcast
    ofedavg.client_update(X, y, C, cfg, seed=1, init={"W": W0, "b": b0}, transport=_transport())
    tau0 = ofedavg.cosine_schedule(3, 0.0, 0.6)[0]
    assert [c["taus"] for c in calls] == [[tau0] * 2] * 2
    assert calls[0]["init"] is None and calls[1]["init"][0] is W0


def test_ofedavg_client_trains_with_its_options():
    X, y = blobs(40, 2)
    cfg = get_method("ofedavg").config({"epochs": "3", "min_steps": "0", "lr": "0.05", "momentum": "0.5",
                                        "weight_decay": "0.01", "batch_size": "16", "logit_adjust": "off"})
    msg = ofedavg.client_update(X, y, C, cfg, seed=9)
    W, b = linear.train_softmax(X, y, C, epochs=3, lr=0.05, batch_size=16, momentum=0.5,
                                weight_decay=0.01, seed=9)
    assert np.array_equal(msg["W"], W) and np.array_equal(msg["b"], b) and int(msg["n"]) == 40


def test_ofedavg_client_lacking_the_last_classes_is_logit_adjusted_without_a_warning():
    X, y = blobs(40, 4, classes=2)  # classes 2 and 3 absent
    cfg = get_method("ofedavg").config({"epochs": "2", "min_steps": "0"})
    init = ofedavg.server_init(D, C, cfg, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        msg = ofedavg.client_update(X, y, C, cfg, seed=0, init=init)
    with np.errstate(divide="ignore"):
        off = np.log(np.bincount(y, minlength=C) / len(y))
    W, b = linear.train_softmax(X, y, C, epochs=2, lr=0.01, batch_size=64, seed=0,
                                init=(init["W"], init["b"]), logit_offset=off)
    assert np.array_equal(msg["W"], W) and np.array_equal(msg["b"], b)


# ---------------------------------------------------------------------------- centralized
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_centralized_head_is_the_trainer_on_the_pooled_rows(clients, optimizer):
    wide = [(X.astype(np.float64), y.astype(np.int32)) for X, y in clients]
    cfg = get_method("centralized").config({"epochs": "2", "optimizer": optimizer, "momentum": "0.5",
                                            "weight_decay": "0.001"})
    msgs = [centralized.client_update(X, y, C, cfg, seed=0) for X, y in wide]
    assert all(m["X"].dtype == np.float32 and m["y"].dtype == np.int64 for m in msgs)
    head = centralized.server_aggregate(msgs, C, cfg)
    X, y = pooled(clients)
    W, b = linear.train_softmax(X, y, C, epochs=2, lr=0.01, batch_size=64, optimizer=optimizer,
                                momentum=0.5, weight_decay=0.001, seed=0)
    assert np.array_equal(head.W, W) and np.array_equal(head.b, b)


# ------------------------------------------------------------------- options and run_method
def test_option_errors_name_the_method_and_the_option():
    with _raises("unknown method 'fedsomething' (choose from ofedavg, fedcgs, fedpft, fedpft-k1, fed3r, "
                 "centralized)"):
        get_method("fedsomething")
    with _raises("ofedavg.lr must be > 0, got 0.0"):
        get_method("ofedavg").config({"lr": "0"})
    with _raises("ofedavg.epochs must be ≥ 0, got -1"):
        get_method("ofedavg").config({"epochs": "-1"})
    with _raises("fedpft-k1.lr must be > 0, got -0.5"):
        get_method("fedpft-k1").config({"lr": "-0.5"})
    with _raises("ofedavg.epochs: cannot read 'ten' as int"):
        get_method("ofedavg").config({"epochs": "ten"})
    with _raises("ofedavg.variant must be one of fedalign, reference, got 'paper'"):
        get_method("ofedavg").config({"variant": "paper"})
    with _raises("centralized.variant must be one of fedalign, got 'reference' "
                 "(this head has no reference implementation)"):
        get_method("centralized").config({"variant": "reference"})
    with pytest.raises(FedalignError, match=r"^ofedavg: unknown option 'foo' \(options: variant, epochs, "
                                            r"lr, momentum, weight_decay, batch_size, weighting, "):
        get_method("ofedavg").config({"foo": "1"})
    # without a name, the Config's module names the option
    with _raises("fedalign.heads.ofedavg.lr must be > 0, got 0.0"):
        make_config(ofedavg.Config, {"lr": "0"})
    with _raises("fedalign.heads.ofedavg.epochs: cannot read '1.5' as int"):
        make_config(ofedavg.Config, {"epochs": "1.5"})


@pytest.mark.parametrize("word,value", [(w, True) for w in ("1", "true", "yes", "on", "TRUE", "On")]
                         + [(w, False) for w in ("0", "false", "no", "off", "FALSE", "Off")])
def test_boolean_options_read_the_usual_words(word, value):
    assert get_method("ofedavg").config({"softmax_before_ce": word}).softmax_before_ce is value


def test_a_boolean_option_refuses_other_words():
    with _raises("ofedavg.softmax_before_ce: cannot read 'maybe' as bool"):
        get_method("ofedavg").config({"softmax_before_ce": "maybe"})


@dataclass
class _Plain:
    """A Config without VARIANTS: a field named variant is a plain option; a default None
    keeps the string; a bounded name (lr) of another type is not range-checked."""

    n: int = 1
    variant: str = "x"
    extra: object = None
    lr: str = "auto"


def test_make_config_on_any_dataclass():
    cfg = make_config(_Plain, {"n": "3", "variant": "y", "extra": "kept", "lr": "auto"}, "plain")
    assert (cfg.n, cfg.variant, cfg.extra, cfg.lr) == (3, "y", "kept", "auto")


def test_round_seeds_are_reproducible_and_distinct():
    assert round_seed(7, 2, 0) == client_seed(7, 2)
    assert round_seed(7, 2, 3) == round_seed(7, 2, 3)
    assert len({round_seed(7, k, r) for k in range(3) for r in range(4)}) == 12


def test_run_method_takes_a_method_a_config_and_seed_zero(clients):
    params = {"epochs": "1", "min_steps": "0"}
    ref, msgs = run_method("ofedavg", clients, C, seed=0, params=params)
    assert "rounds" not in ref.info  # one round: no per-round history
    by_config, _ = run_method("ofedavg", clients, C, config=get_method("ofedavg").config(params))
    by_method, _ = run_method(Method("custom", "ofedavg", {"epochs": 1, "min_steps": 0}), clients, C)
    for h in (by_config, by_method):
        assert np.array_equal(h.W, ref.W) and np.array_equal(h.b, ref.b)
    with _raises("2 client maps for 3 clients"):
        run_method("ofedavg", clients, C, transports=[_transport()] * 2, params=params)
    with _raises("fedcgs trains on (pre-aligned) features and has no transport layer; "
                 "client maps are for ofedavg.tau_schedule=cosine"):
        run_method("fedcgs", clients, C, transports=[_transport()] * 3)


def _fake_method(monkeypatch, message, optional=None):
    """A head module registered under fedalign.heads: its message is ``message``."""

    @dataclass
    class Config:
        x: int = 0

    mod = types.ModuleType("fedalign.heads._fake_head")
    mod.MESSAGE_KEYS = ("s",)
    if optional is not None:
        mod.OPTIONAL_MESSAGE_KEYS = optional
    mod.Config = Config
    mod.client_update = lambda X, y, n_classes, config, seed, init=None: dict(message)
    mod.server_aggregate = lambda msgs, n_classes, config, seed: LinearHead(np.zeros((n_classes, D)),
                                                                             np.zeros(n_classes))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return Method("fake", "_fake_head")


def test_run_method_refuses_undeclared_message_keys(clients, monkeypatch):
    ok = _fake_method(monkeypatch, {"s": np.zeros(1), "frac": np.zeros(1)}, optional=("frac",))
    _, msgs = run_method(ok, clients, C)
    assert set(msgs[0]) == {"s", "frac"}
    leaky = _fake_method(monkeypatch, {"s": np.zeros(1), "raw": np.zeros(1), "frac": np.zeros(1)})
    with pytest.raises(RuntimeError, match=re.escape("fake: message has undeclared keys ['frac', 'raw']")):
        run_method(leaky, clients, C)

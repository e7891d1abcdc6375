"""Head variants (reference | fedalign), O-FedAvg's τ schedule and transport layer, rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.heads import client_seed, get_method, run_method
from fedalign.heads import fed3r, fedpft, ofedavg
from fedalign.heads import linear

from heads_data import C, D, blobs, clients, pooled  # noqa: F401 (clients: a fixture)



# ------------------------------------------------------------------------------ variant configs
def test_variant_supplies_defaults_and_explicit_options_win():
    ref = get_method("ofedavg").config({"variant": "reference"})
    assert (ref.lr, ref.epochs, ref.softmax_before_ce, ref.weighting, ref.tau_schedule,
            ref.logit_adjust, ref.min_steps) == (1e-3, 10, True, "equal", "cosine", False, 0)
    mine = get_method("ofedavg").config({})
    assert (mine.variant, mine.lr, mine.epochs, mine.min_steps, mine.logit_adjust, mine.weighting,
            mine.tau_schedule, mine.softmax_before_ce) == ("fedalign", 0.01, 100, 300, True, "samples",
                                                           "fixed", False)
    assert get_method("ofedavg").config({"variant": "reference", "lr": "0.5"}).lr == 0.5
    cgs = get_method("fedcgs").config({"variant": "reference"})
    assert (cgs.ridge, cgs.ddof, cgs.covariance) == (0.0, 1, "total")
    assert get_method("fed3r").config({"variant": "reference"}).bias is True
    pft = get_method("fedpft").config({"variant": "reference"})
    assert (pft.gmm_tol, pft.gmm_max_iter, pft.optimizer, pft.lr, pft.batch_size, pft.epochs,
            pft.weight_decay, pft.components, pft.covariance) == (1e-12, 10000, "adamw", 1e-4, 32, 50,
                                                                  0.01, 10, "diag")
    k1 = get_method("fedpft-k1").config({"variant": "reference"})
    assert (k1.components, k1.covariance) == (1, "spherical")  # the preset still picks the GMM


def test_bad_variants():
    with pytest.raises(FedalignError, match="no reference implementation"):
        get_method("centralized").config({"variant": "reference"})
    with pytest.raises(FedalignError, match="variant must be one of"):
        get_method("fedcgs").config({"variant": "paper"})
    with pytest.raises(FedalignError, match="tau_schedule"):
        get_method("ofedavg").config({"tau_schedule": "linear"})
    with pytest.raises(FedalignError, match="tau_max"):
        get_method("ofedavg").config({"tau_max": "1.5"})


# ------------------------------------------------------------------------------ FedCGS reference
def test_fedcgs_reference_is_the_official_formula(clients):
    """γ = 0, S = (Σxxᵀ − Nμμᵀ)/(N − 1), W = M S⁻¹ (np.linalg.inv), b = −½μᵀS⁻¹μ + log(N_c/N)."""
    X, y = pooled(clients)
    X = X.astype(np.float64)
    N = len(y)
    mu = X.mean(0)
    S = (X.T @ X - N * np.outer(mu, mu)) / (N - 1)
    Si = np.linalg.inv(S)
    M = np.stack([X[y == c].mean(0) for c in range(C)])
    W = M @ Si
    b = np.array([-0.5 * M[c] @ Si @ M[c] + np.log(np.sum(y == c) / N) for c in range(C)])
    head, _ = run_method("fedcgs", clients, C, params={"variant": "reference"})
    assert np.allclose(head.W, W, rtol=1e-8, atol=1e-10) and np.allclose(head.b, b, rtol=1e-8)
    mine, _ = run_method("fedcgs", clients, C)
    assert not np.allclose(mine.W, W, rtol=1e-3)  # ridge 0.01, 1/N


# ------------------------------------------------------------------------------ Fed3R reference
def test_fed3r_reference_bias_column_and_absent_classes():
    cl = [blobs(60, 5, classes=3), blobs(40, 6, classes=3)]  # class 3 absent everywhere
    X, y = pooled(cl)
    Xt = np.hstack([X.astype(np.float64), np.ones((len(X), 1))])
    Wt = np.linalg.solve(0.01 * np.eye(D + 1) + Xt.T @ Xt, Xt.T @ np.eye(C)[y])
    W, beta = Wt[:-1], Wt[-1]
    norm = np.linalg.norm(W, axis=0)
    norm[norm == 0] = 1e-6
    head, msgs = run_method("fed3r", cl, C, params={"variant": "reference"})
    assert msgs[0]["G"].shape == (D + 1, D + 1)
    assert np.allclose(head.W, (W / norm).T, rtol=1e-8, atol=1e-12)
    assert np.allclose(head.b, beta / norm, rtol=1e-8, atol=1e-12)
    assert head.b[3] == 0 and np.all(head.W[3] == 0)  # absent: score 0, as the reference
    mine, _ = run_method("fed3r", cl, C)
    assert mine.b[3] == -np.inf and np.all(mine.b[:3] == 0)


# ------------------------------------------------------------------------------ FedPFT reference
def test_fedpft_reference_drops_small_classes_and_passes_em_settings(monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, D)).astype(np.float32)
    y = np.array([0] * 25 + [1] * 10 + [2] * 4 + [3])  # K = 10: class 1 (n = 10 ≤ K) is dropped
    seen = []
    from sklearn import mixture

    real = mixture.GaussianMixture

    class Spy(real):
        def fit(self, X_, y_=None):
            seen.append((self.n_components, self.tol, self.max_iter, len(X_)))
            return super().fit(X_)

    monkeypatch.setattr(mixture, "GaussianMixture", Spy)
    cfg = get_method("fedpft").config({"variant": "reference"})
    msg = fedpft.client_update(X, y, C, cfg, seed=0)
    assert seen == [(10, 1e-12, 10000, 25)]
    assert list(msg["counts"]) == [25, 0, 0, 0]  # nothing about a dropped class leaves the client
    assert list(msg["n_components"]) == [10, 0, 0, 0]
    seen.clear()
    mine = fedpft.client_update(X, y, C, get_method("fedpft").config({}), seed=0)
    assert list(mine["counts"]) == [25, 10, 4, 1] and mine["n_components"][1] >= 1
    assert all(t == 1e-3 and it == 100 for _, t, it, _ in seen)


def test_fedpft_reference_sampler_is_sklearns_with_a_fresh_stream_per_gmm():
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(size=(30, D)), rng.normal(size=(30, D)) + 5]).astype(np.float32)
    y = np.array([0] * 30 + [1] * 30)
    cfg = get_method("fedpft-k1").config({"variant": "reference"})
    msg = fedpft.client_update(X, y, C, cfg, seed=0)
    Xs, ys, _ = fedpft.synthesize([msg], C, seed=7, sampler="reference", covariance="spherical")
    from sklearn.mixture import GaussianMixture

    g = GaussianMixture(1, covariance_type="spherical", random_state=7)
    g.weights_ = np.ones(1)
    g.means_ = msg["means"][0, :1].astype(np.float32)
    g.covariances_ = msg["covariances"][0, :1].astype(np.float32)
    assert np.allclose(Xs[ys == 0], g.sample(30)[0].astype(np.float32))
    # same noise stream for every class GMM (the reference's RandomState(seed) per GMM)
    z0 = (Xs[ys == 0] - msg["means"][0, 0].astype(np.float32)) / np.sqrt(np.float32(msg["covariances"][0, 0]))
    z1 = (Xs[ys == 1] - msg["means"][1, 0].astype(np.float32)) / np.sqrt(np.float32(msg["covariances"][1, 0]))
    assert np.allclose(z0, z1, atol=1e-3)


# ------------------------------------------------------------------------------ O-FedAvg schedule
def test_cosine_schedule_is_the_references_reversed_cosine():
    s = ofedavg.cosine_schedule(10, 0.0, 0.4)
    ref = [0.5 * 0.4 * (1 + math.cos(math.pi * j / 10)) for j in range(10)][::-1]
    assert s == ref and s[-1] == 0.4 and s[0] == pytest.approx(0.2 * (1 + math.cos(0.9 * math.pi)))
    assert s[0] > 0 and all(a <= b for a, b in zip(s, s[1:]))
    assert ofedavg.cosine_schedule(1, 0.1, 0.7) == [0.7]
    cfg = get_method("ofedavg").config({"variant": "reference", "tau_max": "0.6", "rounds": "3"})
    assert [ofedavg.epoch_taus(cfg, 4, r) for r in range(3)] == [[t] * 4 for t in ofedavg.cosine_schedule(3, 0, 0.6)]


def test_transport_layer_trains_through_the_schedule(clients, monkeypatch):
    rng = np.random.default_rng(3)
    A = np.eye(D) + 0.1 * rng.normal(size=(D, D))
    A = 0.5 * (A + A.T)
    t = rng.normal(size=D)
    X, y = clients[0]
    # fixed τ through the layer == training on T_τ(X) computed the same way (float64)
    X64 = X.astype(np.float64)
    delta = X64 @ A.T + t - X64
    a = linear.train_softmax(X, y, C, epochs=3, lr=0.01, batch_size=16, seed=5, transport=(A, t),
                             taus=[0.3] * 3)
    b = linear.train_softmax(X64 + 0.3 * delta, y, C, epochs=3, lr=0.01, batch_size=16, seed=5)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    # ofedavg reference: the clients get the reversed cosine schedule of their epochs
    calls = []
    real = linear.train_softmax

    def spy(*args, **kw):
        calls.append(kw.get("taus"))
        return real(*args, **kw)

    monkeypatch.setattr(ofedavg, "train_softmax", spy)
    maps = [(A, t)] * len(clients)
    head, msgs = run_method("ofedavg", clients, C, seed=0, transports=maps,
                            params={"variant": "reference", "tau_max": "0.4"})
    assert calls == [ofedavg.cosine_schedule(10, 0.0, 0.4)] * 3
    fixed, _ = run_method("ofedavg", clients, C, seed=0, transports=maps,
                          params={"variant": "reference", "tau_max": "0.4", "tau_schedule": "fixed"})
    assert calls[-1] == [0.4] * 10 and not np.allclose(head.W, fixed.W)
    with pytest.raises(FedalignError, match="tau_max"):
        run_method("ofedavg", clients, C, transports=maps, params={"variant": "reference"})
    with pytest.raises(FedalignError, match="no transport layer"):
        run_method("fedcgs", clients, C, transports=maps)


def test_fedalign_ofedavg_converges_and_reports_its_loss(clients):
    head, msgs = run_method("ofedavg", clients, C, seed=0)
    losses = [float(m["loss"]) for m in msgs]
    assert head.info["client_losses"] == losses
    n = np.array([len(c[1]) for c in clients])
    assert head.info["train_loss"] == pytest.approx(np.average(losses, weights=n))
    assert head.info["train_loss"] < 0.05  # converged
    ref, _ = run_method("ofedavg", clients, C, seed=0, params={"variant": "reference"})
    assert ref.info["train_loss"] > 0.5  # 10 epochs at lr 1e-3 through a softmax: not converged
    Xt, yt = blobs(300, 11, shift=0.2)
    assert head.accuracy(Xt, yt) > 0.9


def test_logit_adjustment_ignores_classes_a_client_lacks():
    X, y = blobs(50, 4, classes=2)  # classes 2 and 3 absent at this client
    init = linear.default_init(D, C, 0)
    with np.errstate(divide="ignore"):
        off = np.log(np.bincount(y, minlength=C) / len(y))
    W, b = linear.train_softmax(X, y, C, epochs=5, lr=0.1, batch_size=16, seed=0, init=init, logit_offset=off,
                                weight_decay=0.0)
    assert np.all(np.isfinite(W)) and np.all(np.isfinite(b))
    assert np.array_equal(W[2:], init[0][2:])  # no gradient


def test_several_rounds(clients):
    one, _ = run_method("ofedavg", clients, C, seed=0, params={"epochs": "2", "min_steps": "0"})
    two, msgs = run_method("ofedavg", clients, C, seed=0, params={"epochs": "2", "min_steps": "0", "rounds": "2"})
    assert len(two.info["rounds"]) == 2 and not np.allclose(one.W, two.W)
    assert two.info["rounds"][1]["train_loss"] <= two.info["rounds"][0]["train_loss"]


def test_epochs_for_gives_small_clients_enough_steps():
    assert linear.epochs_for(20, 64, 100, 300) == 300
    assert linear.epochs_for(1000, 64, 100, 300) == 100
    assert linear.epochs_for(130, 64, 10, 0) == 10
    assert client_seed(0, 1) != client_seed(1, 0)

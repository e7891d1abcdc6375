"""FedCGS and Fed3R: what a client sends and what the server makes of it, against numpy closed forms.

Exact messages: FedCGS's sums give the pooled class means and total covariance, whatever the
split; its LDA head and Fed3R's ridge head are the closed forms on the pooled rows. DP messages
(:mod:`fedalign.dp`): the released sums are the clipped labeled sums plus noise of the recorded
σ (σᵢ = Δᵢ / (μ √wᵢ), recomputed here from the sensitivities and shares), symmetric where a
matrix is, reproducible by seed; the server's post-processing (absent classes, PSD
projections, the noise floor 2σ√(K d)) is written out here in numpy on hand-made noisy messages.
Fast: the file runs once per mutant of the mutation runs (docs/mutation.md).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from fedalign.dp.release import SIMULATION_SEED, describe
from fedalign.errors import FedalignError
from fedalign.heads import fed3r, fedcgs

K, D = 5, 3          # classes, features (K ≠ D, so a transposed array shows up by its shape)
DP = dict(dp_epsilon=1.0, dp_delta=1e-5)


def _rows(n, seed, d=D, classes=K, scale=2.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = rng.normal(size=(classes, d))[y] * 3 + rng.normal(size=(n, d)) * scale
    return X, y


def _clip(X, C):
    norms = np.linalg.norm(X, axis=1)
    return X * np.minimum(1.0, C / norms)[:, None], int(np.sum(norms > C))


def _same_record(a, b):
    """Two JSON-like records equal, their floats to 1e-12 (relative)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (a, b)
        for k in a:
            _same_record(a[k], b[k])
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-12), (a, b)
    else:
        assert a == b and type(a) is type(b), (a, b)


def _psd(S):
    w, V = np.linalg.eigh(0.5 * (S + S.T))
    return (V * np.clip(w, 0.0, None)) @ V.T


def _assert_standard_normal(noise, sig, std_lo, std_hi):
    """Release − exact sums over seeds, divided by the recorded σ, look like N(0, 1): no draw
    beyond 6, mean within 0.3, std in (std_lo, std_hi), for every message key."""
    for k, zs in noise.items():
        z = np.concatenate(zs) / sig[k]
        assert np.abs(z).max() < 6 and abs(z.mean()) < 0.3, k
        assert std_lo < z.std() < std_hi, (k, z.std())


# ------------------------------------------------------------------------------ FedCGS, exact
@pytest.mark.parametrize("ddof", [0, 1])
def test_fedcgs_global_statistics_are_the_pooled_means_and_covariance(ddof):
    X, y = _rows(40, 0, classes=3)
    y[0], y[1:3] = 3, 4            # class 3 on one row, class 4 on two; class 5 absent
    cfg = fedcgs.Config(ddof=ddof)
    parts = [slice(0, 1), slice(1, 7), slice(7, 40)]
    msgs = [fedcgs.client_update(X[s], y[s], K + 1, cfg) for s in parts]
    Nc, Mc, mu, S = fedcgs.global_statistics(msgs, ddof)
    assert np.array_equal(Nc, np.bincount(y, minlength=K + 1))
    assert Nc[3] == 1 and Nc[4] == 2 and Nc[5] == 0
    for c in range(K):
        assert np.allclose(Mc[c], X[y == c].mean(axis=0), rtol=1e-12, atol=1e-12)
    assert np.array_equal(Mc[5], np.zeros(D))                # an absent class: a zero mean
    assert np.allclose(mu, X.mean(axis=0), rtol=1e-12, atol=1e-12)
    assert np.allclose(S, np.cov(X.T, ddof=ddof), rtol=1e-10, atol=1e-12)


def test_fedcgs_refuses_fewer_rows_than_its_normalisation_needs():
    X, y = _rows(2, 1)
    one = [fedcgs.client_update(X[:1], y[:1], K, fedcgs.Config())]
    two = [fedcgs.client_update(X, y, K, fedcgs.Config())]
    with pytest.raises(FedalignError, match=r"1 training rows in all, cannot normalise by N − 1"):
        fedcgs.global_statistics(one, ddof=1)
    assert np.all(fedcgs.global_statistics(one, ddof=0)[3] == 0)     # one row: S = 0
    S = fedcgs.global_statistics(two, ddof=1)[3]
    assert np.allclose(S, np.cov(X.T, ddof=1), atol=1e-12)


def test_fedcgs_lda_head_is_the_closed_form_with_a_one_row_class_and_an_absent_one():
    """Within-class covariance, N − 1 normalisation, no ridge: W = M S_w⁻¹ and
    b_c = −½ μ_cᵀ S_w⁻¹ μ_c + log(N_c/N) with S_w the pooled within-class scatter / (N − 1);
    a class with one row is a class like any other; an absent one gets W_c = 0, b_c = −∞, and
    no numpy warning on the way."""
    X, y = _rows(60, 2, classes=K - 2)
    y[5] = K - 2                   # class K − 2 on one row; class K − 1 absent
    cfg = fedcgs.Config(covariance="within", ridge=0.0, ddof=1)
    msgs = [fedcgs.client_update(X[:25], y[:25], K, cfg), fedcgs.client_update(X[25:], y[25:], K, cfg)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        head = fedcgs.server_aggregate(msgs, K, cfg)
    N = len(y)
    M = np.array([X[y == c].mean(axis=0) for c in range(K - 1)])
    Sw = sum((X[y == c] - M[c]).T @ (X[y == c] - M[c]) for c in range(K - 1)) / (N - 1)
    W = M @ np.linalg.inv(Sw)
    b = -0.5 * np.sum(W * M, axis=1) + np.log(np.bincount(y, minlength=K)[:K - 1] / N)
    assert np.allclose(head.W[:K - 1], W, rtol=1e-9, atol=1e-9 * np.abs(W).max())
    assert np.allclose(head.b[:K - 1], b, rtol=1e-9, atol=1e-9)
    assert np.isfinite(head.b[K - 2])
    assert np.array_equal(head.W[K - 1], np.zeros(D)) and head.b[K - 1] == -np.inf


def test_fedcgs_config_names_the_bad_option_and_accepts_the_ridge_bounds():
    for bad, word in [(dict(ddof=2), r"^fedcgs\.ddof must be 0"),
                      (dict(covariance="full"), r"^fedcgs\.covariance must be total or within"),
                      (dict(ridge=1.5), r"^fedcgs\.ridge must be in \[0, 1\]"),
                      (dict(ridge=-0.1), r"^fedcgs\.ridge must be in \[0, 1\]"),
                      (dict(dp_epsilon=0.0), r"^fedcgs\.dp_epsilon must be a positive"),
                      (dict(clip=3.0), r"^fedcgs\.dp_delta and fedcgs\.clip are for a DP message: "
                                       r"also give fedcgs\.dp_epsilon")]:
        with pytest.raises(FedalignError, match=word):
            fedcgs.Config(**bad).validate()
    for ridge in (0.0, 1.0):
        fedcgs.Config(ridge=ridge).validate()


# ------------------------------------------------------------------------------ FedCGS, DP
def _sigmas(spec, parts):
    """σᵢ = Δᵢ / (μ √(wᵢ / Σw)) of {name: (Δ, w)} (fedalign.dp.release)."""
    total = sum(w for _, w in parts.values())
    return {k: s / (spec.mu() * math.sqrt(w / total)) for k, (s, w) in parts.items()}


def test_fedcgs_dp_message_is_the_clipped_labeled_sums_plus_noise_of_the_recorded_sigma():
    C = 2.0
    cfg = fedcgs.Config(**DP, clip=C)
    X, y = _rows(30, 3)
    y[:4] = -1                                         # unlabeled rows: never released
    Xc, clipped = _clip(X[4:], C)
    yl = y[4:]
    assert 0 < clipped < len(yl)
    exact = dict(class_counts=np.bincount(yl, minlength=K).astype(float),
                 class_sums=np.eye(K)[yl].T @ Xc, sum_xx=Xc.T @ Xc)
    sig = _sigmas(cfg.spec(), dict(class_counts=(1.0, 0.05), class_sums=(C, 0.25), sum_xx=(C * C, 0.70)))
    noise = {k: [] for k in exact}
    for seed in range(40):
        m = fedcgs.client_update(X, y, K, cfg, seed=seed)
        assert set(m) == {"class_counts", "class_sums", "sum_x", "sum_xx", "clipped_fraction"}
        assert m["class_counts"].shape == (K,) and m["class_sums"].shape == (K, D)
        assert m["sum_x"].shape == (D,) and np.allclose(m["sum_x"], m["class_sums"].sum(axis=0))
        assert np.array_equal(m["sum_xx"], m["sum_xx"].T)
        assert m["clipped_fraction"] == clipped / len(yl)
        for k in exact:
            z = m[k] - exact[k]
            noise[k].append(z[np.triu_indices(D)] if k == "sum_xx" else z.ravel())
    _assert_standard_normal(noise, sig, 0.85, 1.15)


@pytest.mark.parametrize("head", [fedcgs, fed3r])
def test_dp_release_at_a_huge_budget_is_the_exact_clipped_sums(head):
    """ε = 1e9: σ is tiny, so the release is the exact sums of the clipped (labeled) rows; the
    rows share a large offset, so uncentred and centred sums differ by far more than σ."""
    C = 2.0
    cfg = head.Config(dp_epsilon=1e9, dp_delta=1e-5, clip=C)
    X, y = _rows(30, 10, scale=0.5)
    X = X / 3 + 1.0
    y[:3] = -1 if head is fedcgs else y[:3]
    keep = y >= 0
    Xc, clipped = _clip(X[keep], C)
    assert 0 < clipped < len(Xc)
    m = head.client_update(X, y, K, cfg, seed=1)
    if head is fedcgs:
        sig = _sigmas(cfg.spec(), dict(class_counts=(1.0, 0.05), class_sums=(C, 0.25), sum_xx=(C * C, 0.70)))
        exact = dict(class_counts=np.bincount(y[keep], minlength=K), class_sums=np.eye(K)[y[keep]].T @ Xc,
                     sum_x=Xc.sum(axis=0), sum_xx=Xc.T @ Xc)
        sig["sum_x"] = sig["class_sums"] * math.sqrt(K)
    else:
        sig = _sigmas(cfg.spec(), dict(G=(C * C, 0.70), B=(C, 0.30)))
        exact = dict(G=Xc.T @ Xc, B=Xc.T @ np.eye(K)[y])
    assert max(sig.values()) < 1e-3
    for k, v in exact.items():
        assert np.abs(m[k] - v).max() < 6 * sig[k], k


@pytest.mark.parametrize("head", [fedcgs, fed3r])
def test_dp_release_is_reproducible_by_seed_and_the_default_seed_is_0(head):
    cfg = head.Config(**DP, clip=2.0)
    X, y = _rows(20, 4)
    a, b = head.client_update(X, y, K, cfg, seed=7), head.client_update(X, y, K, cfg, seed=7)
    other, default = head.client_update(X, y, K, cfg, seed=8), head.client_update(X, y, K, cfg)
    zero = head.client_update(X, y, K, cfg, seed=0)
    for k in head.MESSAGE_KEYS:
        assert np.array_equal(a[k], b[k]) and not np.array_equal(a[k], other[k])
        assert np.array_equal(default[k], zero[k])
    exact = head.client_update(X, y, K, head.Config())          # and the exact message: no seed
    assert all(np.array_equal(exact[k], head.client_update(X, y, K, head.Config(), seed=3)[k])
               for k in head.MESSAGE_KEYS)


@pytest.mark.parametrize("head", [fedcgs, fed3r])
def test_clipped_fraction_of_a_one_row_client(head):
    X = np.array([[3.0, 4.0, 0.0], [0.1, 0.0, 0.0]])
    cfg = head.Config(**DP, clip=1.0)
    assert head.client_update(X[:1], np.array([1]), K, cfg)["clipped_fraction"] == 1.0
    if head is fedcgs:              # a fraction of the labeled rows: the unlabeled row is not one
        assert head.client_update(X, np.array([1, -1]), K, cfg)["clipped_fraction"] == 1.0


def _noisy_cgs_messages(tiny):
    """Two hand-made DP messages (K = 5, d = 3). Class totals: 0.6 (absent: below 1), exactly 1.0,
    1.5, and (unless ``tiny``) two large classes; Σxxᵀ makes S indefinite (noise)."""
    if tiny:
        counts = [np.array([0.3, 0.25, 0.5, 0.2, -0.1]), np.array([0.3, -0.25, 1.0, 0.1, 0.2])]
    else:
        counts = [np.array([0.3, 0.25, 0.5, 20.0, 14.0]), np.array([0.3, 0.75, 1.0, 11.0, 17.0])]
    rng = np.random.default_rng(5)
    msgs = []
    for k, c in enumerate(counts):
        sums = rng.normal(size=(K, D)) * 4 + c[:, None] * rng.normal(size=D)
        A = rng.normal(size=(D, D))
        sxx = (A @ A.T) * c.sum() - np.diag([5.0, 0.0, 0.0]) * (40 if not tiny else 3) * (k + 1)
        msgs.append(dict(class_counts=c, class_sums=sums, sum_x=sums.sum(axis=0), sum_xx=sxx,
                         clipped_fraction=np.float64(0.1 * (k + 1))))
    return msgs


def _cgs_oracle(msgs, cfg, sigma_xx):
    total = sum(m["class_counts"] for m in msgs)
    present = total >= 1.0
    Nc = np.where(present, total, 0.0)
    N = Nc.sum()
    sums = sum(m["class_sums"] for m in msgs)
    Mc = np.where(present[:, None], sums / np.where(present, Nc, 1.0)[:, None], 0.0)
    mu = sum(m["sum_x"] for m in msgs) / N
    S = sum(m["sum_xx"] for m in msgs) / N - np.outer(mu, mu)
    negative = [np.linalg.eigvalsh(S)[0]]          # what the PSD projections clip
    S = _psd(S)
    if cfg.covariance == "within":
        S = S - sum(Nc[c] / N * np.outer(Mc[c] - mu, Mc[c] - mu) for c in range(K))
        negative.append(np.linalg.eigvalsh(S)[0])
        S = _psd(S)
    floor = 2 * sigma_xx * math.sqrt(len(msgs) * D) / N
    Sigma = (1 - cfg.ridge) * S + cfg.ridge * np.trace(S) / D * np.eye(D) + floor * np.eye(D)
    W = Mc @ np.linalg.inv(Sigma)
    with np.errstate(divide="ignore"):
        b = np.where(present, -0.5 * np.sum(W * Mc, axis=1) + np.log(Nc / N), -np.inf)
    return np.where(present[:, None], W, 0.0), b, floor, negative


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("covariance", ["total", "within"])
def test_fedcgs_dp_server_post_processes_the_noisy_sums_as_documented(covariance, tiny):
    C = 2.0
    cfg = fedcgs.Config(**DP, clip=C, covariance=covariance)
    msgs = _noisy_cgs_messages(tiny)
    sig = _sigmas(cfg.spec(), dict(class_counts=(1.0, 0.05), class_sums=(C, 0.25), sum_xx=(C * C, 0.70)))
    W, b, floor, negative = _cgs_oracle(msgs, cfg, sig["sum_xx"])
    assert max(negative) < 0                                # each projection has work to do
    head = fedcgs.server_aggregate(msgs, K, cfg)
    assert np.allclose(head.W, W, rtol=1e-9, atol=1e-9 * np.abs(W).max())
    assert np.array_equal(np.isinf(head.b), np.isinf(b)) and head.b[0] == -np.inf
    assert np.allclose(head.b[1:], b[1:], rtol=1e-9, atol=1e-9)
    assert head.info["noise_floor"] == pytest.approx(floor, rel=1e-12)
    parts = dict(class_counts=(1.0, 0.05, K, False), class_sums=(C, 0.25, K * D, False),
                 sum_xx=(C * C, 0.70, D * (D + 1) // 2, True))
    _same_record(head.info["dp"], dict(record=dict(describe(cfg.spec(), parts), noise_seed=SIMULATION_SEED),
                                       clipped_fraction=[0.1, 0.2]))
    rec = head.info["dp"]["record"]["parts"]
    for k, s in sig.items():
        assert rec[k]["sigma"] == pytest.approx(s, rel=1e-12)
        assert rec[k]["sensitivity"] == parts[k][0] and rec[k]["coordinates"] == parts[k][2]
        assert rec[k]["symmetric"] is parts[k][3]


def test_fedcgs_dp_head_from_real_releases_matches_the_oracle():
    C = 2.0
    cfg = fedcgs.Config(**DP, clip=C, covariance="within")
    msgs = [fedcgs.client_update(*_rows(40, s), K, cfg, seed=s) for s in (1, 2)]
    sig = _sigmas(cfg.spec(), dict(class_counts=(1.0, 0.05), class_sums=(C, 0.25), sum_xx=(C * C, 0.70)))
    W, b, _, _ = _cgs_oracle(msgs, cfg, sig["sum_xx"])
    head = fedcgs.server_aggregate(msgs, K, cfg)
    assert np.allclose(head.W, W, rtol=1e-9, atol=1e-9 * np.abs(W).max())
    assert np.allclose(head.b, b, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------ Fed3R, exact
def _tilde(X, bias):
    return np.hstack([X, np.ones((len(X), 1))]) if bias else X


@pytest.mark.parametrize("bias", [False, True])
def test_fed3r_message_is_the_gram_and_one_hot_cross_products(bias):
    X, y = _rows(25, 6)
    m = fed3r.client_update(X, y, K, fed3r.Config(bias=bias))
    Xt = _tilde(X, bias)
    assert set(m) == {"G", "B"}
    assert np.allclose(m["G"], Xt.T @ Xt, rtol=1e-13) and np.allclose(m["B"], Xt.T @ np.eye(K)[y], rtol=1e-13)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_fed3r_head_is_the_ridge_closed_form_on_the_pooled_rows(bias, normalize):
    """W̃ = (X̃ᵀX̃ + λI)⁻¹ X̃ᵀY on the pooled rows, split into W and β, both divided by ‖W_c‖
    with ``normalize``; an absent class (the last) scores −∞."""
    X, y = _rows(50, 7, classes=K - 1)
    cfg = fed3r.Config(bias=bias, normalize=normalize, lam=0.3)
    msgs = [fed3r.client_update(X[:20], y[:20], K, cfg), fed3r.client_update(X[20:], y[20:], K, cfg)]
    head = fed3r.server_aggregate(msgs, K, cfg)
    Xt = _tilde(X, bias)
    Wt = np.linalg.solve(Xt.T @ Xt + 0.3 * np.eye(Xt.shape[1]), Xt.T @ np.eye(K)[y])
    W, beta = Wt[:D], (Wt[D] if bias else np.zeros(K))
    if normalize:
        n = np.linalg.norm(W[:, :K - 1], axis=0)
        W, beta = W[:, :K - 1] / n, beta[:K - 1] / n
    assert np.allclose(head.W[:K - 1], W[:, :K - 1].T, rtol=1e-9, atol=1e-12)
    assert np.allclose(head.b[:K - 1], beta[:K - 1], rtol=1e-9, atol=1e-12)
    assert np.array_equal(head.W[K - 1], np.zeros(D)) and head.b[K - 1] == -np.inf


def test_fed3r_config_refuses_a_zero_ridge_and_names_its_dp_options():
    with pytest.raises(FedalignError, match=r"^fed3r\.lam must be positive, got 0"):
        fed3r.Config(lam=0.0).validate()
    fed3r.Config(lam=1e-9).validate()
    for bad, word in [(dict(dp_epsilon=-1.0), r"^fed3r\.dp_epsilon must be a positive"),
                      (dict(clip=3.0), r"^fed3r\.dp_delta and fed3r\.clip are for a DP message: "
                                       r"also give fed3r\.dp_epsilon")]:
        with pytest.raises(FedalignError, match=word):
            fed3r.Config(**bad).validate()


# ------------------------------------------------------------------------------ Fed3R, DP
def _fed3r_sens(C, bias):
    return (math.sqrt(C ** 4 + C * C + 1), math.sqrt(C * C + 1)) if bias else (C * C, C)


@pytest.mark.parametrize("bias", [False, True])
def test_fed3r_dp_message_is_the_clipped_gram_plus_noise_of_the_recorded_sigma(bias):
    C = 1.0                                  # C² = C = 1: the bias column's sensitivities differ most
    cfg = fed3r.Config(**DP, clip=C, bias=bias)
    X, y = _rows(30, 8, scale=0.3)
    X = X / 4
    Xc, clipped = _clip(X, C)
    assert 0 < clipped < len(y)
    Xt = _tilde(Xc, bias)
    exact = dict(G=Xt.T @ Xt, B=Xt.T @ np.eye(K)[y])
    sG, sB = _fed3r_sens(C, bias)
    sig = _sigmas(cfg.spec(), dict(G=(sG, 0.70), B=(sB, 0.30)))
    noise = {"G": [], "B": []}
    dt = D + bias
    for seed in range(40):
        m = fed3r.client_update(X, y, K, cfg, seed=seed)
        assert set(m) == {"G", "B", "clipped_fraction"}
        assert m["G"].shape == (dt, dt) and m["B"].shape == (dt, K)
        assert np.array_equal(m["G"], m["G"].T)
        assert m["clipped_fraction"] == clipped / len(y)
        noise["G"].append((m["G"] - exact["G"])[np.triu_indices(dt)])
        noise["B"].append((m["B"] - exact["B"]).ravel())
    _assert_standard_normal(noise, sig, 0.88, 1.12)


@pytest.mark.parametrize("bias", [False, True])
def test_fed3r_dp_server_solves_with_the_psd_projection_and_the_noise_floor(bias):
    """(P(ΣG) + (λ + 2σ_G √(K d̃)) I)⁻¹ ΣB, P the PSD projection, then the usual split and
    normalisation; the record is the release's."""
    C = 1.5
    cfg = fed3r.Config(**DP, clip=C, bias=bias)
    dt = D + bias
    rng = np.random.default_rng(9)
    msgs = []
    for k in range(3):
        A = rng.normal(size=(dt, dt))
        G = A @ A.T - np.diag(np.r_[30.0, np.zeros(dt - 1)])          # indefinite: noise
        msgs.append(dict(G=G, B=rng.normal(size=(dt, K)) * 5, clipped_fraction=np.float64(k / 4)))
    G, B = sum(m["G"] for m in msgs), sum(m["B"] for m in msgs)
    assert np.linalg.eigvalsh(G)[0] < 0
    sG, sB = _fed3r_sens(C, bias)
    sig = _sigmas(cfg.spec(), dict(G=(sG, 0.70), B=(sB, 0.30)))
    lam = 0.01 + 2 * sig["G"] * math.sqrt(3 * dt)
    Wt = np.linalg.solve(_psd(G) + lam * np.eye(dt), B)
    W, beta = Wt[:D], (Wt[D] if bias else np.zeros(K))
    n = np.linalg.norm(W, axis=0)
    head = fed3r.server_aggregate(msgs, K, cfg)
    assert np.allclose(head.W, (W / n).T, rtol=1e-9, atol=1e-12)
    assert np.allclose(head.b, beta / n, rtol=1e-9, atol=1e-12)
    assert head.info["ridge_dp"] == pytest.approx(lam, rel=1e-12)
    parts = dict(G=(sG, 0.70, dt * (dt + 1) // 2, True), B=(sB, 0.30, dt * K, False))
    _same_record(head.info["dp"], dict(record=dict(describe(cfg.spec(), parts), noise_seed=SIMULATION_SEED),
                                       clipped_fraction=[0.0, 0.25, 0.5]))
    rec = head.info["dp"]["record"]["parts"]
    for k, s in sig.items():
        assert rec[k]["sigma"] == pytest.approx(s, rel=1e-12) and rec[k]["sensitivity"] == parts[k][0]
        assert rec[k]["coordinates"] == parts[k][2] and rec[k]["symmetric"] is parts[k][3]

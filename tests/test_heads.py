"""Heads: closed forms against centralized oracles, O-FedAvg averaging, and what leaves a client."""

from __future__ import annotations

import numpy as np
import pytest

from fedalign.errors import FedalignError
from fedalign.heads import METHODS, LinearHead, check_labels, client_seed, get_method, run_method
from fedalign.heads import fedpft, ofedavg
from fedalign.heads.linear import train_softmax

from heads_data import C, D, blobs, clients, pooled  # noqa: F401 (clients: a fixture)



def test_fedcgs_equals_sklearn_lda_on_pooled_data(clients):
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    X, y = pooled(clients)
    for ridge in (0.0, 0.2):
        head, _ = run_method("fedcgs", clients, C, params={"covariance": "within", "ridge": ridge})
        lda = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=ridge or None).fit(X.astype(np.float64), y)
        assert np.allclose(head.W, lda.coef_, rtol=1e-8, atol=1e-8 * np.abs(lda.coef_).max())
        assert np.allclose(head.b, lda.intercept_, rtol=1e-8, atol=1e-8)


def test_fedcgs_and_fed3r_do_not_depend_on_the_partition(clients):
    X, y = pooled(clients)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    other = [(X[order[:20]], y[order[:20]]), (X[order[20:]], y[order[20:]])]
    for m in ("fedcgs", "fed3r"):
        a, _ = run_method(m, clients, C)
        b, _ = run_method(m, [(X, y)], C)
        c, _ = run_method(m, other, C)
        for h in (b, c):
            assert np.allclose(a.W, h.W, rtol=1e-9, atol=1e-9) and np.allclose(a.b, h.b, atol=1e-9)


def test_fed3r_equals_sklearn_ridge(clients):
    from sklearn.linear_model import Ridge

    X, y = pooled(clients)
    Y = np.eye(C)[y]
    coef = Ridge(alpha=0.01, fit_intercept=False, solver="cholesky").fit(X.astype(np.float64), Y).coef_
    coef = coef / np.linalg.norm(coef, axis=1, keepdims=True)
    head, _ = run_method("fed3r", clients, C)
    assert np.allclose(head.W, coef, rtol=1e-7, atol=1e-9)
    assert np.all(head.b == 0)


def test_absent_class_is_never_predicted():
    cl = [blobs(60, 5, classes=3), blobs(40, 6, classes=3)]  # class 3 absent everywhere
    Xt, _ = blobs(200, 7)
    for m in ("fedcgs", "fed3r"):
        head, _ = run_method(m, cl, C)
        assert head.b[3] == -np.inf and np.all(np.isfinite(head.b[:3]))
        assert 3 not in set(head.predict(Xt))


def test_ofedavg_one_client_equals_local_training(clients):
    # reference variant: the SLOT-Align code's settings, softmax before the cross-entropy
    params = {"epochs": 3, "variant": "reference"}
    cfg = get_method("ofedavg").config(params)
    head, msgs = run_method("ofedavg", clients[:1], C, seed=4, params=params)
    init = ofedavg.server_init(D, C, cfg, 4)
    W, b = train_softmax(*clients[0], C, epochs=3, lr=1e-3, batch_size=64, seed=client_seed(4, 0),
                         init=(init["W"], init["b"]), softmax_before_ce=True)
    assert np.array_equal(head.W, W) and np.array_equal(head.b, b)
    # fedalign variant: lr 0.01, at least min_steps steps, logit-adjusted by the client's prior
    cfg = get_method("ofedavg").config({})
    head, _ = run_method("ofedavg", clients[:1], C, seed=4)
    X, y = clients[0]
    prior = np.bincount(y, minlength=C) / len(y)
    with np.errstate(divide="ignore"):
        W, b = train_softmax(X, y, C, epochs=max(100, 300), lr=0.01, batch_size=64, seed=client_seed(4, 0),
                             init=(init["W"], init["b"]), logit_offset=np.log(prior))
    assert cfg.min_steps == 300 and cfg.epochs == 100 and len(y) <= 64  # one batch per epoch
    assert np.array_equal(head.W, W) and np.array_equal(head.b, b)


def test_ofedavg_averages_once(clients):
    for weighting in ("equal", "samples"):
        params = {"epochs": 2, "weighting": weighting}
        head, msgs = run_method("ofedavg", clients, C, seed=0, params=params)
        n = np.array([len(c[1]) for c in clients], float)
        w = n / n.sum() if weighting == "samples" else np.full(3, 1 / 3)
        assert np.allclose(head.W, sum(wk * m["W"] for wk, m in zip(w, msgs)), rtol=1e-12)
        assert [int(m["n"]) for m in msgs] == [53, 71, 37]
    # the clients start from the same broadcast, then diverge
    assert not np.allclose(msgs[0]["W"], msgs[1]["W"])


def test_training_learns_and_is_deterministic(clients):
    Xt, yt = blobs(300, 11, shift=0.2)
    for m, params in [("ofedavg", {"epochs": 20, "lr": 0.01}), ("centralized", {"epochs": 10}),
                      ("fedpft", {"epochs": 10, "components": 2}), ("fedpft-k1", {"epochs": 10, "lr": 0.01})]:
        h1, _ = run_method(m, clients, C, seed=1, params=params)
        h2, _ = run_method(m, clients, C, seed=1, params=params)
        h3, _ = run_method(m, clients, C, seed=2, params=params)
        assert np.array_equal(h1.W, h2.W), m
        assert not np.array_equal(h1.W, h3.W), m
        assert h1.accuracy(Xt, yt) > 0.85, (m, h1.accuracy(Xt, yt))


def test_softmax_before_ce_option_changes_training(clients):
    a, _ = run_method("ofedavg", clients, C, params={"epochs": 2})
    b, _ = run_method("ofedavg", clients, C, params={"epochs": 2, "softmax_before_ce": "true"})
    assert not np.allclose(a.W, b.W)


@pytest.mark.parametrize("name", [m for m in METHODS if m != "centralized"])
def test_messages_hold_aggregates_only(clients, name):
    params = {"epochs": 1} if name.startswith(("fedpft", "ofedavg")) else {}
    _, msgs = run_method(name, clients, C, params=params)
    mod = get_method(name).load()
    for (X, y), msg in zip(clients, msgs):
        assert set(msg) == set(mod.MESSAGE_KEYS)
        rows = {tuple(np.round(r, 2)) for r in X.astype(np.float64)}
        for key, a in msg.items():
            a = np.asarray(a)
            assert len(y) not in a.shape, (name, key, a.shape)  # no per-sample axis
            if a.ndim >= 1 and a.shape[-1] == D:
                flat = a.reshape(-1, D).astype(np.float64)
                assert not any(tuple(np.round(r, 2)) in rows for r in flat), (name, key)


def test_centralized_is_the_only_raw_method(clients):
    _, msgs = run_method("centralized", clients, C, params={"epochs": 1})
    assert np.array_equal(msgs[0]["X"], clients[0][0])
    assert get_method("centralized").load().SHARES_RAW_DATA


def _mixture_moments(msg, c, covariance):
    """Mean (D,) and covariance (D, D) of the class-c mixture a FedPFT message sends."""
    k = int(msg["n_components"][c])
    w = msg["weights"][c, :k].astype(np.float64)
    w = w / w.sum()
    mu = msg["means"][c, :k].astype(np.float64)
    S = msg["covariances"][c, :k].astype(np.float64)
    S = {"spherical": lambda: S[:, None, None] * np.eye(D),
         "diag": lambda: np.stack([np.diag(s) for s in S]), "full": lambda: S}[covariance]()
    mean = w @ mu
    second = np.einsum("k,kij->ij", w, S + mu[:, :, None] * mu[:, None, :])
    return mean, second - np.outer(mean, mean)


def _check_class_moments(msg, X, y, c, covariance):
    """EM's M-step fixes the mixture's first two moments to the class's: its mean is the class
    mean, its covariance the class's (biased) covariance plus scikit-learn's reg_covar 1e-6 on
    the diagonal — all of it (full), its diagonal (diag) or its trace (spherical)."""
    Xc = X[y == c].astype(np.float64)
    mean, cov = _mixture_moments(msg, c, covariance)
    want = np.cov(Xc.T, bias=True) + 1e-6 * np.eye(D)
    np.testing.assert_allclose(mean, Xc.mean(0), atol=5e-3)          # float16 parameters
    got, ref = {"full": (cov, want), "diag": (np.diag(cov), np.diag(want)),
                "spherical": (np.trace(cov), np.trace(want))}[covariance]
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=5e-3)


def test_fedpft_message_float16_and_few_samples():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, D)).astype(np.float32)
    y = np.array([0] * 24 + [1] * 5 + [2])  # 24, 5 and 1 samples; class 3 absent
    X[y == 1] += 4.0                        # class 1 elsewhere: the class GMMs are told apart
    cfg = get_method("fedpft").config({"components": 10})
    msg = fedpft.client_update(X, y, C, cfg, seed=0)
    for k in ("weights", "means", "covariances"):
        assert msg[k].dtype == np.float16
    for c in (0, 1):                        # each class's GMM holds that class's moments
        _check_class_moments(msg, X, y, c, "diag")
    assert list(msg["counts"]) == [24, 5, 1, 0]
    nc = msg["n_components"]
    assert 1 <= nc[0] <= 10 and 1 <= nc[1] <= 2 and nc[2] == 0 and nc[3] == 0  # ≤ ⌊n/2⌋, ≤ K
    for c in range(C):  # every sent component carries ≥ 2 samples of weight; padding is zeros
        w = msg["weights"][c].astype(float)
        assert np.all(w[: nc[c]] * msg["counts"][c] >= 2 - 0.05)
        assert not np.any(w[nc[c]:]) and not np.any(msg["means"][c, nc[c]:])
        assert not np.any(msg["covariances"][c, nc[c]:])
    Xs, ys, report = fedpft.synthesize([msg], C, seed=0)
    assert np.bincount(ys, minlength=C).tolist() == [24, 5, 0, 0]
    assert report["unfitted"] == [(0, 2, 1)]
    # the notes travel with the head (no module-global report)
    head = fedpft.server_aggregate([msg], C, get_method("fedpft").config({"epochs": 1}), seed=0)
    assert head.notes == ["client 0 class 2: a single sample, no GMM fitted (count sent)"]
    assert head.info["unfitted"] == [(0, 2, 1)] and not hasattr(fedpft, "LAST_REPORT")
    for cov in ("spherical", "full"):
        cfg2 = get_method("fedpft").config({"components": 2, "covariance": cov})
        m2 = fedpft.client_update(X, y, C, cfg2, seed=0)
        for c in (0, 1):
            _check_class_moments(m2, X, y, c, cov)
        # the server draws each class from that class's GMM: with the counts scaled up, the
        # synthetic rows of class c have the moments of the GMM class c sent
        big = dict(m2, counts=np.array([20_000, 20_000, 0, 0]))
        Xs, ys, _ = fedpft.synthesize([big], C, seed=0)
        assert np.bincount(ys, minlength=C).tolist() == [20_000, 20_000, 0, 0]
        for c in (0, 1):
            mean, S = _mixture_moments(m2, c, cov)
            Z = Xs[ys == c].astype(np.float64)
            np.testing.assert_allclose(Z.mean(0), mean, atol=0.05)
            np.testing.assert_allclose(np.cov(Z.T), S, rtol=0.1, atol=0.05)


def test_bad_options():
    with pytest.raises(FedalignError, match="unknown method"):
        get_method("fedsomething")
    with pytest.raises(FedalignError, match="unknown option"):
        get_method("fedcgs").config({"lr": "1"})
    with pytest.raises(FedalignError, match="cannot read"):
        get_method("ofedavg").config({"epochs": "ten"})
    with pytest.raises(FedalignError, match="weighting"):
        get_method("ofedavg").config({"weighting": "random"})


def test_linear_head_accuracy_ignores_unlabeled():
    h = LinearHead(np.eye(2), np.zeros(2))
    assert h.accuracy(np.array([[1.0, 0], [0, 1], [0, 1]]), np.array([0, 0, -1])) == 0.5


def test_one_accuracy_for_heads_and_dadil():
    """LinearHead.accuracy and dadil's accuracy are fedalign.metrics.accuracy: same value,
    same error on no labelled row."""
    from fedalign import metrics
    from fedalign.dadil import accuracy as dadil_accuracy

    assert dadil_accuracy is metrics.accuracy
    h = LinearHead(np.eye(2), np.zeros(2))
    X, y = np.array([[1.0, 0], [0, 1], [0, 1]]), np.array([0, 1, -1])
    assert h.accuracy(X, y) == metrics.accuracy(h.predict, X, y) == 1.0
    for score in (lambda: h.accuracy(X, [-1, -1, -1]),
                  lambda: dadil_accuracy(h.predict, X, [-1, -1, -1])):
        with pytest.raises(FedalignError, match="no labeled rows to score"):
            score()


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("bad", [-1, 3])
def test_every_head_refuses_labels_outside_the_classes(method, bad):
    # an unlabeled row (−1) would be summed into FedCGS's Σx but no class, or one-hot
    # encoded as the last class by Fed3R and O-FedAvg, silently
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    y = np.r_[rng.integers(0, 3, 29), bad]
    with pytest.raises(FedalignError, match=f"classes 0…2, got {bad}"):
        run_method(method, [(X, y)], 3)


def test_check_labels_returns_int64_and_names_the_first_label_it_refuses():
    # the whole line: the first label outside [0, C); for labels in range that are not
    # integers, their dtype; for labels that are not numbers, the first one (no traceback)
    assert check_labels(np.array([2, 0, 1], dtype=np.uint8), 3).dtype == np.int64
    for y, got in (([0, -1, 5], "-1"), ([0.5, 7.0], "7.0"), ([0.0, 1.0], "float64"),
                   (["a", "b"], "a"), ([True, False], "True")):
        with pytest.raises(FedalignError) as e:
            check_labels(np.array(y), 3)
        assert str(e.value) == (f"a client's labels must be classes 0…2, got {got} "
                                "(drop unlabeled rows, label −1, before training a head)")

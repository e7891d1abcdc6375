"""The target's lda head (fedalign.dadil.target_head) and FedCGS's diagonal shrinkage."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from fedalign.dadil import target_head as th
from fedalign.dadil.evaluation import evaluate_target
from fedalign.errors import FedalignError
from fedalign.gmm import GMM, fit_gmm, map_predict
from fedalign.gmm_head import train_head_from_gmm
from fedalign.heads import fedcgs

C, D = 3, 6


def domain(rng, n, shift, scales):
    """C shifted blobs with very different per-feature scales."""
    y = rng.integers(0, C, n)
    X = (rng.normal(size=(n, D)) + 3.0 * np.eye(C, D)[y] + shift) * scales
    return X, y


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    scales = np.array([1e-2, 1.0, 10.0, 1.0, 1e2, 1.0])
    srcs = [domain(rng, 150, k * 0.3, scales) for k in range(3)]
    Xt, yt = domain(rng, 200, 0.45, scales)
    return srcs, Xt, yt


def test_path_heads_equal_fedcgs_at_every_grid_point(data):
    srcs, _, _ = data
    msgs = [th.class_statistics(X, y, C) for X, y in srcs]
    for g, h in zip(th.SHRINKAGE_GRID, th._path_heads(msgs, C, th.SHRINKAGE_GRID)):
        ref = th.lda_from_statistics(msgs, C, *g)
        np.testing.assert_allclose(h.W, ref.W, rtol=1e-9, atol=1e-12 * np.abs(ref.W).max())
        np.testing.assert_allclose(h.b, ref.b, rtol=1e-9, atol=1e-9)


def test_diagonal_shrinkage_is_identity_shrinkage_on_standardised_features(data):
    srcs, Xt, _ = data
    X = np.vstack([s[0] for s in srcs])
    y = np.concatenate([s[1] for s in srcs])
    sd = X.std(0)
    diag = fedcgs.Config(covariance="within", ridge=0.3, shrink_to="diagonal")
    ident = fedcgs.Config(covariance="within", ridge=0.3)
    h_d = fedcgs.server_aggregate([fedcgs.client_update(X, y, C, diag)], C, diag)
    h_i = fedcgs.server_aggregate([fedcgs.client_update(X / sd, y, C, ident)], C, ident)
    np.testing.assert_allclose(h_d.scores(Xt), h_i.scores(Xt / sd), rtol=1e-9, atol=1e-9)
    # and the identity rule is scikit-learn's shrunk LDA on the standardised rows
    sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=0.3).fit(X / sd, y)
    np.testing.assert_array_equal(h_i.predict(Xt / sd), sk.predict(Xt / sd))
    with pytest.raises(FedalignError, match="shrink_to must be"):
        fedcgs.Config(shrink_to="ledoit").validate()


def test_choose_shrinkage_is_leave_one_source_domain_out(data):
    srcs, _, _ = data
    (r, t), rec = th.choose_shrinkage(srcs, C)
    assert rec["shrinkage_rule"] == "leave-one-source-domain-out"
    for g, score in zip(th.SHRINKAGE_GRID, rec["scores"]):     # the oracle: fold by fold
        accs = []
        for i, (Xi, yi) in enumerate(srcs):
            others = [th.class_statistics(X, y, C) for j, (X, y) in enumerate(srcs) if j != i]
            accs.append(np.mean(th.lda_from_statistics(others, C, *g).predict(Xi) == yi))
        assert score == pytest.approx(np.mean(accs), abs=1e-12)
    assert rec["scores"][th.SHRINKAGE_GRID.index((r, t))] == max(rec["scores"])
    assert th.choose_shrinkage(srcs[:1], C)[0] == th.DEFAULT_SHRINKAGE


def test_target_head_learns_from_pseudo_labels_and_never_reads_target_labels(data):
    srcs, Xt, yt = data
    B = fit_gmm(Xt, yt, 2, n_classes=C, seed=0)           # a barycenter that knows the target
    h = th.fit_target_head(B, Xt, srcs, C)
    assert np.mean(h.predict(Xt) == yt) > 0.9
    assert sum(h.record["pseudo_label_counts"]) == len(Xt) and h.record["n_target_rows"] == len(Xt)
    # a barycenter that labels the target's clusters wrongly: its pseudo-labels are used
    # (the head gets worse), the target's true labels are never read
    bad = fit_gmm(Xt, (yt + 1) % C, 2, n_classes=C, seed=0)
    hb = th.fit_target_head(bad, Xt, srcs, C)              # the one-pass head (the default)
    np.testing.assert_array_equal(hb.record["pseudo_label_counts"],
                                  np.bincount(map_predict(bad, Xt), minlength=C))
    assert hb.record["classification_em"]["iterations"] == 0
    assert np.mean(hb.predict(Xt) == yt) < np.mean(h.predict(Xt) == yt) - 0.02
    # classification EM moves the wrong labels towards the sources' classes
    hc = th.fit_target_head(bad, Xt, srcs, C, cem_iter=10)
    cem = hc.record["classification_em"]
    assert cem["iterations"] >= 1 and cem["changed"][0] > 0
    assert np.mean(hc.predict(Xt) == yt) > np.mean(hb.predict(Xt) == yt)


def test_target_head_bad_inputs(data):
    srcs, Xt, yt = data
    B = fit_gmm(Xt, yt, 1, n_classes=C, seed=0)
    with pytest.raises(FedalignError, match="adaptation rows"):
        th.fit_target_head(B, Xt[:, :3], srcs, C)
    with pytest.raises(FedalignError, match="labeled sources"):
        th.target_rows(Xt, [], C)
    with pytest.raises(FedalignError, match="d=3"):
        th.target_rows(Xt, [(srcs[0][0][:, :3], srcs[0][1])], C)
    with pytest.raises(FedalignError, match="out of range"):
        th.target_rows(Xt, [(srcs[0][0], srcs[0][1] + C)], C)
    with pytest.raises(FedalignError, match="no labels"):
        th.fit_target_head(fit_gmm(Xt, None, 3, n_classes=C, seed=0), Xt, srcs, C)


def test_evaluate_target_adds_the_lda_rows_only_with_the_target_rows(data):
    srcs, Xt, yt = data
    res = evaluate_target(Xt, yt, sources=srcs, oracle_gmm=fit_gmm(Xt, yt, 1, n_classes=C),
                          target_adapt=Xt, seeds=[0, 1])
    assert set(res.accuracy["oracle"]) == {"linear", "map", "lda"}
    assert res.accuracy["oracle"]["lda"][0] == res.accuracy["oracle"]["lda"][1]
    assert res.records["lda head"]["shrinkage_rule"] == "leave-one-source-domain-out"
    plain = evaluate_target(Xt, yt, sources=srcs, oracle_gmm=fit_gmm(Xt, yt, 1, n_classes=C))
    assert set(plain.accuracy["oracle"]) == {"linear", "map"}
    with pytest.raises(FedalignError, match="lda head needs"):
        evaluate_target(Xt, yt, sources=srcs, oracle_gmm=fit_gmm(Xt, yt, 1, n_classes=C),
                        classifiers=["lda"])


def test_auto_head_is_the_head_the_source_rule_chose_and_never_reads_target_labels(data):
    srcs, Xt, yt = data
    gmms = [fit_gmm(X, y, 1, n_classes=C, seed=0) for X, y in srcs]
    oracle = fit_gmm(Xt, yt, 1, n_classes=C)
    kw = dict(sources=srcs, oracle_gmm=oracle, target_adapt=Xt, seeds=[0, 1],
              head_source_gmms=gmms)
    res = evaluate_target(Xt, yt, **kw)
    rule = res.records["lda head"]["head_rule"]
    assert len(rule["lda"]) == len(rule["linear"]) == len(srcs)
    assert rule["choice"] == ("lda" if np.mean(rule["lda"]) >= np.mean(rule["linear"])
                              else "linear")
    assert res.accuracy["oracle"]["auto"] == res.accuracy["oracle"][rule["choice"]]
    # the rule sees no target label: other test labels, same choice and same scores
    other = evaluate_target(Xt, (yt + 1) % C, **kw).records["lda head"]["head_rule"]
    assert other == rule
    # source 0's scores with each stand-in: lda = the others' statistics plus half A
    # pseudo-labeled by the stand-in (one pass: the rule scores the one-pass lda head), linear = samples of the stand-in, both on half B
    X0, y0 = srcs[0]
    perm = np.random.default_rng([0, 0, 29]).permutation(len(y0))
    a, b = perm[: len(y0) // 2], perm[len(y0) // 2:]
    rows = th.target_rows(Xt, srcs, C)
    others = [th.class_statistics(X, y, C) for X, y in srcs[1:]]
    g_a = fit_gmm(X0[a], y0[a], 1, n_classes=C, seed=0)   # G_0 refitted on half A alone
    transfer = th.lda_from_statistics(others, C, *rows.shrinkage).predict(g_a.means)
    for name, labels in (("own labels", g_a.labels), ("transferred", np.eye(C)[transfer])):
        g = g_a if name == "own labels" else th.relabeled(g_a, others, *rows.shrinkage)
        assert np.array_equal(g.labels, labels)
        msgs = others + [th.class_statistics(X0[a], map_predict(g, X0[a]), C)]
        head = th.lda_from_statistics(msgs, C, *rows.shrinkage)     # one pass, no CEM
        got = rule["stand_ins"][name]
        assert got["lda"][0] == pytest.approx(np.mean(head.predict(X0[b]) == y0[b]))
        lin = train_head_from_gmm(g, n_per_class=500, seed=0)
        assert got["linear"][0] == pytest.approx(np.mean(lin.predict(X0[b]) == y0[b]))
    # the rule's score of each head: the mean over the two stand-ins
    for h in ("lda", "linear"):
        assert rule[h] == pytest.approx([0.5 * (p + q) for p, q in
                                         zip(rule["stand_ins"]["own labels"][h],
                                             rule["stand_ins"]["transferred"][h])])


def test_head_rule_scores_the_linear_head_out_of_sample():
    # labels that carry no signal: a GMM of many components per class memorises its rows, so
    # a linear head on its samples scores far above chance on rows the GMM was fitted on; on
    # the rule's half B (not fitted) it must score about chance
    rng = np.random.default_rng(1)
    srcs = [(rng.normal(size=(80, 40)), rng.integers(0, 2, 80)) for _ in range(3)]
    Xt = rng.normal(size=(60, 40))
    gmms = [fit_gmm(X, y, 10, n_classes=2, seed=0) for X, y in srcs]
    inside = [np.mean(train_head_from_gmm(g, 500, 0).predict(X) == y)
              for g, (X, y) in zip(gmms, srcs)]
    rows = th.target_rows(Xt, srcs, 2)
    th.choose_head(rows, gmms, srcs)
    assert np.mean(inside) > 0.75
    assert np.mean(rows.record["head_rule"]["linear"]) < 0.62   # 0.53 (in-sample: 0.80)


def test_auto_head_bad_inputs(data):
    srcs, Xt, yt = data
    oracle = fit_gmm(Xt, yt, 1, n_classes=C)
    with pytest.raises(FedalignError, match="auto head needs"):
        evaluate_target(Xt, yt, sources=srcs, oracle_gmm=oracle, target_adapt=Xt,
                        classifiers=["auto"])
    gmms = [fit_gmm(X, y, 1, n_classes=C, seed=0) for X, y in srcs]
    with pytest.raises(FedalignError, match="one labeled GMM per source"):
        th.choose_head(th.target_rows(Xt, srcs, C), gmms[:2], srcs)
    with pytest.raises(FedalignError, match="unlabeled"):
        th.choose_head(th.target_rows(Xt, srcs, C), [fit_gmm(X, None, 1, n_classes=C)
                                                     for X, _ in srcs], srcs)


def test_head_rule_a_source_too_small_to_play_the_target_abstains(data):
    srcs, Xt, _ = data
    tiny = (srcs[0][0][:3], np.array([0, 1, 1]))      # half A: one row, one class
    gmms = [fit_gmm(X, y, 1, n_classes=C, seed=0) for X, y in [tiny] + srcs[1:]]
    rows = th.target_rows(Xt, [tiny] + srcs[1:], C)
    th.choose_head(rows, gmms, [tiny] + srcs[1:])
    rule = rows.record["head_rule"]
    assert rule["abstained"] == [0] and len(rule["lda"]) == len(rule["linear"]) == 2
    alone = th.target_rows(Xt, [tiny], C)
    assert th.choose_head(alone, gmms[:1], [tiny]) == "lda"           # nobody scored: the tie
    assert alone.record["head_rule"]["abstained"] == [0]


def test_head_rule_transferred_labels_come_from_the_other_sources_not_the_own():
    """Sources whose class names are permuted against each other: the transferred stand-in
    labels source 0's components as the others would, so its heads score low on source 0's
    own half B; the own-label stand-in is unaffected."""
    rng = np.random.default_rng(3)
    srcs = [domain(rng, 150, 0.0, np.ones(D)) for _ in range(3)]
    X0, y0 = srcs[0]
    srcs[0] = (X0, (y0 + 1) % C)                        # source 0 names every class differently
    gmms = [fit_gmm(X, y, 1, n_classes=C, seed=0) for X, y in srcs]
    rows = th.target_rows(domain(rng, 100, 0.0, np.ones(D))[0], srcs, C)
    th.choose_head(rows, gmms, srcs)
    own, moved = (rows.record["head_rule"]["stand_ins"][k] for k in ("own labels", "transferred"))
    assert own["linear"][0] > 0.8 and moved["linear"][0] < 0.2
    g0 = fit_gmm(X0[:75], ((y0 + 1) % C)[:75], 1, n_classes=C, seed=0)
    others = rows.messages[1:]
    assert np.array_equal(th.relabeled(g0, others, *rows.shrinkage).labels.argmax(1),
                          (g0.labels.argmax(1) - 1) % C)


def test_a_stand_in_of_one_class_scores_the_constant_classifier():
    rng = np.random.default_rng(4)
    X, y = domain(rng, 90, 0.0, np.ones(D))
    g = fit_gmm(X, y, 1, n_classes=C, seed=0)
    one = GMM(g.weights, g.means, g.variances, np.eye(C)[[1] * g.K], [])    # all class 1
    msgs = [th.class_statistics(X, y, C)]
    lda, linear = th.stand_in_scores(one, msgs, X[:45], X[45:], y[45:], C, 0.1, "identity", 100, 0)
    assert linear == pytest.approx(np.mean(y[45:] == 1)) and 0 <= lda <= 1

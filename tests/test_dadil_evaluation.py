"""The DaDiL evaluation path: CV-regularised source-only, oracle ceiling, one evaluation function
behind ``evaluate -m dadil`` and ``dadil-evaluate``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import fedalign.dadil.classifiers as de
from fedalign.cli import app
from fedalign.dadil.classifiers import (SOURCE_ONLY, accuracy, oracle_classifier,
                                        parse_classifiers, source_only_classifier)
from fedalign.dadil.evaluation import evaluate_target
from fedalign.dadil.simulation import simulate
from fedalign.errors import FedalignError
from fedalign.files import write_features
from fedalign.gmm import fit_gmm, save_gmm

from test_dadil_gossip import blobs, make_gmms

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------------
# Domains where the best C is known
# --------------------------------------------------------------------------------------------


def shortcut_domain(dom: int, seed: int, n: int = 200):
    """Small C wins. Dim 0 carries the label in every domain (±1 + N(0, 1)); dim 1 + dom is a
    precise shortcut (±0.5 + N(0, 0.05²)) present in domain ``dom`` only, noise N(0, 0.3²)
    elsewhere. A weakly regularised fit leans on the training domains' shortcuts, which are
    noise in the held-out domain; a strongly regularised one (≈ nearest class mean) keeps dim 0."""
    r = np.random.default_rng(seed)
    y = np.arange(n) % 2
    X = 0.3 * r.normal(size=(n, 5))
    X[:, 0] = (y - 0.5) * 2 + r.normal(size=n)
    X[:, 1 + dom] = (y - 0.5) + 0.05 * r.normal(size=n)
    return X, y


def correlated_domain(seed: int, n: int = 300, rho: float = 0.95):
    """Large C wins. Classes differ by 1 along dim 0, the noise has correlation ρ between the
    two dims: the nearest-class-mean rule (small C) scores Φ(0.5) ≈ 69 %, the Bayes rule
    Σ⁻¹Δ (reached as C grows) Φ(1.6) ≈ 95 %."""
    r = np.random.default_rng(seed)
    y = np.arange(n) % 2
    L = np.linalg.cholesky([[1.0, rho], [rho, 1.0]])
    return np.c_[y - 0.5, np.zeros(n)] + r.normal(size=(n, 2)) @ L.T, y


def test_cv_chooses_small_c_when_shortcuts_do_not_transfer():
    srcs = [shortcut_domain(i, 40 + i) for i in range(3)]
    _, rec = source_only_classifier(srcs)
    assert rec["cv"] == "leave-one-source-domain-out" and len(rec["fold_scores"]) == 3
    assert rec["C"] <= 1e-2, rec
    assert rec["scores"][0] > rec["scores"][-1] + 0.05  # held-out accuracy falls as C grows
    assert rec["scores"][rec["Cs"].index(rec["C"])] == max(rec["scores"])


def test_cv_chooses_large_c_when_the_covariance_matters():
    srcs = [correlated_domain(10 + i) for i in range(3)]
    pred, rec = source_only_classifier(srcs)
    assert rec["C"] >= 1.0, rec
    assert rec["scores"][-1] > rec["scores"][0] + 0.1
    Xt, yt = correlated_domain(99, n=2000)
    assert accuracy(pred, Xt, yt) >= 0.9


def test_cv_held_out_sets_are_sources_never_the_target(monkeypatch):
    """The selection only ever scores on a held-out *source*; the target does not change it."""
    srcs = [shortcut_domain(i, 40 + i) for i in range(3)]
    seen = []
    orig = de._path_scores

    def spy(Xtr, ytr, Xva, yva, Cs, max_iter):
        seen.append((Xtr.copy(), Xva.copy()))
        return orig(Xtr, ytr, Xva, yva, Cs, max_iter)

    monkeypatch.setattr(de, "_path_scores", spy)
    targets = [shortcut_domain(3, 7, n=300), correlated_domain(8, n=300)]
    targets[1] = (np.c_[targets[1][0], np.zeros((300, 3))], targets[1][1])  # same d = 5
    records = [evaluate_target(X, y, n_classes=2, sources=srcs, seeds=[0, 1]).records[SOURCE_ONLY]
               for X, y in targets]
    assert records[0] == records[1]
    assert len(seen) == 3 * 2  # fitted once per call (leave-one-domain-out does not use the seed)
    for (Xtr, Xva), i in zip(seen, [0, 1, 2] * 2):
        np.testing.assert_array_equal(Xva, srcs[i][0])
        assert len(Xtr) == sum(len(s[1]) for j, s in enumerate(srcs) if j != i)
        for X, _ in targets:
            assert not any(np.array_equal(X, Z) for Z in (Xtr, Xva))


def test_single_source_falls_back_to_kfold_and_one_c_skips_cv():
    src = [correlated_domain(3)]
    _, rec = source_only_classifier(src, seed=1)
    assert rec["cv"] == "stratified 5-fold" and len(rec["fold_scores"]) == 5
    _, rec2 = source_only_classifier(src, seed=1)
    assert rec2 == rec  # deterministic given the seed
    Xt, yt = correlated_domain(4, n=100)
    res = evaluate_target(Xt, yt, sources=src, seeds=[0, 1])
    assert len(res.records[SOURCE_ONLY]["C_per_seed"]) == 2  # k-fold: one fit per seed
    _, rec1 = source_only_classifier(src, Cs=[0.5])
    assert rec1["cv"] == "none" and rec1["C"] == 0.5 and rec1["scores"] == []
    with pytest.raises(FedalignError, match="> 0"):
        source_only_classifier(src, Cs=[0.0, 1.0])
    with pytest.raises(FedalignError, match="no labeled rows"):
        source_only_classifier([(np.zeros((4, 2)), -np.ones(4, int))])


def test_a_fitted_source_only_is_reused_only_where_no_seed_enters(monkeypatch):
    srcs = [shortcut_domain(i, 40 + i) for i in range(3)]
    Xt, yt = shortcut_domain(0, 7, n=120)
    fresh = evaluate_target(Xt, yt, sources=srcs, seeds=[0, 1])
    given = source_only_classifier(srcs)
    calls = []
    monkeypatch.setattr("fedalign.dadil.evaluation.source_only_classifier",
                        lambda *a, **k: calls.append(a) or given)
    reused = evaluate_target(Xt, yt, sources=srcs, seeds=[0, 1], source_only=given)
    assert calls == []                      # no fit: the given classifier scored every seed
    assert reused.accuracy[SOURCE_ONLY] == fresh.accuracy[SOURCE_ONLY]
    assert reused.records[SOURCE_ONLY] == fresh.records[SOURCE_ONLY]
    one = [correlated_domain(3)]            # one source: k-fold CV, a fit per seed
    with pytest.raises(FedalignError, match="does not depend on the seed"):
        evaluate_target(*correlated_domain(4, n=60), sources=one, seeds=[0],
                        source_only=source_only_classifier(one))


# --------------------------------------------------------------------------------------------
# Oracle, accuracy, heads
# --------------------------------------------------------------------------------------------


def test_oracle_ceiling_on_separable_labeled_gmm():
    X, y = blobs(0, n=300)  # two classes 3 apart, σ = 0.7: Bayes accuracy ≈ 0.984
    g = fit_gmm(X, y, 2, n_classes=2, seed=0)
    Xt, yt = blobs(0, n=400, seed=100)
    for head in ("linear", "map"):
        assert accuracy(oracle_classifier(g, head, 200, 0), Xt, yt) >= 0.95
    res = evaluate_target(Xt, yt, n_classes=2, oracle_gmm=g, seeds=[0, 1], n_per_class=200)
    assert set(res.accuracy["oracle"]) == {"linear", "map"}
    assert min(min(a) for a in res.accuracy["oracle"].values()) >= 0.95
    with pytest.raises(FedalignError, match="fitted with labels"):
        oracle_classifier(fit_gmm(X, None, 2, n_classes=2, seed=0))


def test_accuracy_refuses_all_unlabeled():
    pred = lambda Z: np.zeros(len(Z), int)  # noqa: E731
    assert accuracy(pred, np.zeros((4, 2)), np.array([0, 1, -1, 0])) == pytest.approx(2 / 3)
    with pytest.raises(FedalignError, match="no labeled rows"):
        accuracy(pred, np.zeros((3, 2)), -np.ones(3, int))
    with pytest.raises(FedalignError, match="no labeled rows"):
        evaluate_target(np.zeros((3, 2)), -np.ones(3, int), sources=[correlated_domain(0)])


def test_parse_classifiers():
    assert parse_classifiers(None) == ("linear", "map")
    assert parse_classifiers(["map,linear", "map"]) == ("map", "linear")
    with pytest.raises(FedalignError, match="classifier must be one of"):
        parse_classifiers(["linear,svm"])


def test_dictionary_kwargs_reach_learn_dictionary(monkeypatch, tmp_path):
    gp = make_gmms(tmp_path, 3)
    from fedalign.gmm import load_gmm

    gs = {c: load_gmm(p) for c, p in gp.items()}
    calls = []
    orig = de.learn_dictionary

    def spy(gmms, target_index, **kw):
        calls.append((len(gmms), target_index, kw))
        return orig(gmms, target_index, **kw)

    monkeypatch.setattr(de, "learn_dictionary", spy)
    X, y = blobs(2, n=60, seed=102)
    res = evaluate_target(X, y, source_gmms=[gs["c0"], gs["c1"]], target_gmm=gs["tgt"],
                          seeds=[3], classifiers=["map"], dictionary_kwargs=dict(n_atoms=2, n_iter=3))
    assert calls == [(3, 2, dict(seed=3, n_atoms=2, n_iter=3))]
    assert list(res.accuracy["centralized"]) == ["map"]
    with pytest.raises(FedalignError, match="needs both"):
        evaluate_target(X, y, source_gmms=[gs["c0"]])


# --------------------------------------------------------------------------------------------
# One path: evaluate -m dadil and dadil-evaluate agree; bad inputs are refused
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dadil_eval")
    gp = make_gmms(tmp, 3)
    simulate(gp, tmp / "fed", rounds=2, strategy="aggregation", local_steps=2, n_atoms=2)
    X, y = blobs(2, n=80, seed=102)
    write_features(tmp / "tgt.test.h5", X, y, [str(i) for i in range(len(y))], ["a", "b"],
                   {"domain": "tgt"})
    return tmp, gp, tmp / "fed" / "state" / "tgt.state.npz"


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_error(r, message):
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.output


def test_evaluate_and_dadil_evaluate_give_the_same_numbers(federation):
    tmp, gp, state = federation
    test = tmp / "tgt.test.h5"
    r = _run("dadil-evaluate", "--test", test, "--state", f"agg={state}", "--seeds", "0-1",
             "--n-per-class", 100, "--json", tmp / "de.json")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp / "de.json").read_text())
    assert rep["seeds"] == [0, 1] and set(rep["accuracy"]["agg"]) == {"linear", "map"}
    assert "agg" in r.stdout and "linear" in r.stdout and "map" in r.stdout
    for head in ("linear", "map"):
        r = _run("evaluate", "-m", "dadil", "--input", state, "--test", test, "--seeds", "0-1",
                 "--param", f"dadil.classifier={head}", "--param", "dadil.n_per_class=100",
                 "--json", tmp / f"ev_{head}.json")
        assert r.exit_code == 0, r.output
        ev = json.loads((tmp / f"ev_{head}.json").read_text())["methods"]["dadil"]
        assert [a["tgt"] for a in ev["per_seed"]] == rep["accuracy"]["agg"][head]
    r = _run("dadil-evaluate", "--test", test, "--state", f"agg={state}", "--classifier", "map")
    assert r.exit_code == 0 and " linear " not in r.stdout, r.output


def test_both_paths_refuse_a_state_of_another_shape_and_unlabeled_tests(federation):
    tmp, gp, state = federation
    rng = np.random.default_rng(0)
    write_features(tmp / "d5.test.h5", rng.normal(size=(20, 5)), np.arange(20) % 2,
                   [str(i) for i in range(20)], ["a", "b"], {"domain": "tgt"})
    write_features(tmp / "c3.test.h5", rng.normal(size=(20, 4)), np.arange(20) % 3,
                   [str(i) for i in range(20)], ["a", "b", "c"], {"domain": "tgt"})
    write_features(tmp / "unl.test.h5", rng.normal(size=(20, 4)), -np.ones(20, int),
                   [str(i) for i in range(20)], ["a", "b"], {"domain": "tgt"})
    for f, msg in (("d5", "d=4"), ("c3", "C=2 classes"), ("unl", "no labeled rows")):
        test = tmp / f"{f}.test.h5"
        _one_error(_run("evaluate", "-m", "dadil", "--input", state, "--test", test), msg)
        _one_error(_run("dadil-evaluate", "--test", test, "--state", state), msg)
    _one_error(_run("dadil-evaluate", "--test", tmp / "tgt.test.h5", "--state", state,
                    "--classifier", "svm"), "classifier must be one of")
    _one_error(_run("dadil-evaluate", "--test", tmp / "tgt.test.h5"), "nothing to evaluate")


def test_dadil_evaluate_all_rows(federation):
    tmp, gp, state = federation
    srcs = []
    for i in range(2):
        Xs, ys = blobs(i)
        write_features(tmp / f"c{i}.h5", Xs, ys, [str(j) for j in range(len(ys))], ["a", "b"])
        srcs += ["--source", tmp / f"c{i}.h5"]
    Xo, yo = blobs(2, n=120, seed=105)   # labeled rows of the target's domain
    save_gmm(tmp / "oracle.gmm.npz", fit_gmm(Xo, yo, 2, n_classes=2, seed=0, class_names=["a", "b"]))
    r = _run("dadil-evaluate", "--test", tmp / "tgt.test.h5", *srcs, "--gmm", gp["c0"],
             "--gmm", gp["c1"], "--target-gmm", gp["tgt"], "--oracle-gmm", tmp / "oracle.gmm.npz",
             "--central-iters", 3, "--n-atoms", 2, "--state", f"DeFed aggregation={state}",
             "--n-per-class", 100, "--json", tmp / "all.json")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp / "all.json").read_text())
    assert [r[:2] for r in rep["rows"]] == [
        ["source-only", "logreg"], ["oracle", "linear"], ["oracle", "map"], ["centralized", "linear"],
        ["centralized", "map"], ["DeFed aggregation", "linear"], ["DeFed aggregation", "map"]]
    assert set(rep["summary"]) == {r[2] for r in rep["rows"]}  # flat, for ``fedalign report``
    assert list(rep["accuracy"]["source-only"]) == ["logreg"]
    assert rep["records"]["source-only"]["cv"] == "leave-one-source-domain-out"
    assert rep["summary"]["oracle (map)"]["mean"] >= 0.95
    assert "C=" in r.output and "oracle (labeled target GMM)" in r.stdout
    r = _run("report", tmp / "all.json")
    assert r.exit_code == 0 and "DeFed aggregation (map)" in r.stdout, r.output


def test_lda_head_through_dadil_evaluate_and_evaluate(federation):
    """--target-adapt adds the lda head to every GMM row; evaluate -m dadil gives the same."""
    tmp, gp, state = federation
    srcs = []
    for i in range(2):
        Xs, ys = blobs(i)
        write_features(tmp / f"h{i}.h5", Xs, ys, [str(j) for j in range(len(ys))], ["a", "b"])
        srcs.append(tmp / f"h{i}.h5")
    Xa, _ = blobs(2, n=100, seed=107)      # the target's adaptation rows, written unlabeled
    write_features(tmp / "tgt.adapt.h5", Xa, -np.ones(len(Xa), int),
                   [str(j) for j in range(len(Xa))], ["a", "b"], {"domain": "tgt"})
    test = tmp / "tgt.test.h5"
    r = _run("dadil-evaluate", "--test", test, "--state", f"agg={state}", "--source", srcs[0],
             "--source", srcs[1], "--target-adapt", tmp / "tgt.adapt.h5", "--seeds", "0-1",
             "--n-per-class", 100, "--json", tmp / "lda.json")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp / "lda.json").read_text())
    assert set(rep["accuracy"]["agg"]) == {"linear", "map", "lda"}
    assert rep["records"]["lda head"]["shrinkage_rule"] == "leave-one-source-domain-out"
    lda = rep["accuracy"]["agg"]["lda"]
    assert lda[0] == lda[1] and lda[0] > 0.5        # seed-free; above chance on 2 classes
    cem = rep["records"]["lda head"]["classification_em"]["agg"]
    assert cem == dict(max_iter=0, iterations=0, converged=True, changed=[],   # the one pass
                       label_counts=cem["label_counts"]) and sum(cem["label_counts"]) == len(Xa)
    # --cem-iter 5: the pseudo-labels refined by classification EM (at most 5 relabelings)
    r = _run("dadil-evaluate", "--test", test, "--state", f"agg={state}", "--source", srcs[0],
             "--source", srcs[1], "--target-adapt", tmp / "tgt.adapt.h5", "--seeds", "0",
             "--cem-iter", 5, "--json", tmp / "lda5.json")
    assert r.exit_code == 0, r.output
    cem5 = json.loads((tmp / "lda5.json").read_text())["records"]["lda head"]
    cem5 = cem5["classification_em"]["agg"]
    assert cem5["max_iter"] == 5 and cem5["iterations"] == len(cem5["changed"]) <= 5
    _one_error(_run("dadil-evaluate", "--test", test, "--state", state, "--source", srcs[0],
                    "--target-adapt", tmp / "tgt.adapt.h5", "--cem-iter", -1), "--cem-iter")
    r = _run("evaluate", "-m", "dadil", "--input", state, "--test", test, "--seeds", "0-1",
             "--param", "dadil.classifier=lda", "--param", f"dadil.target_adapt={tmp / 'tgt.adapt.h5'}",
             "--param", f"dadil.sources={srcs[0]},{srcs[1]}", "--json", tmp / "ev_lda.json")
    assert r.exit_code == 0, r.output
    ev = json.loads((tmp / "ev_lda.json").read_text())["methods"]["dadil"]
    assert [a["tgt"] for a in ev["per_seed"]] == rep["accuracy"]["agg"]["lda"]
    _one_error(_run("evaluate", "-m", "dadil", "--input", state, "--test", test,
                    "--param", "dadil.classifier=lda"), "dadil.target_adapt=FILE")
    _one_error(_run("dadil-evaluate", "--test", test, "--state", state, "--classifier", "lda"),
               "lda head needs")
    _one_error(_run("dadil-evaluate", "--test", test, "--state", state, "--source", srcs[0],
                    "--target-adapt", test), "same file")


def test_auto_head_through_dadil_evaluate(federation):
    """With --target-adapt and one --head-gmm per source, dadil-evaluate adds the auto head: each
    row's auto equals the head the rule chose (lda or linear), and the rule is reported."""
    tmp, gp, state = federation
    srcs = []
    for i in range(2):
        Xs, ys = blobs(i)   # the rows the c0 / c1 GMMs of make_gmms were fitted on
        write_features(tmp / f"a{i}.h5", Xs, ys, [str(j) for j in range(len(ys))], ["a", "b"])
        srcs.append(tmp / f"a{i}.h5")
    Xa, _ = blobs(2, n=100, seed=107)
    write_features(tmp / "tgt.adapt2.h5", Xa, -np.ones(len(Xa), int),
                   [str(j) for j in range(len(Xa))], ["a", "b"], {"domain": "tgt"})
    test = tmp / "tgt.test.h5"
    args = ["dadil-evaluate", "--test", test, "--state", f"agg={state}", "--source", srcs[0],
            "--source", srcs[1], "--target-adapt", tmp / "tgt.adapt2.h5", "--n-per-class", 100,
            "--gmm", gp["c0"], "--gmm", gp["c1"], "--target-gmm", gp["tgt"],
            "--central-iters", 5]
    r = _run(*args, "--head-gmm", gp["c0"], "--head-gmm", gp["c1"], "--json", tmp / "auto.json")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp / "auto.json").read_text())
    rule = rep["records"]["lda head"]["head_rule"]
    assert rule["choice"] in ("lda", "linear") and len(rule["lda"]) == len(rule["linear"]) == 2
    assert rule["choice"] == ("lda" if np.mean(rule["lda"]) >= np.mean(rule["linear"]) else "linear")
    assert rep["accuracy"]["agg"]["auto"] == rep["accuracy"]["agg"][rule["choice"]]
    ev_args = ["evaluate", "-m", "dadil", "--input", state, "--test", test,
               "--param", "dadil.classifier=auto", "--param", "dadil.n_per_class=100",
               "--param", f"dadil.target_adapt={tmp / 'tgt.adapt2.h5'}",
               "--param", f"dadil.sources={srcs[0]},{srcs[1]}"]
    r = _run(*ev_args, "--param", f"dadil.source_gmms={gp['c0']},{gp['c1']}",
             "--json", tmp / "ev_auto.json")
    assert r.exit_code == 0, r.output
    ev = json.loads((tmp / "ev_auto.json").read_text())["methods"]["dadil"]
    assert [a["tgt"] for a in ev["per_seed"]] == rep["accuracy"]["agg"]["auto"]
    _one_error(_run(*ev_args), "dadil.source_gmms=FILE")
    _one_error(_run(*args, "--head-gmm", gp["c0"]), "one labeled GMM per source")
    _one_error(_run("dadil-evaluate", "--test", test, "--state", state, "--head-gmm", gp["c0"]),
               "read only with the target's adaptation rows")

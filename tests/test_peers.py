"""fedalign.peers: the shallow DA rows (skada's CORAL / SA / LinearOTMapping, SLOT-Align as DA,
SLOT toward the target, the ceiling) on shifted Gaussian blobs, against independent oracles
(scikit-learn's Ledoit–Wolf and scipy's sqrtm, skada's own pipeline), failures kept as rows,
skada optional, and ``dadil-evaluate --peers`` through real processes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from fedalign.dadil.classifiers import source_only_classifier
from fedalign.dadil.evaluation import TargetResult
from fedalign.errors import FedalignError
from fedalign.files import write_features
from fedalign.metrics import accuracy
from fedalign.peers import (PEER_ROWS, SKADA_ROWS, add_peer_rows, adapt_features,
                            evaluate_peers)

skada = pytest.importorskip("skada")


def blobs(seed=0, d=5, k=3, noise=0.8, angle=0.5, shift=3.0, n=(240, 240, 300, 150)):
    """Two labeled sources and a target rotated (angle in the first plane), stretched and
    translated: (sources, X_adapt, y_adapt, X_test, y_test)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, d)) * 2.5

    def draw(m):
        y = np.arange(m) % k
        return means[y] + noise * rng.normal(size=(m, d)), y

    sources = []
    for m in n[:2]:
        X, y = draw(m)
        sources.append((X + 0.3 * rng.normal(size=d), y))
    c, s = np.cos(angle), np.sin(angle)
    Q = np.eye(d)
    Q[:2, :2] = [[c, -s], [s, c]]
    A = np.diag(np.linspace(0.6, 1.6, d)) @ Q
    (Xa, ya), (Xt, yt) = draw(n[2]), draw(n[3])
    return sources, Xa @ A.T + shift, ya, Xt @ A.T + shift, yt


@pytest.fixture(scope="module")
def shifted():
    return blobs()


def test_linear_ot_and_slot_to_target_beat_source_only(shifted, monkeypatch):
    sources, Xa, ya, Xt, yt = shifted
    predict, rec = source_only_classifier(sources)
    so = accuracy(predict, Xt, yt)
    assert so < 0.75   # the shift defeats the source-only rule
    import fedalign.dadil.classifiers as classifiers

    monkeypatch.setattr(classifiers, "source_only_classifier", None)   # C given: no second CV
    res = evaluate_peers(sources, Xa, Xt, yt, C=rec["C"], seeds=[0, 1, 2], y_adapt=ya)
    assert list(res.accuracy) == list(PEER_ROWS) and res.failed() == {}
    for row in ("linear-ot", "slot-to-target", "ceiling"):
        accs = res.accuracy[row]["logreg"]
        assert accs == [accs[0]] * 3 and accs[0] >= so + 0.25, (row, accs, so)
    assert all(r["C"] == rec["C"] and r["head"] == "logreg" for r in res.records.values())
    assert res.records["linear-ot"]["reg"] == 1.0 and res.records["slot-align"]["tau"] == 0.4
    # no adaptation labels: no ceiling row; the others unchanged
    res2 = evaluate_peers(sources, Xa, Xt, yt, C=rec["C"], rows=("slot-to-target", "ceiling"))
    assert list(res2.accuracy) == ["slot-to-target"]
    assert res2.accuracy["slot-to-target"] == {"logreg": res.accuracy["slot-to-target"]["logreg"][:1]}


def _sqrtm(S):
    import scipy.linalg

    return np.real(scipy.linalg.sqrtm(S))


def test_slot_to_target_is_the_gaussian_ot_map_onto_the_target(shifted):
    from sklearn.covariance import LedoitWolf

    sources, Xa, _, Xt, _ = shifted
    Z, y, Za, Zt, settings = adapt_features("slot-to-target", sources, Xa, Xt)
    lw_a = LedoitWolf().fit(Xa)
    R = _sqrtm(lw_a.covariance_)
    want = []
    for X, _ in sources:
        S = LedoitWolf().fit(X).covariance_
        A = R @ np.linalg.inv(_sqrtm(R @ S @ R)) @ R   # Σ_a^½ (Σ_a^½ Σ_i Σ_a^½)^-½ Σ_a^½
        want.append((X - X.mean(0)) @ A.T + lw_a.location_)
    np.testing.assert_allclose(Z, np.concatenate(want), rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(Zt, Xt)              # the target's rows stay where they are
    np.testing.assert_array_equal(Za, Xa)
    np.testing.assert_array_equal(y, np.concatenate([y for _, y in sources]))
    assert settings["tau"] == 1.0
    # the mapped sources have the target's mean and Ledoit–Wolf covariance, each of them
    n0 = len(sources[0][0])
    np.testing.assert_allclose(Z[:n0].mean(0), Xa.mean(0), atol=1e-9)


def test_coral_row_equals_skadas_coral_pipeline():
    from sklearn.covariance import LedoitWolf
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    sources, Xa, _, Xt, yt = blobs(seed=3, noise=2.0, shift=1.0)
    C = 0.05
    X = np.concatenate([s[0] for s in sources] + [Xa])
    y = np.concatenate([s[1] for s in sources] + [np.full(len(Xa), -1)])
    sd = np.concatenate([np.full(len(sources[0][0]), 1), np.full(len(sources[1][0]), 2),
                         np.full(len(Xa), -1)])
    pipe = skada.make_da_pipeline(skada.CORALAdapter(), StandardScaler(),
                                  LogisticRegression(C=C, max_iter=1000))
    want = pipe.fit(X, y, sample_domain=sd).predict(Xt, sample_domain=np.full(len(Xt), -1))
    res = evaluate_peers(sources, Xa, Xt, yt, C=C, rows=("coral",))
    assert res.accuracy["coral"]["logreg"] == [float(np.mean(want == yt))]
    assert 0.5 < np.mean(want == yt) < 1.0            # a score that can disagree
    # CORAL's closed form: sources centred, whitened and coloured; the target's rows centred.
    # skada's reg="auto": Ledoit–Wolf on the standardised columns, scaled back
    def cov(X):
        sd = X.std(0)
        return sd[:, None] * LedoitWolf().fit(X / sd).covariance_ * sd[None, :]

    Z, ys, Za, Zt, _ = adapt_features("coral", sources, Xa, Xt)
    Xs = np.concatenate([s[0] for s in sources])
    np.testing.assert_allclose(Z, (Xs - Xs.mean(0)) @ np.linalg.inv(_sqrtm(cov(Xs)))
                               @ _sqrtm(cov(Xa)), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(Zt, Xt - Xa.mean(0), atol=1e-12)
    np.testing.assert_allclose(Za, Xa - Xa.mean(0), atol=1e-12)
    # the head: the scaler on the adapted sources and adaptation rows, as the pipeline's
    sc = StandardScaler().fit(np.concatenate([Z, Za]))
    lr = LogisticRegression(C=C, max_iter=1000).fit(sc.transform(Z), ys)
    np.testing.assert_array_equal(lr.predict(sc.transform(Zt)), want)


def test_a_failing_peer_is_a_failed_row_and_the_others_go_on(shifted):
    sources, Xa, ya, Xt, yt = shifted
    res = evaluate_peers(sources, Xa[:1], Xt, yt, C=0.1, seeds=[0, 1], y_adapt=ya[:1])
    assert list(res.accuracy) == list(PEER_ROWS)
    failed = res.failed()
    for row in ("slot-align-tau1", "slot-align", "slot-to-target"):
        assert "need at least 2 rows" in failed[row]
        assert all(math.isnan(a) for a in res.accuracy[row]["logreg"])
    assert "single class" in failed["ceiling"]
    assert 0 <= res.accuracy["linear-ot"]["logreg"][0] <= 1 and "linear-ot" not in failed
    # merged into the DaDiL result: failed rows in the records only; the JSON is valid
    tr = TargetResult("tgt", 3, len(yt), [0, 1], {"source-only": {"logreg": [0.5, 0.5]}})
    add_peer_rows(tr, res)
    assert set(tr.accuracy) == {"source-only", "coral", "sa", "linear-ot"}
    assert tr.records["slot-to-target"]["failed"] == failed["slot-to-target"]
    rep = json.loads(json.dumps(tr.to_json(), allow_nan=False))
    assert "linear-ot (logreg)" in rep["summary"] and "slot-align (logreg)" not in rep["summary"]
    json.dumps(res.to_json(), allow_nan=False)   # NaN as null
    with pytest.raises(FedalignError, match="already a row"):
        add_peer_rows(tr, res)
    with pytest.raises(FedalignError, match="seeds"):
        add_peer_rows(TargetResult("tgt", 3, len(yt), [0]), res)


def test_without_skada_its_rows_name_the_extra(shifted, monkeypatch):
    sources, Xa, _, Xt, yt = shifted
    monkeypatch.setitem(sys.modules, "skada", None)   # `import skada` raises ImportError
    for row in SKADA_ROWS:
        with pytest.raises(FedalignError, match=r"pip install 'fedalign\[da\]'"):
            evaluate_peers(sources, Xa, Xt, yt, C=1.0, rows=(row, "slot-to-target"))
    res = evaluate_peers(sources, Xa, Xt, yt, C=1.0, rows=("slot-to-target",))
    assert res.failed() == {}
    with pytest.raises(FedalignError, match="unknown peer row"):
        evaluate_peers(sources, Xa, Xt, yt, C=1.0, rows=("tca",))


# --------------------------------------------------------------------------------------------
# dadil-evaluate --peers, real processes
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory, shifted):
    tmp = tmp_path_factory.mktemp("peers_cli")
    sources, Xa, ya, Xt, yt = shifted
    names = ["a", "b", "c"]
    for i, (X, y) in enumerate(sources):
        write_features(tmp / f"s{i}.h5", X, y, [str(j) for j in range(len(y))], names)
    write_features(tmp / "t.adapt.h5", Xa, ya, [str(j) for j in range(len(ya))], names,
                   {"domain": "t"})
    write_features(tmp / "t.test.h5", Xt, yt, [str(j) for j in range(len(yt))], names,
                   {"domain": "t"})
    return tmp


def _fedalign(*args, pre=""):
    code = pre + "import sys; from fedalign.cli import main; sys.argv[0] = 'fedalign'; main()"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True)


def _one_error(r, message, stream="stderr"):
    lines = getattr(r, stream).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_cli_peers_refuses_missing_inputs_and_missing_skada(files, monkeypatch):
    from typer.testing import CliRunner

    from fedalign.cli import app

    from fedalign.files import read_features
    from fedalign.gmm import fit_gmm, save_gmm

    Xa, ya, info = read_features(files / "t.adapt.h5")
    save_gmm(files / "o.gmm.npz", fit_gmm(Xa, ya, 1, n_classes=len(info["class_names"]), seed=0))
    base = ["dadil-evaluate", "--test", files / "t.test.h5", "--json", files / "bad.json"]
    r = _fedalign(*base, "--source", files / "s0.h5", "--peers")   # a real process: exit 2
    assert r.returncode == 2
    _one_error(r, "--target-adapt")

    def invoke(*args):
        r = CliRunner().invoke(app, [str(a) for a in base + list(args)])
        assert r.exit_code == 2, r.output
        return r

    _one_error(invoke("--target-adapt", files / "t.adapt.h5", "--peers", "--state",
                      files / "s0.h5"), "--source", "output")
    _one_error(invoke("--oracle-gmm", files / "o.gmm.npz", "--target-adapt",
                      files / "t.adapt.h5"), "lda head needs", "output")   # no --source
    _one_error(invoke("--source", files / "s0.h5", "--target-adapt", files / "t.test.h5",
                      "--peers"), "same file", "output")
    monkeypatch.setitem(sys.modules, "skada", None)
    _one_error(invoke("--source", files / "s0.h5", "--target-adapt", files / "t.adapt.h5",
                      "--peers"), "pip install 'fedalign[da]'", "output")
    assert not (files / "bad.json").exists()


def test_cli_peers_json_report_reads_back(files):
    from typer.testing import CliRunner

    from fedalign.cli import app

    out = files / "peers.json"
    r = _fedalign("dadil-evaluate", "--test", files / "t.test.h5", "--source", files / "s0.h5",
                  "--source", files / "s1.h5", "--target-adapt", files / "t.adapt.h5", "--peers",
                  "--seeds", "0-1", "--json", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert [m for m, _, _ in rep["rows"]] == ["source-only", *PEER_ROWS]
    assert rep["records"]["linear-ot"]["C"] == rep["records"]["source-only"]["C"]
    so = rep["summary"]["source-only (logreg)"]["mean"]
    assert rep["summary"]["slot-to-target (logreg)"]["mean"] >= so + 0.25
    assert "LinearOTMapping (skada, reg 1)" in r.stdout and "ceiling" in r.stdout
    r = CliRunner().invoke(app, ["report", str(out)])
    assert r.exit_code == 0 and "slot-to-target (logreg)" in r.stdout, r.output


def test_importing_peers_does_not_import_skada():
    code = "import sys, fedalign.peers; print('skada' in sys.modules, 'torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr

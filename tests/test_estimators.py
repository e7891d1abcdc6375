"""The scikit-learn / skada estimators (fedalign.estimators).

Oracles: skada's MultiLinearMongeAlignmentAdapter (an optional test dependency) where the
mathematics coincide — empirical 1/n covariance (shrinkage "none"), uniform barycentric weights,
every domain a source, τ = 1 — and scikit-learn's LedoitWolf for the default covariance.
"""

import subprocess
import sys

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.covariance import LedoitWolf
from sklearn.exceptions import NotFittedError

from fedalign.errors import FedalignError
from fedalign.estimators import GMMDaDiLClassifier, SLOTAlign


def _domains(seed=0, d=5, sizes=(200, 300, 250)):
    """Gaussian domains with different means and covariances; ids 1..K."""
    rng = np.random.default_rng(seed)
    Xs, sd = [], []
    for k, n in enumerate(sizes, 1):
        L = rng.normal(size=(d, d))
        Xs.append(rng.normal(size=(n, d)) @ L + 3.0 * rng.normal(size=d))
        sd.append(np.full(n, k))
    return np.vstack(Xs), np.concatenate(sd)


def _blobs(rng, n, angle):
    """Three well-separated classes in 2-D, rotated by ``angle`` degrees."""
    centres = np.array([[0.0, 4.0], [4.0, -2.0], [-4.0, -2.0]])
    y = rng.integers(0, 3, n)
    X = centres[y] + rng.normal(scale=0.8, size=(n, 2))
    t = np.deg2rad(angle)
    R = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
    return X @ R.T, y


def _rotated_blobs(seed=0, n=150, source_angles=(0, 40, 80), target_angle=60):
    """Labeled sources (ids 1..S) and an unlabeled target (id −1, y = −1); the target's labels."""
    rng = np.random.default_rng(seed)
    parts = [_blobs(rng, n, a) for a in source_angles]
    Xt, yt = _blobs(rng, n, target_angle)
    X = np.vstack([p[0] for p in parts] + [Xt])
    y = np.concatenate([p[1] for p in parts] + [np.full(n, -1)])
    sd = np.concatenate([np.full(n, k) for k in range(1, len(parts) + 1)] + [np.full(n, -1)])
    return X, y, sd, Xt, yt


# -- SLOTAlign against skada ---------------------------------------------------------------------


def test_slotalign_matches_skada_multi_linear_monge_alignment():
    skada = pytest.importorskip("skada")
    X, sd = _domains()
    ours = SLOTAlign(tau=1.0, shrinkage="none", weights="uniform").fit(X, sample_domain=sd)
    theirs = skada.MultiLinearMongeAlignmentAdapter(reg=1e-12).fit(X, sample_domain=sd)
    np.testing.assert_allclose(ours.reference_.mean, theirs.barycenter_[0], atol=1e-8)
    np.testing.assert_allclose(ours.reference_.covariance, theirs.barycenter_[1], atol=1e-8)
    for dom in (1, 2, 3):
        A, b = theirs.mappings_[dom]
        np.testing.assert_allclose(ours.maps_[dom].A, A, atol=1e-8)
        np.testing.assert_allclose(ours.maps_[dom].b, b, atol=1e-7)
    out = ours.transform(X, sample_domain=sd)
    ref = theirs.transform(X, sample_domain=sd, allow_source=True)
    assert np.abs(out - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max())
    # skada's default stopping tolerance: still within 1e-6
    ref8 = skada.MultiLinearMongeAlignmentAdapter().fit_transform(X, sample_domain=sd)
    assert np.abs(out - ref8).max() <= 1e-6 * np.abs(ref8).max()
    # τ < 1 is the geodesic: (1 − τ) z + τ T(z)
    half = SLOTAlign(tau=0.4, shrinkage="none", weights="uniform").fit_transform(X, sample_domain=sd)
    np.testing.assert_allclose(half, 0.6 * X + 0.4 * ref, atol=1e-6)


def test_slotalign_default_covariance_is_ledoit_wolf_and_weights_are_sample_counts():
    X, sd = _domains(seed=1)
    est = SLOTAlign().fit(X, sample_domain=sd)
    for k, st in zip(est.domains_, est.stats_):
        lw = LedoitWolf().fit(X[sd == k])
        np.testing.assert_allclose(st.covariance, lw.covariance_, atol=1e-10)
        assert st.shrinkage == pytest.approx(lw.shrinkage_, abs=1e-12)
    n = np.bincount(sd)[1:]
    np.testing.assert_allclose(est.reference_.weights, n / n.sum())
    np.testing.assert_allclose(est.reference_.mean,
                               sum(w * X[sd == k].mean(0) for w, k in zip(n / n.sum(), (1, 2, 3))))
    # aligned domains share the reference's mean (τ = 1)
    out = SLOTAlign(tau=1.0).fit_transform(X, sample_domain=sd)
    for k in (1, 2, 3):
        np.testing.assert_allclose(out[sd == k].mean(0), est.reference_.mean, atol=1e-8)


def test_slotalign_from_a_received_reference(tmp_path):
    from fedalign.align import save_reference

    X, sd = _domains(seed=2)
    server = SLOTAlign(tau=1.0).fit(X, sample_domain=sd)
    path = tmp_path / "reference.npz"
    save_reference(path, server.reference_)
    one = sd == 2                                     # a client holding one domain only
    for ref in (path, str(path), server.reference_):
        client = SLOTAlign(tau=1.0, reference=ref).fit(X[one], sample_domain=sd[one])
        np.testing.assert_allclose(client.maps_[2].A, server.maps_[2].A, atol=1e-12)
        np.testing.assert_allclose(client.transform(X[one], sample_domain=2),
                                   server.transform(X[one], sample_domain=sd[one]), atol=1e-10)
    with pytest.raises(ValueError, match="dimension mismatch"):
        SLOTAlign(reference=path).fit(X[:, :3], sample_domain=sd)


def test_slotalign_errors():
    X, sd = _domains(seed=3)
    with pytest.raises(NotFittedError):
        SLOTAlign().transform(X, sample_domain=sd)
    with pytest.raises(ValueError, match="sample_domain is required"):
        SLOTAlign().fit(X)
    with pytest.raises(ValueError, match="tau"):
        SLOTAlign(tau=1.5).fit(X, sample_domain=sd)
    with pytest.raises(ValueError, match="shrinkage"):
        SLOTAlign(shrinkage=2.0).fit(X, sample_domain=sd)
    est = SLOTAlign().fit(X[sd != 3], sample_domain=sd[sd != 3])
    with pytest.raises(ValueError, match=r"\[3\] were not seen by fit"):
        est.transform(X, sample_domain=sd)
    with pytest.raises(ValueError, match="features"):
        est.transform(X[:, :2], sample_domain=sd)
    with pytest.raises(ValueError, match="not positive definite"):   # n ≤ d without shrinkage
        SLOTAlign(shrinkage="none").fit(X[:8], sample_domain=np.repeat([1, 2], 4))


def test_slotalign_params_and_clone():
    est = SLOTAlign(tau=0.7, shrinkage=0.1)
    assert est.get_params() == dict(tau=0.7, shrinkage=0.1, weights="samples", reference=None,
                                    tol=1e-10, max_iter=100)
    est.set_params(tau=1.0, weights="uniform")
    assert (est.tau, est.weights) == (1.0, "uniform")
    X, sd = _domains(seed=4)
    est.fit(X, sample_domain=sd)
    c = clone(est)
    assert c.get_params() == est.get_params() and not hasattr(c, "maps_")
    np.testing.assert_array_equal(c.fit_transform(X, sample_domain=sd),
                                  est.transform(X, sample_domain=sd))


# -- GMMDaDiLClassifier ----------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["linear", "map", "lda", "auto"])
def test_gmm_dadil_classifier_on_rotated_blobs(head):
    X, y, sd, Xt, yt = _rotated_blobs()
    clf = GMMDaDiLClassifier(components_per_class=2, n_iter=30, classifier=head,
                             n_per_class=200).fit(X, y, sample_domain=sd)
    acc = clf.score(Xt, yt)
    assert acc > 0.8, acc                                   # chance: 1/3
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    assert clf.barycenter_.labels.shape[1] == 3 and len(clf.gmms_) == 4
    assert clf.target_domain_ == -1 and list(clf.source_domains_) == [1, 2, 3]
    P = clf.predict_proba(Xt)
    assert P.shape == (len(Xt), 3)
    np.testing.assert_allclose(P.sum(1), 1.0, atol=1e-9)
    np.testing.assert_array_equal(clf.classes_[P.argmax(1)], clf.predict(Xt))
    assert clf.head_kind_ in (("lda", "linear") if head == "auto" else (head,))
    # same seed → same model; the target's labels are never read
    y2 = y.copy()
    again = GMMDaDiLClassifier(components_per_class=2, n_iter=30, classifier=head,
                               n_per_class=200).fit(X, y2, sample_domain=sd)
    np.testing.assert_array_equal(again.predict(Xt), clf.predict(Xt))


def test_gmm_dadil_classifier_labels_params_clone_and_errors():
    X, y, sd, Xt, yt = _rotated_blobs(n=80, source_angles=(0, 30), target_angle=15)
    names = np.array([3, 7, 9])                            # arbitrary label values
    y_named = np.where(y >= 0, names[np.maximum(y, 0)], -1)
    clf = GMMDaDiLClassifier(components_per_class=1, n_iter=10, classifier="map")
    with pytest.raises(NotFittedError):
        clf.predict(Xt)
    c = clone(clf).set_params(n_atoms=2)
    assert c.get_params()["n_atoms"] == 2 and clf.get_params()["n_atoms"] == 3
    assert GMMDaDiLClassifier().get_params()["classifier"] == "auto"   # the fedalign default
    c.fit(X, y_named)                                     # sample_domain from y == −1
    assert set(np.unique(c.predict(Xt))) <= {3, 7, 9}
    assert c.score(Xt, names[yt]) > 0.8
    with pytest.raises(ValueError, match="exactly one target"):
        clone(clf).fit(X, y, sample_domain=np.abs(sd))
    with pytest.raises(ValueError, match="classifier must be one of"):
        clone(clf).set_params(classifier="svm").fit(X, y, sample_domain=sd)
    with pytest.raises(ValueError, match="at least 2"):
        clone(clf).fit(X, np.where(y >= 0, 0, -1), sample_domain=sd)
    assert GMMDaDiLClassifier().get_params()["cem_iter"] == 0     # the one-pass lda head
    with pytest.raises(ValueError, match="cem_iter must be >= 0"):
        clone(clf).set_params(classifier="lda", cem_iter=-1).fit(X, y, sample_domain=sd)


def _shifted_blobs(seed=0, n=200, drop=()):
    """Two labeled sources (the second scaled and shifted) and a target rotated by 30° and
    shifted, whose adaptation rows lack the classes in ``drop``; its test rows hold every
    class."""
    rng = np.random.default_rng(seed)
    parts = []
    for A, b in ((np.eye(2), np.zeros(2)), (np.diag([1.2, 0.8]), np.array([1.0, -1.0]))):
        X, yy = _blobs(rng, n, 0)
        parts.append((X @ A.T + b, yy))
    Xt, yt = _blobs(rng, 2 * n, 30)
    Xt = Xt + np.array([3.0, 2.0])
    adapt = ~np.isin(yt[:n], drop)
    Xa, (Xte, yte) = Xt[:n][adapt], (Xt[n:], yt[n:])
    X = np.vstack([p[0] for p in parts] + [Xa])
    y = np.concatenate([p[1] for p in parts] + [np.full(len(Xa), -1)])
    sd = np.concatenate([np.full(n, 1), np.full(n, 2), np.full(len(Xa), -1)])
    return X, y, sd, Xte, yte


@pytest.mark.parametrize("drop", [(), (2,)])
def test_gmm_dadil_classifier_maps_the_sources_onto_the_target_first(drop):
    """The fedalign default moves every source onto the target's completed Gaussian
    (label_shift.onto_target) before any GMM is fitted: its source GMMs are those of the
    mapped rows, and a class the target's rows lack is found absent; align_to_target=False
    fits the sources as they are."""
    from fedalign.gmm import fit_gmm
    from fedalign.label_shift import onto_target

    X, y, sd, Xte, yte = _shifted_blobs(drop=drop)
    kw = dict(components_per_class=2, n_iter=30, classifier="linear", n_per_class=200)
    on = GMMDaDiLClassifier(**kw).fit(X, y, sample_domain=sd)
    off = GMMDaDiLClassifier(**kw, align_to_target=False).fit(X, y, sample_domain=sd)
    assert off.label_shift_ is None and on.label_shift_["absent"] == list(drop)
    mapped, rec = onto_target([(X[sd == k], y[sd == k]) for k in (1, 2)], X[sd == -1], 3)
    assert rec == on.label_shift_
    for k, Xm in enumerate(mapped):
        g = fit_gmm(Xm, y[sd == k + 1], 2, n_classes=3, seed=0, var_floor_rel=0.01)
        np.testing.assert_array_equal(g.means, on.gmms_[k].means)
        g = fit_gmm(X[sd == k + 1], y[sd == k + 1], 2, n_classes=3, seed=0, var_floor_rel=0.01)
        np.testing.assert_array_equal(g.means, off.gmms_[k].means)
    assert not np.allclose(on.gmms_[0].means, off.gmms_[0].means)
    if not drop:
        assert on.score(Xte, yte) > 0.9


def test_onto_target_uses_only_labeled_rows_for_the_class_statistics():
    """A source row without a label (−1) is mapped with its domain but sends no class
    statistics: the record equals that of the labeled rows' messages alone."""
    from fedalign.label_shift import onto_target

    X, y, sd, _, _ = _shifted_blobs()
    src = [(X[sd == k], y[sd == k]) for k in (1, 2)]
    y0 = src[0][1].copy()
    y0[::4] = -1
    mapped, rec = onto_target([(src[0][0], y0), src[1]], X[sd == -1], 3)
    assert [m.shape for m in mapped] == [s[0].shape for s in src]
    _, rec_lab = onto_target([(src[0][0][y0 >= 0], y0[y0 >= 0]), src[1]], X[sd == -1], 3)
    np.testing.assert_allclose(rec["priors"], rec_lab["priors"], rtol=1e-12)
    # a source without any label is mapped but sends nothing; no label anywhere is an error
    mapped, rec_none = onto_target([(src[0][0], np.full(len(y0), -1)), src[1]], X[sd == -1], 3)
    assert len(mapped) == 2 and rec_none == onto_target([src[1]], X[sd == -1], 3)[1]
    with pytest.raises(FedalignError, match="no source has a labeled row"):
        onto_target([(src[0][0], np.full(len(y0), -1))], X[sd == -1], 3)
    unl = np.where(sd == 2, -1, y)
    with pytest.raises(ValueError, match="every source domain needs a labeled GMM"):
        GMMDaDiLClassifier(components_per_class=1, n_iter=5).fit(X, unl, sample_domain=sd)


def test_import_fedalign_loads_neither_sklearn_nor_torch():
    code = ("import sys, fedalign; assert 'sklearn' not in sys.modules; "
            "assert 'torch' not in sys.modules; fedalign.SLOTAlign; fedalign.GMMDaDiLClassifier; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_readme_estimators_example_runs(capsys):
    """The README's estimators example (the Library section's second Python block) runs."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.partition("\n## Library\n")[2].partition("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    code = next(b for b in blocks if "SLOTAlign" in b)
    exec(compile(code, "README.md", "exec"), {})
    assert float(capsys.readouterr().out) >= 0.9

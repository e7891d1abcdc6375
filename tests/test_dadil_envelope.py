"""Barycentric envelope (dadil-envelope): closed forms, JSON values, bad inputs.

Two fixed atoms with one component per class; atom 1 is atom 0 translated by δ along an axis
orthogonal to every class offset, with other standard deviations. Then B(α) has means
c_k + α₁δ and stds α₀s₀ + α₁s₁, so a target Q = B((0.3, 0.7)) is recovered exactly (loss 0),
and a target reduced to classes {0, 1} (weights ½) is best matched at the same α, with the
loss of the mass that B's class-2 component must take from them: (‖c₀−c₂‖² + ‖c₁−c₂‖²)/6.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.dadil.atoms import Atoms
from fedalign.dadil.dictionary import fit_alpha
from fedalign.dadil.envelope import (barycenter, envelope_study, load_dictionary, parse_classes,
                               reconstruction_loss)
from fedalign.errors import FedalignError
from fedalign.files import write_features
from fedalign.gmm import GMM, map_predict, sample_gmm, save_gmm
from fedalign.dadil.classifiers import gmm_classifier
from fedalign.dadil.state import PublishedAtoms, save_atoms

pytestmark = pytest.mark.usefixtures("one_thread")

CENTERS = np.array([[0.0, 0.0, 0.0], [6.0, 0.0, 0.0], [3.0, 6.0, 0.0]])   # class means
DELTA = np.array([0.0, 0.0, 2.0])                                          # ⟂ class offsets
S0, S1 = 0.5, 1.0
ALPHA = np.array([0.3, 0.7])
REDUCED_LOSS = (np.sum((CENTERS[0] - CENTERS[2]) ** 2) + np.sum((CENTERS[1] - CENTERS[2]) ** 2)) / 6


def two_atoms() -> Atoms:
    means = np.stack([CENTERS, CENTERS + DELTA])
    variances = np.stack([np.full((3, 3), S0 ** 2), np.full((3, 3), S1 ** 2)])
    logits = np.log(np.eye(3) * 0.98 + 0.01)[None].repeat(2, 0)
    return Atoms(means, variances, logits)


def target(classes=(0, 1, 2), labeled=False) -> GMM:
    """Q = B((0.3, 0.7); atoms) restricted to ``classes`` (equal weights)."""
    B = barycenter(two_atoms(), ALPHA)
    k = list(classes)
    return GMM(np.full(len(k), 1 / len(k)), B.means[k], B.variances[k],
               B.labels[k] if labeled else None)


def test_barycenter_closed_form():
    B = barycenter(two_atoms(), ALPHA)
    np.testing.assert_allclose(B.means, CENTERS + 0.7 * DELTA, atol=1e-9)
    np.testing.assert_allclose(np.sqrt(B.variances), 0.3 * S0 + 0.7 * S1, atol=1e-9)
    assert reconstruction_loss(two_atoms(), target(), ALPHA) < 1e-12
    # the loss grows as (α₁ − 0.7)² (‖δ‖² + d (s₁ − s₀)²)
    np.testing.assert_allclose(reconstruction_loss(two_atoms(), target(), [0.5, 0.5]),
                               0.2 ** 2 * (4 + 3 * 0.25), rtol=1e-9)


@pytest.mark.parametrize("classes, loss", [((0, 1, 2), 0.0), ((0, 1), REDUCED_LOSS)])
def test_fit_alpha_recovers_the_weights(classes, loss):
    fit = fit_alpha(two_atoms(), target(classes), n_steps=300, labeled=False)
    np.testing.assert_allclose(fit.alpha, ALPHA, atol=1e-3)
    np.testing.assert_allclose(reconstruction_loss(two_atoms(), target(classes), fit.alpha), loss,
                               atol=1e-4)
    assert len(fit.alphas) >= 2 and fit.iterations >= 1
    assert fit.losses[-1] <= fit.losses[0]


def test_fit_alpha_other_start_and_rules():
    for rule in ("projected", "newton"):
        fit = fit_alpha(two_atoms(), target(), n_steps=300, labeled=False,
                        alpha0=[0.95, 0.05], rule=rule)
        np.testing.assert_allclose(fit.alpha, ALPHA, atol=1e-3)


def test_fit_alpha_rejects_other_dimension():
    with pytest.raises(FedalignError, match="d="):
        fit_alpha(two_atoms(), GMM(np.ones(1), np.zeros((1, 2)), np.ones((1, 2))))


def test_study_values(tmp_path):
    rng = np.random.default_rng(0)
    Xt, yt = sample_gmm(target(labeled=True), 300, rng)
    yt[:5] = -1                                                      # unlabeled rows: ignored
    rep = envelope_study(two_atoms(), {"full": target(), "reduced": target((0, 1))}, Xt, yt,
                         n_per_class=200, seeds=(0, 1), n_steps=300, missing={"reduced": [2]})
    assert rep["atoms"] == dict(A=2, K=3, d=3, C=3) and rep["n_test"] == 295
    json.dumps(rep, allow_nan=False)
    full, red = rep["targets"]["full"], rep["targets"]["reduced"]
    np.testing.assert_allclose(full["alpha"], ALPHA, atol=1e-3)
    np.testing.assert_allclose(red["alpha"], ALPHA, atol=1e-3)
    assert full["loss"] < 1e-5
    np.testing.assert_allclose(red["loss"], REDUCED_LOSS, rtol=1e-3)
    assert full["missing_classes"] is None and red["missing_classes"] == [2]
    assert red["gmm"] == dict(K=2, labeled=False, classes=None)
    assert full["fit"]["alphas"][-1] == full["alpha"]
    keep = yt >= 0
    for r in (full, red):
        B = barycenter(two_atoms(), r["alpha"])
        for s, acc in zip((0, 1), r["accuracy"]["linear"]["per_seed"]):  # independent replay
            pred = gmm_classifier(B, "linear", 200, s)(Xt[keep])
            assert acc == pytest.approx(np.mean(pred == yt[keep]))
        lin = r["accuracy"]["linear"]
        assert lin["mean"] == pytest.approx(np.mean(lin["per_seed"])) and lin["mean"] > 0.97
        assert r["accuracy"]["map"]["mean"] == pytest.approx(
            np.mean(map_predict(B, Xt[keep]) == yt[keep]))
        assert [c["n"] for c in lin["per_class"]] == np.bincount(yt[keep], minlength=3).tolist()
    # the missing class is reconstructed from the atoms
    assert red["accuracy"]["linear"]["missing_classes"] > 0.95
    assert red["accuracy"]["map"]["present_classes"] > 0.95


def test_labeled_gmm_missing_defaults_and_bad_inputs():
    rng = np.random.default_rng(1)
    Xt, yt = sample_gmm(target(labeled=True), 60, rng)
    rep = envelope_study(two_atoms(), {"r": target((0, 1), labeled=True)}, Xt, yt,
                         classifiers=("map",), n_steps=50, labeled=None)
    r = rep["targets"]["r"]
    assert r["gmm"]["classes"] == [0, 1] and r["missing_classes"] == [2] and r["fit"]["labeled"]
    assert list(r["accuracy"]) == ["map"]
    with pytest.raises(FedalignError, match="dimension"):
        envelope_study(two_atoms(), {"x": GMM(np.ones(1), np.zeros((1, 2)), np.ones((1, 2)))},
                       Xt, yt)
    with pytest.raises(FedalignError, match="label 3"):
        envelope_study(two_atoms(), {"x": target()}, Xt, np.where(yt == 0, 3, yt))
    with pytest.raises(FedalignError, match="no labelled rows"):
        envelope_study(two_atoms(), {"x": target()}, Xt, np.full(len(yt), -1))
    with pytest.raises(FedalignError, match="no labels"):
        envelope_study(two_atoms(), {"x": target()}, Xt, yt, labeled=True)
    with pytest.raises(FedalignError, match="classifier"):
        envelope_study(two_atoms(), {"x": target()}, Xt, yt, classifiers=("svm",))
    assert parse_classes("2, 0,bike", ["bike", "car", "mug"], 3) == [0, 2]
    with pytest.raises(FedalignError, match="unknown class"):
        parse_classes("boat", ["bike"], 1)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def files(tmp_path):
    a = two_atoms()
    save_atoms(tmp_path / "src.atoms.npz", PublishedAtoms(a.means, a.variances, a.label_logits,
                                                          7, "amazon"))
    save_gmm(tmp_path / "full.gmm.npz", target())
    save_gmm(tmp_path / "red.gmm.npz", target((0, 1)))
    X, y = sample_gmm(target(labeled=True), 120, np.random.default_rng(2))
    write_features(tmp_path / "t.h5", X, y, [f"r{i}" for i in range(len(y))],
                   class_names=["bike", "car", "mug"])
    return tmp_path


def test_cli_report_and_table(files):
    out = files / "env.json"
    r = run("dadil-envelope", "--atoms", files / "src.atoms.npz", "--gmm",
            f"full={files / 'full.gmm.npz'}", "--gmm", f"reduced={files / 'red.gmm.npz'}",
            "--missing", "reduced=mug", "--test", files / "t.h5", "--seeds", "0-1",
            "--steps", 300, "--n-per-class", 100, "--json", out)
    assert r.exit_code == 0, r.output
    assert "full" in r.stdout and "reduced" in r.stdout and "0.30/0.70" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["kind"] == "report" and rep["producer"] == "fedalign dadil-envelope"
    assert rep["source"]["client"] == "amazon" and rep["source"]["round"] == 7
    assert rep["source"]["kind"] == "atoms" and len(rep["source"]["sha256"]) == 64
    assert set(rep["gmms"]) == {"full", "reduced"} and rep["settings"]["seeds"] == [0, 1]
    assert rep["class_names"] == ["bike", "car", "mug"]
    np.testing.assert_allclose(rep["targets"]["reduced"]["alpha"], ALPHA, atol=1e-3)
    np.testing.assert_allclose(rep["targets"]["reduced"]["loss"], REDUCED_LOSS, rtol=1e-3)
    assert rep["targets"]["full"]["loss"] < 1e-5
    assert rep["targets"]["reduced"]["missing_classes"] == [2]
    assert rep["targets"]["reduced"]["accuracy"]["linear"]["per_class"][2]["name"] == "mug"
    assert rep["targets"]["reduced"]["accuracy"]["linear"]["missing_classes"] > 0.95
    # same inputs → the same report
    r = run("dadil-envelope", "--atoms", files / "src.atoms.npz", "--gmm",
            f"full={files / 'full.gmm.npz'}", "--gmm", f"reduced={files / 'red.gmm.npz'}",
            "--missing", "reduced=mug", "--test", files / "t.h5", "--seeds", "0-1",
            "--steps", 300, "--n-per-class", 100, "--json", files / "env2.json")
    assert r.exit_code == 0 and (files / "env2.json").read_text() == out.read_text()


def _bad_files(kind, tmp):
    """A bad variant of one input: returns the CLI arguments that replace the good ones."""
    if kind == "gmm-dim":
        save_gmm(tmp / "bad.gmm.npz", GMM(np.ones(1), np.zeros((1, 2)), np.ones((1, 2))))
        return {"--gmm": f"full={tmp / 'bad.gmm.npz'}"}, "dimension"
    if kind == "gmm-empty":   # by hand: write_npz refuses a zero-size dimension too
        np.savez(tmp / "bad.gmm.npz", __kind__=np.array("gmm"), __format_version__=np.array(1),
                 __meta__=np.array("{}"), weights=np.zeros(0), means=np.zeros((0, 3)),
                 variances=np.zeros((0, 3)))
        return {"--gmm": f"full={tmp / 'bad.gmm.npz'}"}, "has shape (0,): K must be at least 1"
    if kind == "gmm-classes":
        g = GMM(np.ones(1), np.zeros((1, 3)), np.ones((1, 3)), np.ones((1, 4)) / 4)
        save_gmm(tmp / "bad.gmm.npz", g)
        return {"--gmm": f"full={tmp / 'bad.gmm.npz'}"}, "4 classes"
    if kind == "test-classes":
        write_features(tmp / "bad.h5", np.zeros((4, 3)), [0, 1, 2, 3], list("abcd"),
                       class_names=list("abcd"))
        return {"--test": tmp / "bad.h5"}, "4 classes"
    if kind == "test-labels":
        write_features(tmp / "bad.h5", np.zeros((4, 3)), [0, 1, 2, 5], list("abcd"))
        return {"--test": tmp / "bad.h5"}, "label 5"
    if kind == "test-dim":
        write_features(tmp / "bad.h5", np.zeros((4, 5)), [0, 1, 2, 0], list("abcd"))
        return {"--test": tmp / "bad.h5"}, "dimension d=5"
    if kind == "atoms-missing":
        return {"--atoms": tmp / "nope.atoms.npz"}, "no such file"
    if kind == "atoms-not-atoms":
        return {"--atoms": tmp / "full.gmm.npz"}, "is a gmm file"
    if kind == "gmm-missing":
        return {"--gmm": f"full={tmp / 'nope.gmm.npz'}"}, "no such file"
    if kind == "missing-unknown":
        return {"--missing": "other=1"}, "not a --gmm name"
    if kind == "json-is-input":
        return {"--json": tmp / "full.gmm.npz"}, "refusing to overwrite"
    raise AssertionError(kind)


BAD = ["gmm-dim", "gmm-empty", "gmm-classes", "test-classes", "test-labels", "test-dim",
       "atoms-missing", "atoms-not-atoms", "gmm-missing", "missing-unknown", "json-is-input"]


@pytest.mark.parametrize("kind", BAD)
def test_cli_bad_input_one_line_no_file(files, kind):
    args = {"--atoms": files / "src.atoms.npz", "--gmm": f"full={files / 'full.gmm.npz'}",
            "--test": files / "t.h5", "--json": files / "env.json"}
    repl, words = _bad_files(kind, files)
    args.update(repl)
    before = {p: p.read_bytes() for p in files.iterdir()}
    r = run("dadil-envelope", "--steps", 5, *[x for kv in args.items() for x in kv])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not (files / "env.json").exists() or kind == "json-is-input"
    assert {p: p.read_bytes() for p in files.iterdir()} == before     # nothing written


def test_state_file_as_dictionary(files):
    from fedalign.dadil.state import init_client, save_state

    st = init_client("caltech", target(labeled=True), n_atoms=2, seed=0)
    a = two_atoms()
    st.means, st.variances, st.label_logits = a.means, a.variances, a.label_logits
    save_state(files / "c.state.npz", st)
    atoms, src = load_dictionary(files / "c.state.npz")
    assert src["kind"] == "state" and src["client"] == "caltech" and src["alpha"] == [0.5, 0.5]
    np.testing.assert_array_equal(atoms.means, a.means)

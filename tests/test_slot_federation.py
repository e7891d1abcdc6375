"""The in-memory SLOT-Align federation of the grid: τ chosen without test labels, validation
split, participation, determinism; the grid runner and the results generator end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import make_features
from fedalign.federation import Federation, HeadSpec, run_federation, select_tau, validation_split
from fedalign.partition import load_domains

SLOT = Path(__file__).resolve().parents[1] / "examples" / "slot"
HEADS = ["fedcgs", "fedcgs:reference", "fed3r", "ofedavg:reference"]


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    root = tmp_path_factory.mktemp("feat")
    folder = root / "toy"
    folder.mkdir()
    for i, name in enumerate(("a", "b", "c")):
        make_features(folder / f"{name}.h5", n=150 + 40 * i, d=5, n_classes=3, seed=20 + i,
                      shift=1.5 * i, scale=1 + 0.3 * i)
    return root


@pytest.fixture(scope="module")
def domains(features):
    return load_domains(sorted((features / "toy").glob("*.h5")))


def test_validation_split_is_stratified_and_keeps_enough_rows():
    y = np.array([0] * 10 + [1] * 5 + [2] * 1)
    fit, val = validation_split(y, 0.2, [0, 1, 1])
    assert len(np.intersect1d(fit, val)) == 0 and len(fit) + len(val) == len(y)
    assert [int(np.sum(y[val] == c)) for c in range(3)] == [2, 1, 0]
    fit, val = validation_split(np.array([0, 0, 1, 1]), 0.5, 0, min_fit=3)
    assert len(val) == 0 and len(fit) == 4  # holding out would leave fewer than 3 rows


def test_select_tau_breaks_ties_towards_the_smaller_tau():
    assert select_tau({0.0: 0.5, 0.4: 0.7, 1.0: 0.7}) == 0.4
    assert select_tau({0.0: 0.9, 0.4: 0.7}) == 0.0
    assert select_tau({0.0: np.nan, 0.4: 0.7}) == 0.4 and select_tau({0.2: np.nan, 0.6: np.nan}) == 0.2


def test_run_federation_records_everything(domains):
    res, sec = run_federation(domains, 0.5, 0, [0.5, 1.0], HEADS)
    assert set(sec) == {"partition", "full", "selection"}
    assert res["protocol"]["taus"] == [0.0, 0.5, 1.0] and res["protocol"]["redraws"] == 0
    part = res["participation"]
    assert part["taking_part"] + len(part["excluded"]) == part["clients_total"] == 3
    assert sum(part["validation_rows"].values()) > 0
    for label in HEADS:
        h = res["heads"][label]
        assert set(h["test"]) == {"0", "0.5", "1"} and set(h["validation"]) == {"0", "0.5", "1"}
        assert h["selected_tau"] in (0.0, 0.5, 1.0) and h["oracle_tau"] in (0.0, 0.5, 1.0)
        best = max(np.mean(list(v.values())) for v in h["test"].values())
        assert np.mean(list(h["test"][f"{h['oracle_tau']:g}"].values())) == best
    assert res["heads"]["ofedavg:reference"]["params"]["tau_schedule"] == "cosine"
    assert "train_loss" in res["heads"]["ofedavg:reference"]["info"]["0.5"]
    # deterministic: the same inputs give the same result
    again, _ = run_federation(domains, 0.5, 0, [0.5, 1.0], HEADS)
    assert json.dumps(again, sort_keys=True) == json.dumps(res, sort_keys=True)


def test_tau_is_selected_without_test_labels(domains, monkeypatch):
    """Scrambling the test labels changes the test accuracies and may move the oracle τ, but
    never the selected τ̂."""
    heads = ["fedcgs", "fed3r"]
    clean, _ = run_federation(domains, 0.5, 1, [0.3, 0.6, 1.0], heads)
    real = Federation.score

    def scrambled(self, heads_, evals, taus, n_classes, seed, balanced=False):
        if not balanced:  # the test evaluation
            rng = np.random.default_rng(0)
            evals = {d: (X, rng.permutation(y)) for d, (X, y) in evals.items()}
        return real(self, heads_, evals, taus, n_classes, seed, balanced)

    monkeypatch.setattr(Federation, "score", scrambled)
    dirty, _ = run_federation(domains, 0.5, 1, [0.3, 0.6, 1.0], heads)
    for h in heads:
        assert dirty["heads"][h]["selected_tau"] == clean["heads"][h]["selected_tau"]
        assert dirty["heads"][h]["validation"] == clean["heads"][h]["validation"]
        assert dirty["heads"][h]["test"] != clean["heads"][h]["test"]


def test_finer_partition_maps_tests_with_domain_maps(domains):
    res, _ = run_federation(domains, 1.0, 0, [0.5], ["fedcgs"], clients_per_domain=2)
    assert res["participation"]["clients_total"] == 6
    fed = Federation({"a.c0": ("a", domains[0].X[:40], domains[0].y[:40]),
                      "a.c1": ("a", domains[0].X[40:90], domains[0].y[40:90]),
                      "b.c0": ("b", domains[1].X[:50], domains[1].y[:50])})
    assert fed.domain_maps["a"].meta["scope"] == "domain" and fed.domain_maps["b"] is fed.maps["b.c0"]


def test_federation_equals_the_file_pipeline(features, domains, tmp_path):
    """The grid's in-memory federation gives the accuracies of partition → stats → barycenter →
    align (client maps for the train files, domain maps for the test files) → evaluate."""
    from typer.testing import CliRunner

    from fedalign.cli import app
    from fedalign.files import read_report

    runner = CliRunner()

    def ok(*args):
        r = runner.invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, r.output

    res, _ = run_federation(domains, 1.0, 2, [0.6], ["fedcgs", "fed3r"], clients_per_domain=2)
    cl, al = tmp_path / "clients", tmp_path / "al"
    ok("partition", *sorted((features / "toy").glob("*.h5")), "-o", cl, "--alpha", "1.0", "--seed", "2",
       "--clients-per-domain", "2", "--min-client-size", "3", "--exclude-small-clients")
    names = [p.name.split(".train")[0] for p in sorted(cl.glob("*.train.h5"))]
    assert sorted(names) == sorted(res["participation"]["participating"])
    for n in names:
        ok("stats", cl / f"{n}.train.h5", "-o", tmp_path / f"{n}.stats.npz")
    ok("barycenter", *[tmp_path / f"{n}.stats.npz" for n in names], "-o", tmp_path / "ref.npz", "--tol", "1e-6")
    al.mkdir()
    for n in names:
        ok("align", "--tau", "0.6", cl / f"{n}.train.h5", tmp_path / "ref.npz", "--stats",
           tmp_path / f"{n}.stats.npz", "-o", al / f"{n}.train.h5")
    for d in ("a", "b", "c"):
        stats = [a for n in names if n.startswith(d + ".") for a in ("--stats", tmp_path / f"{n}.stats.npz")]
        ok("align", "--tau", "0.6", cl / f"{d}.test.h5", tmp_path / "ref.npz", *stats, "-o", al / f"{d}.test.h5")
    ok("evaluate", "-m", "fedcgs", "-m", "fed3r", "--seeds", "2", "--train", *sorted(al.glob("*.train.h5")),
       "--test", *sorted(al.glob("*.test.h5")), "--json", tmp_path / "r.json")
    rep = read_report(tmp_path / "r.json")
    for m in ("fedcgs", "fed3r"):
        got = rep["methods"][m]["per_seed"][0]
        want = res["heads"][m]["test"]["0.6"]
        assert got.keys() == want.keys()
        assert all(abs(got[d] - want[d]) < 1e-9 for d in got), (m, got, want)


def test_grid_runner_and_results_generator(features, tmp_path):
    out = tmp_path / "grid"
    cmd = [sys.executable, str(SLOT / "run_grid.py"), "--features", str(features), "-o", str(out),
           "--datasets", "toy", "--alphas", "0.5", "--seeds", "0", "1", "--taus", "0", "0.4", "-M", "1", "2",
           "--heads", "fedcgs", "fed3r:reference", "--jobs", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    reports = sorted(out.glob("toy/*.json"))
    assert [p.name for p in reports] == ["M1_a0.5_s0.json", "M1_a0.5_s1.json", "M2_a0.5_s0.json", "M2_a0.5_s1.json"]
    first = reports[0].read_bytes()
    r = subprocess.run(cmd, capture_output=True, text=True)  # resumes: nothing left to run
    assert "0 to run" in r.stdout and reports[0].read_bytes() == first
    md, table = tmp_path / "RESULTS.md", tmp_path / "t.md"
    r = subprocess.run([sys.executable, str(SLOT / "make_results.py"), str(out), "-o", str(md),
                        "--notes", str(tmp_path / "none.md"), "--readme-table", str(table)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    # the protocol is read from the reports, not written by hand
    assert "30 % test split" in text and "20 % of its training rows" in text and "a 150" in text
    assert "M ∈ {1, 2}" in text and "seeds 0, 1" in text and "| clients |" in text
    assert "FedCGS (fedalign)" in text and "Fed3R (reference)" in text and "oracle" in text
    assert "## Finer partitions" in text and "timing.jsonl" in text
    assert table.read_text().startswith("| head | toy α=0.5 |")

"""partition: disjoint, stratified, follows the Dirichlet draw, deterministic, clear errors."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import make_features
from fedalign.cli import app
from fedalign.errors import FedalignError
from fedalign.files import read_features, write_features
from fedalign.partition import load_domains, make_partition, write_partition

runner = CliRunner()


@pytest.fixture
def domains(tmp_path):
    paths = []
    for i, name in enumerate(["alpha", "beta", "gamma"]):
        p = tmp_path / f"{name}.h5"
        make_features(p, n=240 + 30 * i, d=6, n_classes=4, seed=i)
        paths.append(p)
    return paths


def _ids(path):
    return set(read_features(path)[2]["ids"])


def test_disjoint_complete_and_stratified(domains):
    doms = load_domains(domains)
    part = make_partition(doms, alpha=None, seed=3, test_fraction=0.3)
    for d in doms:
        tr = part.clients[f"{d.name}.c0"][1]
        te = part.tests[d.name]
        assert len(np.intersect1d(tr, te)) == 0
        assert len(tr) + len(te) == len(d.y)  # domain shift only: nothing dropped
        for c in range(4):
            assert np.sum(d.y[te] == c) == round(0.3 * np.sum(d.y == c))


def test_per_class_counts_follow_the_draw(domains):
    doms = load_domains(domains)
    part = make_partition(doms, alpha=0.5, seed=1, max_redraws=50)
    P = part.fractions
    assert P.shape == (3, 4) and np.allclose(P.sum(axis=0), 1.0)
    for k, d in enumerate(doms):
        pool = np.setdiff1d(np.arange(len(d.y)), part.tests[d.name])
        idx = part.clients[f"{d.name}.c0"][1]
        assert np.all(np.isin(idx, pool))
        for c in range(4):
            expect = int(np.floor(P[k, c] * np.sum(d.y[pool] == c)))
            assert np.sum(d.y[idx] == c) == expect


def test_clients_per_domain_disjoint_slices(domains):
    doms = load_domains(domains)
    part = make_partition(doms, alpha=1.0, seed=0, clients_per_domain=2, max_redraws=50)
    assert len(part.clients) == 6 and part.fractions.shape == (6, 4)
    for d in doms:
        a, b = part.clients[f"{d.name}.c0"][1], part.clients[f"{d.name}.c1"][1]
        assert len(np.intersect1d(a, b)) == 0
        assert len(np.intersect1d(np.concatenate([a, b]), part.tests[d.name])) == 0


def test_drop_classes(domains):
    doms = load_domains(domains)
    part = make_partition(doms, alpha=None, seed=0, drop=["c1", "beta.c0:0,c3"])
    y = {d.name: d.y for d in doms}
    for name, (dom, idx) in part.clients.items():
        present = set(np.unique(y[dom][idx]))
        assert 1 not in present
        assert (present & {0, 3} == set()) == (name == "beta.c0")
    frac = make_partition(doms, alpha=None, seed=0, drop=["0.5"])
    for name, (dom, idx) in frac.clients.items():
        assert len(np.unique(y[dom][idx])) == 2 and len(frac.dropped[name]) == 2


def test_cli_files_provenance_and_determinism(domains, tmp_path):
    out1, out2 = tmp_path / "p1", tmp_path / "p2"
    args = ["partition", *map(str, domains), "--alpha", "0.5", "--seed", "7", "--max-redraws", "50"]
    r1 = runner.invoke(app, [*args, "-o", str(out1)])
    r2 = runner.invoke(app, [*args, "-o", str(out2)])
    assert r1.exit_code == 0, r1.output
    names = sorted(p.name for p in out1.iterdir())
    assert names == sorted([f"{d}.c0.train.h5" for d in ("alpha", "beta", "gamma")]
                           + [f"{d}.test.h5" for d in ("alpha", "beta", "gamma")])
    for n in names:  # byte-identical for the same seed
        h = [hashlib.sha256((o / n).read_bytes()).hexdigest() for o in (out1, out2)]
        assert h[0] == h[1], n
    X, y, info = read_features(out1 / "beta.c0.train.h5")
    prov = info["provenance"]
    assert (prov["domain"], prov["client"], prov["split"]) == ("beta", "beta.c0", "train")
    assert prov["domains"] == ["alpha", "beta", "gamma"] and prov["alpha"] == 0.5
    assert read_features(out1 / "beta.test.h5")[2]["provenance"]["split"] == "test"
    assert "beta.c0.train" in r1.stdout and "total" in r1.stdout
    # train ∪ test of a domain are disjoint sets of its original ids
    assert not (_ids(out1 / "beta.c0.train.h5") & _ids(out1 / "beta.test.h5"))
    r3 = runner.invoke(app, [*args[:-4], "--seed", "8", "--max-redraws", "50", "-o", str(tmp_path / "p3")])
    assert r3.exit_code == 0
    assert (tmp_path / "p3" / "beta.test.h5").read_bytes() != (out1 / "beta.test.h5").read_bytes()


def _assert_clean_failure(result, out_dir, words):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], result.stderr
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_bad_inputs(domains, tmp_path):
    out = tmp_path / "out"
    wide = tmp_path / "wide.h5"
    make_features(wide, n=100, d=7, n_classes=4)
    _assert_clean_failure(runner.invoke(app, ["partition", str(domains[0]), str(wide), "-o", str(out)]),
                          out, "dimension mismatch")
    other = tmp_path / "other.h5"
    make_features(other, n=100, d=6, n_classes=5)
    _assert_clean_failure(runner.invoke(app, ["partition", str(domains[0]), str(other), "-o", str(out)]),
                          out, "class sets differ")
    # a tiny domain and a very peaked draw: some client ends up empty
    small = tmp_path / "small.h5"
    make_features(small, n=12, d=6, n_classes=4, seed=5)
    args = ["partition", *map(str, domains), str(small), "-o", str(out), "--alpha", "0.01", "--seed", "0"]
    _assert_clean_failure(runner.invoke(app, args), out, "is empty")
    _assert_clean_failure(runner.invoke(app, args), out,
                          "use a larger --alpha, another --seed or a larger --max-redraws")
    _assert_clean_failure(runner.invoke(app, ["partition", *map(str, domains), "-o", str(out),
                                              "--drop-classes", "zebra"]),
                          out, "--drop-classes: unknown class 'zebra'")
    _assert_clean_failure(runner.invoke(app, ["partition", *map(str, domains), "-o", str(out),
                                              "--drop-classes", "nobody:0"]),
                          out, "--drop-classes: unknown client 'nobody'")
    _assert_clean_failure(runner.invoke(app, ["partition", str(domains[0]), "-o", str(out), "--alpha", "-1"]),
                          out, "--alpha")


def test_library_messages_name_parameters(domains):
    """The library words its errors in its parameters; the CLI (above) names its flags."""
    doms = load_domains(domains)
    with pytest.raises(FedalignError, match=r"^drop: unknown class 'zebra'"):
        make_partition(doms, alpha=None, drop=["zebra"])
    with pytest.raises(FedalignError, match="^drop: no class named in"):
        make_partition(doms, alpha=None, drop=[","])
    with pytest.raises(FedalignError, match=r"^test_fraction must be in \[0, 1\)"):
        make_partition(doms, test_fraction=1.0)
    with pytest.raises(FedalignError, match="^min_client_size must be at least 1"):
        make_partition(doms, min_client_size=0)
    with pytest.raises(FedalignError, match="^clients_per_domain must be at least 1"):
        make_partition(doms, clients_per_domain=0)
    with pytest.raises(FedalignError, match="another seed or a larger max_redraws"):
        make_partition(doms, alpha=0.05, seed=0, min_client_size=40)


def test_min_client_size_and_redraws(domains):
    doms = load_domains(domains)
    with pytest.raises(FedalignError, match="fewer than 40 rows"):
        make_partition(doms, alpha=0.05, seed=0, min_client_size=40)
    part = make_partition(doms, alpha=0.05, seed=0, min_client_size=40, max_redraws=500)
    assert part.redraws > 0 and all(len(idx) >= 40 for _, idx in part.clients.values())
    assert part.params["min_client_size"] == 40


def test_unlabeled_rows_rejected(tmp_path):
    p = tmp_path / "u.h5"
    write_features(p, np.zeros((4, 2)), [0, -1, 1, 0], list("abcd"), ["x", "y"])
    with pytest.raises(FedalignError, match="unlabeled"):
        load_domains([p])


def test_write_partition_roundtrip(domains, tmp_path):
    doms = load_domains(domains)
    part = make_partition(doms, alpha=None, seed=0)
    paths = write_partition(doms, part, tmp_path / "w")
    X, y, _ = read_features(tmp_path / "w" / "alpha.c0.train.h5")
    idx = part.clients["alpha.c0"][1]
    assert np.array_equal(X, doms[0].X[idx]) and np.array_equal(y, doms[0].y[idx])
    assert len(paths) == 6

"""SLOT-Align protocol around the maps: pooled (domain) statistics, map owners in provenance,
evaluate's refusal of a test file mapped with a wrong map, clients that take no part, and
O-FedAvg's transport layer through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import make_features
from fedalign.align import (AffineMap, client_map, domain_map, load_map, make_reference, save_map,
                            stats_digest)
from fedalign.cli import app
from fedalign.errors import FedalignError
from fedalign.files import read_features, read_report
from fedalign.partition import load_domains, make_partition
from fedalign.pooling import pool_moments, pool_stats, recentre
from fedalign.stats import Moments, compute_stats, load_stats

runner = CliRunner()


def ok(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def refused(words, *args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.stderr
    return lines[0]


# ---------------------------------------------------------------------------------- pooling
def test_pooled_stats_equal_the_stats_of_the_concatenated_rows(tmp_path):
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 7)) * s + m for n, s, m in [(40, 1.0, 3.0), (25, 2.0, -1.0), (9, 0.5, 10.0)]]
    moms = [Moments(7).update(X).finalize() for X in parts]
    pooled = pool_moments(moms)
    whole = Moments(7).update(np.concatenate(parts)).finalize()
    assert pooled.n == whole.n
    assert np.allclose(pooled.mean, whole.mean, atol=1e-12)
    assert np.allclose(pooled.empirical_covariance(), whole.empirical_covariance(), atol=1e-11)
    assert pooled.fourth_moment_sum() == pytest.approx(whole.fourth_moment_sum(), rel=1e-11)
    # re-centring changes nothing but the shift
    r = recentre(moms[0], np.full(7, 5.0))
    assert np.allclose(r.mean, moms[0].mean) and r.fourth_moment_sum() == pytest.approx(moms[0].fourth_moment_sum())
    from sklearn.covariance import LedoitWolf

    from fedalign.federation import gaussian_stats

    st = pool_stats([gaussian_stats(X) for X in parts])
    lw = LedoitWolf().fit(np.concatenate(parts))
    assert st.shrinkage == pytest.approx(lw.shrinkage_, rel=1e-9)
    assert np.allclose(st.covariance, lw.covariance_, atol=1e-10)


def test_map_owner_and_digest(tmp_path):
    rng = np.random.default_rng(1)
    sts = []
    for i in range(3):
        p = tmp_path / f"c{i}.h5"
        make_features(p, n=60, d=4, seed=i, shift=i)
        sts.append(compute_stats(p))
    ref = make_reference(sts)
    m = client_map(sts[0], ref, "a.c0", "a")
    assert m.meta["scope"] == "client" and m.meta["client"] == "a.c0" and m.meta["domain"] == "a"
    assert m.meta["stats_sha256"] == stats_digest(sts[0]) != stats_digest(sts[1])
    one = domain_map(sts[:1], ref, "a", ["a.c0"])
    assert np.allclose(one.A, m.A) and np.allclose(one.b, m.b)  # M = 1: the domain map is the client map
    dm = domain_map(sts[:2], ref, "a", ["a.c0", "a.c1"])
    assert dm.meta["clients"] == ["a.c0", "a.c1"] and dm.meta["client_stats_sha256"] == [
        stats_digest(s) for s in sts[:2]]
    save_map(tmp_path / "m.npz", dm)
    assert load_map(tmp_path / "m.npz").meta == dm.meta
    # the federation's fast maps are the same maps with the same records
    from fedalign.federation import Federation

    X = [rng.normal(size=(30, 4)) + i for i in range(3)]
    fed = Federation({"a.c0": ("a", X[0], None), "a.c1": ("a", X[1], None), "b.c0": ("b", X[2], None)})
    slow = client_map(fed.stats["a.c1"], fed.reference, "a.c1", "a")
    assert np.allclose(fed.maps["a.c1"].A, slow.A, atol=1e-10) and fed.maps["a.c1"].meta == slow.meta
    slow_d = domain_map([fed.stats["a.c0"], fed.stats["a.c1"]], fed.reference, "a", ["a.c0", "a.c1"])
    assert np.allclose(fed.domain_maps["a"].A, slow_d.A, atol=1e-10) and fed.domain_maps["a"].meta == slow_d.meta


# ---------------------------------------------------------------------------------- the federation on files
@pytest.fixture(scope="module")
def fed2(tmp_path_factory):
    """Two domains × two clients, stats per client, a reference, client maps, domain maps."""
    root = tmp_path_factory.mktemp("fed2")
    paths = []
    for i, name in enumerate(("alpha", "beta")):
        p = root / f"{name}.h5"
        make_features(p, n=300, d=5, n_classes=3, seed=10 + i, shift=2.0 * i, scale=1 + i)
        paths.append(p)
    cl = root / "clients"
    ok("partition", *paths, "-o", cl, "--alpha", "2.0", "--seed", "1", "--clients-per-domain", "2")
    names = [f"{d}.c{k}" for d in ("alpha", "beta") for k in (0, 1)]
    for n in names:
        ok("stats", cl / f"{n}.train.h5", "-o", root / f"{n}.stats.npz")
    ok("barycenter", *[root / f"{n}.stats.npz" for n in names], "-o", root / "ref.npz")
    al = root / "al"
    al.mkdir()
    for n in names:
        ok("align", "--tau", "0.5", cl / f"{n}.train.h5", root / "ref.npz", "--stats", root / f"{n}.stats.npz",
           "-o", al / f"{n}.train.h5", "--save-map", root / f"{n}.map.npz")
    for d in ("alpha", "beta"):
        ok("align", "--tau", "0.5", cl / f"{d}.test.h5", root / "ref.npz", "--stats", root / f"{d}.c0.stats.npz",
           "--stats", root / f"{d}.c1.stats.npz", "-o", al / f"{d}.test.h5", "--save-map", root / f"{d}.dmap.npz")
    return root


def _train(root):
    return sorted(str(p) for p in (root / "al").glob("*.train.h5"))


def test_domain_map_records_its_domain_and_clients(fed2):
    m = load_map(fed2 / "alpha.dmap.npz")
    assert m.meta["scope"] == "domain" and m.meta["domain"] == "alpha"
    assert m.meta["clients"] == ["alpha.c0", "alpha.c1"]
    step = read_features(fed2 / "al" / "alpha.test.h5")[2]["provenance"]["history"][-1]
    assert step["map_scope"] == "domain" and step["map_domain"] == "alpha" and step["tau"] == 0.5
    assert step["map_clients"] == ["alpha.c0", "alpha.c1"]
    tr = read_features(fed2 / "al" / "alpha.c1.train.h5")[2]["provenance"]["history"][-1]
    assert tr["map_scope"] == "client" and tr["map_client"] == "alpha.c1"
    assert tr["stats_sha256"] == stats_digest(load_stats(fed2 / "alpha.c1.stats.npz"))
    refused("one domain", "align", "--tau", "0.5", fed2 / "clients" / "alpha.test.h5", fed2 / "ref.npz",
            "--stats", fed2 / "alpha.c0.stats.npz", "--stats", fed2 / "beta.c0.stats.npz", "-o", fed2 / "x.h5")
    assert not (fed2 / "x.h5").exists()


def test_evaluate_accepts_the_domain_map_and_refuses_wrong_maps(fed2, tmp_path):
    ok("evaluate", "-m", "fedcgs", "--train", *_train(fed2), "--test", fed2 / "al" / "alpha.test.h5",
       fed2 / "al" / "beta.test.h5")
    cl = fed2 / "clients"
    # the map of one of alpha's clients is fine too
    ok("align", "--tau", "0.5", "--map", fed2 / "alpha.c1.map.npz", cl / "alpha.test.h5", "-o", tmp_path / "a1.test.h5")
    ok("evaluate", "-m", "fed3r", "--train", *_train(fed2), "--test", tmp_path / "a1.test.h5")
    # alpha's test split mapped with a beta client's map
    ok("align", "--tau", "0.5", "--map", fed2 / "beta.c0.map.npz", cl / "alpha.test.h5", "-o", tmp_path / "w.test.h5")
    line = refused("not one of 'alpha'", "evaluate", "-m", "fedcgs", "--train", *_train(fed2), "--test",
                   tmp_path / "w.test.h5", "--json", tmp_path / "r.json")
    assert "beta.c0" in line and not (tmp_path / "r.json").exists()
    # … with beta's domain map
    ok("align", "--tau", "0.5", "--map", fed2 / "beta.dmap.npz", cl / "alpha.test.h5", "-o", tmp_path / "wd.test.h5")
    refused("domain map of 'beta'", "evaluate", "-m", "fedcgs", "--train", *_train(fed2), "--test", tmp_path / "wd.test.h5")
    # … with a map of the right client built from other statistics (another shrinkage)
    ok("stats", cl / "alpha.c0.train.h5", "-o", tmp_path / "other.stats.npz", "--shrinkage", "0.9")
    ok("align", "--tau", "0.5", cl / "alpha.test.h5", fed2 / "ref.npz", "--stats", tmp_path / "other.stats.npz",
       "-o", tmp_path / "os.test.h5")
    refused("other statistics", "evaluate", "-m", "fedcgs", "--train", *_train(fed2), "--test", tmp_path / "os.test.h5")
    # … with a map that does not say whose it is (an older map file)
    m = load_map(fed2 / "alpha.c0.map.npz")
    save_map(tmp_path / "old.map.npz", AffineMap(m.A, m.b, {"reference_sha256": m.meta["reference_sha256"]}))
    ok("align", "--tau", "0.5", "--map", tmp_path / "old.map.npz", cl / "alpha.test.h5", "-o", tmp_path / "o.test.h5")
    refused("does not record whose", "evaluate", "-m", "fedcgs", "--train", *_train(fed2), "--test", tmp_path / "o.test.h5")
    # a client's train file aligned with another client's map
    ok("align", "--tau", "0.5", "--map", fed2 / "beta.c1.map.npz", cl / "alpha.c1.train.h5", "-o", tmp_path / "x.train.h5")
    train = [t for t in _train(fed2) if "alpha.c1" not in t] + [str(tmp_path / "x.train.h5")]
    refused("not its own", "evaluate", "-m", "fedcgs", "--train", *train, "--test", fed2 / "al" / "beta.test.h5")


def test_ofedavg_transport_layer_through_the_cli(fed2, tmp_path):
    cl = fed2 / "clients"
    raw = sorted(str(p) for p in cl.glob("*.train.h5"))
    maps = [str(fed2 / f"{d}.c{k}.map.npz") for d in ("alpha", "beta") for k in (0, 1)]
    tests = [fed2 / "al" / "alpha.test.h5", fed2 / "al" / "beta.test.h5"]
    out = tmp_path / "r.json"
    ok("evaluate", "-m", "ofedavg", "--param", "ofedavg.variant=reference", "--param", "ofedavg.epochs=3",
       "--train", *raw, "--map", *maps, "--test", *tests, "--json", out)
    rep = read_report(out)
    res = rep["methods"]["ofedavg"]
    assert res["params"]["tau_max"] == 0.5 and res["params"]["tau_schedule"] == "cosine"
    assert rep["alignment"]["tau"] == 0.5 and "train_loss" in res["diagnostics"][0]
    assert rep["participation"]["taking_part"] == 4
    refused("--map", "evaluate", "-m", "ofedavg", "--param", "ofedavg.variant=reference",
            "--train", *_train(fed2), "--test", *tests)
    refused("tau_max=0.3", "evaluate", "-m", "ofedavg", "--param", "ofedavg.variant=reference",
            "--param", "ofedavg.tau_max=0.3", "--train", *raw, "--map", *maps, "--test", *tests)
    refused("no --map for client", "evaluate", "-m", "ofedavg", "--param", "ofedavg.variant=reference",
            "--train", *raw, "--map", *maps[:3], "--test", *tests)


# ---------------------------------------------------------------------------------- participation
@pytest.fixture
def skewed(tmp_path):
    paths = []
    for i, (name, n) in enumerate([("big", 200), ("mid", 150), ("tiny", 14)]):
        p = tmp_path / f"{name}.h5"
        make_features(p, n=n, d=4, n_classes=4, seed=i)
        paths.append(p)
    return paths


def test_small_clients_take_no_part_and_are_recorded(skewed, tmp_path):
    doms = load_domains(skewed)
    with pytest.raises(FedalignError, match="fewer than 3 rows"):
        make_partition(doms, alpha=0.05, seed=3, min_client_size=3)
    part = make_partition(doms, alpha=0.05, seed=3, min_client_size=3, exclude_small=True)
    assert part.redraws == 0 and part.excluded
    assert all(len(idx) >= 3 for _, idx in part.clients.values())
    assert all(len(idx) < 3 for _, idx in part.excluded.values())
    info = part.participation()
    assert info["clients_total"] == 3 and set(info["participating"]) | set(info["excluded"]) == {
        "big.c0", "mid.c0", "tiny.c0"}
    # the same draw as without exclusion (no redraw): same rows for the participants
    same = make_partition(doms, alpha=0.05, seed=3, min_client_size=1, exclude_small=True)
    for n, (_, idx) in part.clients.items():
        assert np.array_equal(idx, same.clients.get(n, part.excluded.get(n))[1])


def _seed_with_an_excluded_domain(doms):
    for seed in range(200):
        part = make_partition(doms, alpha=0.05, seed=seed, min_client_size=3, exclude_small=True)
        if "tiny.c0" in part.excluded:
            return seed
    raise AssertionError("no seed excludes the tiny domain")


def test_partition_cli_records_participation_and_evaluate_reports_it(skewed, tmp_path):
    seed = _seed_with_an_excluded_domain(load_domains(skewed))
    out = tmp_path / "cl"
    r = ok("partition", *skewed, "-o", out, "--alpha", "0.05", "--seed", seed, "--min-client-size", "3",
           "--exclude-small-clients")
    assert "take no part" in r.stderr and "tiny.c0" in r.stderr
    assert not (out / "tiny.c0.train.h5").exists() and (out / "tiny.test.h5").exists()
    prov = read_features(out / "tiny.test.h5")[2]["provenance"]
    assert "tiny.c0" in prov["excluded"] and "tiny.c0" not in prov["participating"]
    assert prov["client_domains"]["tiny.c0"] == "tiny" and prov["clients_total"] == 3
    train = sorted(str(p) for p in out.glob("*.train.h5"))
    tests = sorted(str(p) for p in out.glob("*.test.h5"))
    rep = tmp_path / "r.json"
    r = ok("evaluate", "-m", "fedcgs", "--train", *train, "--test", *tests, "--json", rep)
    assert "none of its clients took part" in r.stderr
    got = read_report(rep)
    assert got["participation"]["taking_part"] == len(train) and got["participation"]["clients_total"] == 3
    assert "tiny" in got["methods"]["fedcgs"]["per_seed"][0]
    # aligned: the tiny domain's test split stays unaligned and is still accepted
    for f in train:
        c = f.split("/")[-1].split(".train")[0]
        ok("stats", f, "-o", tmp_path / f"{c}.stats.npz")
    ok("barycenter", *sorted(tmp_path.glob("*.stats.npz")), "-o", tmp_path / "ref.npz")
    al = tmp_path / "al"
    al.mkdir()
    for f in train:
        c = f.split("/")[-1].split(".train")[0]
        d = c.split(".c")[0]
        ok("align", "--tau", "0.4", f, tmp_path / "ref.npz", "--stats", tmp_path / f"{c}.stats.npz",
           "-o", al / f"{c}.train.h5", "--save-map", tmp_path / f"{c}.map.npz")
        ok("align", "--tau", "0.4", "--map", tmp_path / f"{c}.map.npz", out / f"{d}.test.h5", "-o", al / f"{d}.test.h5")
    ok("evaluate", "-m", "fed3r", "--train", *sorted(str(p) for p in al.glob("*.train.h5")),
       "--test", *sorted(str(p) for p in al.glob("*.test.h5")), out / "tiny.test.h5")
    # without exclusion the same draw is an error
    refused("fewer than 3 rows", "partition", *skewed, "-o", tmp_path / "no", "--alpha", "0.05", "--seed", seed,
            "--min-client-size", "3")

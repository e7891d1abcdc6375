"""fedalign.dp: calibration against OpenDP and the exact privacy profile, composition, the
empirical noise of repeated releases, clipping, sensitivities, post-processing, DP heads and
the in-memory federation's privacy accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import norm

from fedalign.dp import (DPSpec, Part, analytic_mu, analytic_sigma, classical_sigma, clip_rows,
                         compose_mu, config_record, gdp_delta, gdp_epsilon, make_spec,
                         noise_rng, pool_released, postprocess, release, release_stats,
                         sensitivities, zcdp_epsilon, zcdp_rho, zcdp_sigma)
from fedalign.errors import FedalignError

BUDGETS = [(0.5, 1e-5), (1.0, 1e-6), (2.0, 1e-5), (4.0, 1e-3), (8.0, 1e-6), (0.1, 0.01)]


# ------------------------------------------------------------------------------ calibration
def _opendp():
    """OpenDP's core modules (not ``opendp.prelude``, which imports its scikit-learn extras)."""
    pytest.importorskip("opendp")
    import types

    import opendp.combinators as c
    import opendp.domains as domains
    import opendp.measurements as m
    import opendp.metrics as metrics
    import opendp.mod as mod

    mod.enable_features("contrib")
    dp = types.SimpleNamespace(m=m, c=c, binary_search_param=mod.binary_search_param)
    return dp, (domains.vector_domain(domains.atom_domain(T=float, nan=False)),
                metrics.l2_distance(T=float))


def test_zcdp_sigma_matches_opendp():
    dp, space = _opendp()
    for rho, sens in [(0.5, 1.0), (0.02, 3.0), (1.7, 0.25), (0.0359, 40.0)]:
        sigma = zcdp_sigma(sens, rho)
        # OpenDP's Gaussian measurement (zCDP output measure) at our σ spends our ρ
        assert dp.m.make_gaussian(*space, scale=sigma).map(sens) == pytest.approx(rho, rel=1e-6)
    # and OpenDP's own search for the scale of a ρ finds our σ
    found = dp.binary_search_param(lambda s: dp.m.make_gaussian(*space, scale=s), d_in=3.0, d_out=0.02)
    assert found == pytest.approx(zcdp_sigma(3.0, 0.02), rel=1e-6)
    # the zcdp route of a whole release: one part with all of ρ(ε, δ)
    spec = make_spec(1.0, 1e-5, 3.0, "zcdp")
    _, rec = release({"s": Part(np.zeros(4), 3.0, 1.0)}, spec, noise_rng(0))
    sigma = rec["parts"]["s"]["sigma"]
    rho = zcdp_rho(1.0, 1e-5)
    assert dp.m.make_gaussian(*space, scale=sigma).map(3.0) == pytest.approx(rho, rel=1e-6)
    assert rec["guarantee"]["rho"] == pytest.approx(rho, rel=1e-12)


def test_zcdp_conversion_is_the_standard_one_and_valid():
    dp, space = _opendp()
    for eps, delta in BUDGETS:
        rho = zcdp_rho(eps, delta)
        assert rho + 2 * math.sqrt(rho * math.log(1 / delta)) == pytest.approx(eps, rel=1e-12)
        assert zcdp_epsilon(rho, delta) == pytest.approx(eps, rel=1e-12)
        # exact GDP ε ≤ OpenDP's (tighter) conversion ≤ the standard conversion
        m = dp.c.make_zCDP_to_approxDP(dp.m.make_gaussian(*space, scale=1.0))
        sens = math.sqrt(2 * rho)  # Δ/σ = √(2ρ) with σ = 1
        theirs = m.map(sens).epsilon(delta)
        assert gdp_epsilon(sens, delta) <= theirs * (1 + 1e-9) <= eps * (1 + 1e-9)


def _hockey_stick(eps, sigma, sens):
    """δ(ε) = ∫ (p − e^ε q)₊ for p = N(Δ, σ²), q = N(0, σ²), by numerical integration."""
    t = sigma * sigma * eps / sens + sens / 2  # p > e^ε q exactly for x > t
    f = lambda x: norm.pdf(x, sens, sigma) - math.exp(eps) * norm.pdf(x, 0.0, sigma)  # noqa: E731
    return quad(f, t, t + 40 * sigma, epsabs=0, epsrel=1e-12, limit=200)[0]


def test_analytic_route_meets_the_exact_privacy_profile():
    for eps, delta in BUDGETS:
        mu = analytic_mu(eps, delta)
        assert gdp_delta(eps, mu) == pytest.approx(delta, rel=1e-9)
        sigma = analytic_sigma(2.5, eps, delta)
        # the closed form against an independent numerical integral of the hockey-stick divergence
        assert _hockey_stick(eps, sigma, 2.5) == pytest.approx(delta, rel=1e-6)
        assert gdp_epsilon(mu, delta) == pytest.approx(eps, rel=1e-9)
        if eps < 1:
            assert sigma <= classical_sigma(2.5, eps, delta)
    mus = np.linspace(0.05, 5, 40)
    assert np.all(np.diff([gdp_delta(1.0, m) for m in mus]) > 0)        # more signal, more δ
    assert np.all(np.diff([gdp_delta(e, 1.0) for e in np.linspace(0, 6, 40)]) < 0)
    assert np.all(np.diff([analytic_sigma(1.0, e, 1e-5) for e in [0.25, 0.5, 1, 2, 4, 8]]) < 0)


def test_spec_validation_is_one_line_per_bad_value():
    names = dict(epsilon="--dp-epsilon", delta="--dp-delta", clip="--clip")
    for args, word in [((0, 1e-5, 1), "--dp-epsilon"), ((-1, 1e-5, 1), "--dp-epsilon"),
                       ((math.inf, 1e-5, 1), "--dp-epsilon"), ((1, 0, 1), "--dp-delta"),
                       ((1, 1, 1), "--dp-delta"), ((1, 1.5, 1), "--dp-delta"),
                       ((1, 1e-5, 0), "--clip"), ((1, 1e-5, -3), "--clip"),
                       ((float("nan"), 1e-5, 1), "--dp-epsilon")]:
        with pytest.raises(FedalignError, match=word) as e:
            make_spec(*args, names=names)
        assert "\n" not in str(e.value)
    with pytest.raises(FedalignError, match="mechanism"):
        make_spec(1, 1e-5, 1, "laplace")


# ------------------------------------------------------------------------------ composition
def test_composition_of_equal_releases_and_monotone_epsilon():
    mu1 = analytic_mu(1.0, 1e-5)
    for k in (1, 2, 5, 16):
        assert compose_mu([mu1] * k) == pytest.approx(math.sqrt(k) * mu1, rel=1e-14)
    eps = [gdp_epsilon(2.0 / s, 1e-5) for s in (1, 2, 4, 8, 16)]
    assert np.all(np.diff(eps) < 0)
    # parts of one release compose to its budget, whatever the shares
    spec = make_spec(2.0, 1e-6, 1.0)
    _, rec = release({"a": Part(np.zeros(3), 1.0, 0.1), "b": Part(np.zeros(3), 7.0, 0.9)}, spec,
                     noise_rng(0))
    assert rec["guarantee"]["epsilon"] == pytest.approx(2.0, rel=1e-9)
    # a budget split by μ² into two releases composes back to it (the federation's split)
    for mech in ("analytic", "zcdp"):
        s = make_spec(1.0, 1e-5, 1.0, mech)
        a, b = s.share(0.3), s.share(0.7)
        assert compose_mu([a.mu(), b.mu()]) == pytest.approx(s.mu(), rel=1e-9)


# ------------------------------------------------------------------------------ noise
def test_empirical_noise_matches_the_recorded_sigma():
    rng = np.random.default_rng(3)
    X = clip_rows(rng.normal(size=(30, 4)), 2.0)[0]
    spec = make_spec(1.0, 1e-5, 2.0)
    parts = dict(sum=Part(X.sum(0), 2.0, 0.3), second_moment=Part(X.T @ X, 4.0, 0.7, symmetric=True))
    gen = noise_rng(11)
    sums, seconds = [], []
    for _ in range(2000):
        noisy, rec = release(parts, spec, gen)
        sums.append(noisy["sum"] - X.sum(0))
        seconds.append(noisy["second_moment"] - X.T @ X)
    sums, seconds = np.array(sums), np.array(seconds)
    s1, s2 = rec["parts"]["sum"]["sigma"], rec["parts"]["second_moment"]["sigma"]
    assert np.allclose(sums.std(0) / s1, 1.0, atol=0.07)
    assert np.array_equal(seconds, np.transpose(seconds, (0, 2, 1)))        # mirrored, exactly
    iu = np.triu_indices(4)
    assert np.allclose(seconds[:, iu[0], iu[1]].std(0) / s2, 1.0, atol=0.07)  # σ on every entry
    assert abs(np.corrcoef(seconds[:, 0, 1], seconds[:, 0, 2])[0, 1]) < 0.1   # independent
    # reproducible from the seed, fresh without it
    a = release(parts, spec, noise_rng(5))[0]["sum"]
    assert np.array_equal(a, release(parts, spec, noise_rng(5))[0]["sum"])
    assert not np.array_equal(a, release(parts, spec, noise_rng(None))[0]["sum"])


# ------------------------------------------------------------------------------ clipping, sensitivity
def test_clipping_and_its_reported_fraction():
    X = np.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0], [0.0, 0.0], [1.0, 0.0]])
    Xc, k = clip_rows(X, 1.0)
    assert k == 2 and np.allclose(np.linalg.norm(Xc, axis=1), [1, 0.5, 1, 0, 1])  # ‖x‖ = C stays
    assert np.allclose(Xc[0], [0.6, 0.8]) and np.array_equal(Xc[3], X[3])
    st = release_stats(np.tile(X, (4, 1)), make_spec(1.0, 1e-5, 1.0), noise_rng(0))
    assert st.dp["clipped_fraction"] == pytest.approx(8 / 20)
    assert "not covered" in st.dp["clipped_fraction_note"]


def _upper(M):
    return M[np.triu_indices(M.shape[0])]


def test_sensitivities_hold_on_random_neighbours_and_are_nearly_attained():
    """Add one row to a dataset: the change of every released sum, over heavy-tailed random
    rows (clipped), stays below the stated bound and comes within 5 % of it."""
    from fedalign.heads import fed3r, fedcgs

    rng = np.random.default_rng(0)
    C, d, K = 1.7, 4, 3
    X = rng.normal(size=(20, d))
    y = rng.integers(0, K, 20)
    worst = {}
    for bias in (False, True):
        s = sensitivities(C, bias)
        cfg3 = fed3r.Config(bias=bias)
        base3 = fed3r.client_update(clip_rows(X, C)[0], y, K, cfg3)
        base = fedcgs.client_update(clip_rows(X, C)[0], y, K, fedcgs.Config())
        for _ in range(150):
            x = clip_rows(rng.standard_cauchy(size=(1, d)), C)[0]
            c = rng.integers(0, K, 1)
            X2, y2 = np.vstack([clip_rows(X, C)[0], x]), np.concatenate([y, c])
            m3 = fed3r.client_update(X2, y2, K, cfg3)
            m = fedcgs.client_update(X2, y2, K, fedcgs.Config())
            diffs = dict(gram=np.linalg.norm(_upper(m3["G"] - base3["G"])),
                         cross=np.linalg.norm(m3["B"] - base3["B"]))
            if not bias:
                diffs.update(count=abs((m["class_counts"] - base["class_counts"]).sum()),
                             class_counts=np.linalg.norm(m["class_counts"] - base["class_counts"]),
                             class_sums=np.linalg.norm(m["class_sums"] - base["class_sums"]),
                             sum=np.linalg.norm(m["sum_x"] - base["sum_x"]),
                             second_moment=np.linalg.norm(_upper(m["sum_xx"] - base["sum_xx"])))
            for k, v in diffs.items():
                key = (k, bias)
                worst[key] = max(worst.get(key, 0.0), v)
                assert v <= s[k] * (1 + 1e-12), (k, bias, v, s[k])
    for (k, bias), v in worst.items():
        assert v >= 0.95 * sensitivities(C, bias)[k], (k, bias, v)


# ------------------------------------------------------------------------------ post-processing
def test_postprocessed_covariance_is_spd_and_consistent():
    rng = np.random.default_rng(1)
    d = 6
    X = clip_rows(rng.normal(size=(400, d)) @ np.diag([1, 1, 0.5, 0.5, 0.2, 0.1]), 5.0)[0]
    exact = np.cov(X.T, bias=True)
    for eps, tol in [(0.5, None), (1e6, 1e-3)]:
        st = release_stats(X, make_spec(eps, 1e-5, 5.0), noise_rng(2))
        w = np.linalg.eigvalsh(st.covariance)
        assert np.allclose(st.covariance, st.covariance.T) and w[0] > 0 and w[-1] <= 25 * (1 + 1e-12)
        assert 0 < st.shrinkage <= 1 and st.moments.sum_sqnorm2 is None
        if tol is not None:  # almost no noise: the exact sample moments come back
            assert np.allclose(st.mean, X.mean(0), atol=tol)
            assert np.abs(st.covariance - exact).max() < 0.02
    # all noise: shrinkage to the identity's scale
    st = release_stats(X[:10], make_spec(0.01, 1e-5, 5.0), noise_rng(2))
    assert st.shrinkage > 0.9 and np.linalg.eigvalsh(st.covariance)[0] > 0
    with pytest.raises(FedalignError, match="cannot be honoured"):
        postprocess(10, np.zeros(2), np.eye(2), 1.0, 1.0, 1.0, shrinkage="none")


def test_dp_stats_file_round_trip_and_pooling(tmp_path):
    from fedalign.files import read_npz, write_npz
    from fedalign.pooling import pool_stats
    from fedalign.stats import Moments, load_stats, save_stats, shrunk_covariance

    rng = np.random.default_rng(4)
    spec = make_spec(2.0, 1e-5, 4.0)
    sts = [release_stats(rng.normal(size=(80, 3)), spec, noise_rng(k)) for k in range(2)]
    save_stats(tmp_path / "a.npz", sts[0], dict(dp=sts[0].dp))
    arrays, meta = read_npz(tmp_path / "a.npz", "stats")
    assert "sum_sqnorm_y" not in arrays and not np.any(arrays["shift"]) and meta["dp"]["parts"]
    back = load_stats(tmp_path / "a.npz")
    assert back.dp == sts[0].dp and np.array_equal(back.covariance, sts[0].covariance)
    with pytest.raises(FedalignError, match="fourth-moment"):
        shrunk_covariance(back.moments)
    write_npz(tmp_path / "b.npz", "stats", arrays, {})  # no fourth sums, no DP record: refused
    with pytest.raises(FedalignError, match="only a DP release"):
        load_stats(tmp_path / "b.npz")
    pooled = pool_stats(sts)
    assert pooled.n == round(sum(s.dp["released_count"] for s in sts))
    assert np.allclose(pooled.moments.sum_y, sts[0].moments.sum_y + sts[1].moments.sum_y)
    assert pool_released(sts).covariance.shape == (3, 3)
    exact = Moments(3).update(rng.normal(size=(30, 3))).finalize()
    from fedalign.stats import GaussianStats

    mixed = [sts[0], GaussianStats(30, exact.mean, np.eye(3), 0.1, exact)]
    with pytest.raises(FedalignError, match="DP-released and exact"):
        pool_stats(mixed)


# ------------------------------------------------------------------------------ heads
@pytest.mark.parametrize("head", ["fedcgs", "fed3r"])
def test_dp_heads_record_the_release_and_approach_the_exact_head(head):
    from fedalign.heads import get_method, run_method

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 5)) * 3
    clients = []
    for k in range(3):
        y = rng.integers(0, 3, 150)
        clients.append(((centers[y] + rng.normal(size=(150, 5))).astype(np.float32), y))
    Xt = np.vstack([c[0] for c in clients])
    yt = np.concatenate([c[1] for c in clients])
    exact, _ = run_method(head, clients, 3, seed=0)
    p = {"dp_epsilon": "1e6", "dp_delta": "1e-5", "clip": "20"}
    h, msgs = run_method(head, clients, 3, seed=0, params=p)
    assert abs(h.accuracy(Xt, yt) - exact.accuracy(Xt, yt)) < 0.02
    rec = h.info["dp"]["record"]
    assert rec["epsilon"] == 1e6 and rec["clip"] == 20 and rec["guarantee"]["private"]
    assert len(h.info["dp"]["clipped_fraction"]) == 3 and all("clipped_fraction" in m for m in msgs)
    h2, _ = run_method(head, clients, 3, seed=0, params={**p, "dp_epsilon": "0.5"})
    h3, _ = run_method(head, clients, 3, seed=0, params={**p, "dp_epsilon": "0.5"})
    assert np.array_equal(h2.W, h3.W)               # seeded by the head seed and client index
    assert not np.array_equal(h2.W, exact.W)
    cfg = get_method(head).config(p)
    assert config_record(cfg)["dp_epsilon"] == 1e6
    assert "dp_epsilon" not in config_record(get_method(head).config({}))
    for bad, word in [({"dp_epsilon": "0"}, "dp_epsilon"), ({**p, "dp_delta": "1"}, "dp_delta"),
                      ({**p, "clip": "0"}, "clip"), ({"clip": "3"}, "also give"),
                      ({**p, "dp_mechanism": "gauss"}, "dp_mechanism")]:
        with pytest.raises(FedalignError, match=word):
            get_method(head).config(bad)


@pytest.mark.parametrize("head", ["fedcgs", "fed3r"])
def test_more_budget_does_not_hurt_in_high_dimension(head):
    """d = 200 features whose signal lives in 5 dimensions (the rest small: the low-rank regime
    of frozen encoder features). With the head's own ridge alone the server inverted the
    directions only the noise made, and accuracy collapsed as ε grew (to 25–68 % here, from
    80–86 %); with the noise floor (fedalign.dp.release.noise_floor) a larger ε never costs
    more than noise, and at ε = 1e12 the DP head is the exact one."""
    from fedalign.heads import run_method

    rng = np.random.default_rng(1)
    centers = np.zeros((4, 200))
    centers[:, :5] = rng.normal(size=(4, 5)) * 2
    clients, tests = [], []
    for k in range(3):
        y = rng.integers(0, 4, 240)
        X = centers[y] + np.hstack([rng.normal(size=(240, 5)), 0.03 * rng.normal(size=(240, 195))])
        clients.append((X[:160], y[:160]))
        tests.append((X[160:], y[160:]))
    Xt, yt = np.vstack([t[0] for t in tests]), np.concatenate([t[1] for t in tests])
    exact = run_method(head, clients, 4, seed=0)[0].accuracy(Xt, yt)

    def acc(eps):
        p = {"dp_epsilon": str(eps), "dp_delta": "1e-5", "clip": "10"}
        return run_method(head, clients, 4, seed=0, params=p)[0].accuracy(Xt, yt)

    accs = [acc(e) for e in (30, 1e3, 1e6)]
    assert min(accs) >= min(exact, accs[0]) - 0.05, (accs, exact)
    assert abs(acc(1e12) - exact) < 0.03, exact


# ------------------------------------------------------------------------------ federation
def test_federation_splits_each_clients_budget(tmp_path):
    from conftest import make_features
    from fedalign.federation import FederationDP, run_federation
    from fedalign.partition import load_domains

    for i, name in enumerate("ab"):
        make_features(tmp_path / f"{name}.h5", n=120, d=4, n_classes=3, seed=i, shift=i)
    doms = load_domains(sorted(tmp_path.glob("*.h5")))
    dp = FederationDP(make_spec(1.0, 1e-5, 8.0))
    res, _ = run_federation(doms, 0.5, 0, [0.5], ["fedcgs", "fed3r"], dp=dp, selection=False)
    assert res["dp"]["epsilon"] == 1.0 and res["protocol"]["tau_selection"] is None
    for h in ("fedcgs", "fed3r"):
        for tau in ("0", "0.5"):
            for e in res["heads"][h]["privacy"][tau]:
                assert e["head_message_covered"] and e["total"]["epsilon"] == pytest.approx(1.0, rel=1e-9)
                assert (e["stats"] is None) == (tau == "0")
        assert "validation" not in res["heads"][h]
    ex, _ = run_federation(doms, 0.5, 0, [0.5], ["fedcgs"], selection=False,
                           dp=FederationDP(make_spec(1.0, 1e-5, 8.0), map_stats="exact"))
    e = ex["heads"]["fedcgs"]["privacy"]["0.5"][0]
    assert not e["head_message_covered"] and not e["total"]["private"]
    with pytest.raises(FedalignError, match="without a DP message"):
        run_federation(doms, 0.5, 0, [0.5], ["ofedavg"], dp=dp)
    assert isinstance(dp.spec, DPSpec)


@pytest.mark.parametrize("method", ["fedcgs", "fed3r"])
def test_a_dp_head_message_passes_the_flower_apps_key_checks(method):
    """The Flower app's client and server check a message's keys against the head's declared
    ones: a DP message's optional keys (clipped_fraction) are among them."""
    from fedalign.flower import _lib as lib
    from fedalign.flower.messages import check_finite_message

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(50, 4)), rng.integers(0, 3, 50)
    msg = lib.head_client_update(method, {"dp_epsilon": 1.0, "dp_delta": 1e-6, "clip": 5.0},
                                 X, y, 3, 0, 0, 0, None)
    assert "clipped_fraction" in msg
    assert set(check_finite_message("node", method, msg, lib.head_message_keys(method))) == set(msg)

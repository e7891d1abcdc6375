"""One SLOT-Align federation in memory: partition → statistics → barycenter → maps → every head
at every τ, with τ chosen on a validation split of the clients' training data.

This is what the file pipeline (``partition``, ``stats``, ``barycenter``, ``align --save-map`` /
``--map`` / ``--stats …``, ``evaluate``) does, in one process, for a grid of runs
(``examples/slot/run_grid.py``): a partition's statistics, barycenter and maps are computed
once and reused for every τ (T_τ = (1 − τ) I + τ A is affine in τ), and no process starts per
step.

Protocol of :func:`run_federation` (dataset, α, seed s, M clients per domain)
--------------------------------------------------------------------------------
1. **Partition** (:func:`fedalign.partition.make_partition`, seed s): per domain a stratified
   test split, Dirichlet(α) label shift over the K = D·M clients, **no redraws**; a client with
   fewer than ``min_client_size`` = 3 rows takes no part (``exclude_small``), as in a real
   federation, and is recorded. Three, not two: the Ledoit–Wolf estimate of two rows has
   shrinkage exactly 0 (b² = (β̃/n − ‖Σ̂‖²)/(nd) vanishes for n = 2, as in scikit-learn), so
   its covariance is singular and ``fedalign stats`` refuses it.
2. **Validation split**: every participating client holds out a stratified ``val_fraction`` of
   its training rows (per class ``round(f · n_c)`` rows), unless that would leave it fewer than
   ``min_client_size`` rows (then it holds out nothing).
3. Two federations are built the same way: ``full`` (every training row) and ``selection``
   (the rows not held out). Each: client statistics (mean, Ledoit–Wolf covariance) →
   barycenter (sample weights) → every client's map, and every domain's map (the OT map of its
   participating clients' pooled statistics, :func:`fedalign.align.domain_map`; with M = 1 the
   client map). At each τ: each client's training rows through its own map; the domain's
   evaluation rows through the domain map — ``full``: its test split, ``selection``: its
   clients' pooled held-out rows. A domain with no participating client has no map: its test
   split is scored unaligned (and has no validation rows).
4. Every head (:class:`HeadSpec`: method and variant) is trained once per τ in each
   federation, partition seed = head seed = s. O-FedAvg with its transport layer
   (``tau_schedule=cosine``, the reference variant) trains on the unaligned rows through the
   client maps with τ_max = τ; every other head on the rows aligned at τ.
5. **τ selection** (no test label is used): τ̂ = the τ with the best validation macro accuracy
   of the ``selection`` federation, each domain's accuracy class-balanced
   (:func:`balanced_accuracy`; ties → the smaller τ); the result reports the ``full``
   federation's test accuracy at τ̂. The best τ on the test accuracy itself is reported only as
   the *oracle*.

Accuracy is per test domain; the macro mean is over the test domains.

Differential privacy (``dp``: :class:`FederationDP`; off by default, and the output is then
what it was without it). Each client's total budget (ε, δ) per run is split by μ² (ρ):
``stats_share`` to its statistics release (:func:`fedalign.dp.release_stats`, rows clipped to
C; the barycenter sees only released statistics), the rest to its DP head message (fedcgs,
fed3r: ``HEAD.dp_*``); at τ = 0 nothing but the head message is sent, so it gets the whole
budget. Every client's total is therefore (ε, δ) at every τ (reported per head, τ and client
under ``privacy``). ``map_stats``: the maps are built from the *released* statistics (default:
the guarantee then covers the head message, the map being post-processing) or from each
client's *exact* statistics (what a client may do with statistics that never leave it — but
then one row moves every mapped row and the head message is not covered, which the report
says). ``selection=False`` skips the τ-selection federation (its second release of the same
rows would need its own budget); the result then reports the test accuracy at every τ only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
# a client's Gaussian proxy from its rows, re-exported (its home: fedalign.stats)
from fedalign.stats import gaussian_stats

#: Labels of the default heads, in table order.
DEFAULT_HEADS = ("ofedavg", "ofedavg:reference", "fedcgs", "fedcgs:reference", "fedpft",
                 "fedpft:reference", "fed3r", "fed3r:reference", "centralized")


@dataclass(frozen=True)
class FederationDP:
    """A federation's privacy: every client's total budget ``spec``
    (:class:`fedalign.dp.DPSpec`) per run, the share of μ² its statistics get, and which
    statistics build the maps ("released" or "exact"; module docstring)."""

    spec: object
    stats_share: float = 0.5
    map_stats: str = "released"

    def __post_init__(self):
        if not 0.0 < self.stats_share < 1.0:
            raise FedalignError(f"stats_share must be in (0, 1), got {self.stats_share}")
        if self.map_stats not in ("released", "exact"):
            raise FedalignError(f"map_stats must be released or exact, got {self.map_stats!r}")

    def head_params(self, tau: float) -> dict:
        """A DP head's options at τ: the whole budget at τ = 0 (no statistics sent), else the
        share left after the statistics."""
        sp = self.spec if tau == 0 else self.spec.share(1.0 - self.stats_share)
        return dict(dp_epsilon=sp.epsilon, dp_delta=sp.delta, clip=sp.clip, dp_mechanism=sp.mechanism)


@dataclass(frozen=True)
class HeadSpec:
    """A registered method in one variant, with extra options. Label: ``method[:variant]``."""

    method: str
    variant: str = "fedalign"
    params: tuple = ()

    @classmethod
    def parse(cls, label: str) -> "HeadSpec":
        method, _, variant = label.partition(":")
        return cls(method, variant or "fedalign")

    @property
    def label(self) -> str:
        return self.method if self.variant == "fedalign" else f"{self.method}:{self.variant}"

    def config(self, **extra):
        from fedalign.heads import get_method

        return get_method(self.method).config({**dict(self.params), "variant": self.variant, **extra})


def validation_split(y: np.ndarray, fraction: float, seed, min_fit: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Stratified hold-out of a client's rows: (fit_idx, val_idx), per class round(f · n_c);
    nothing is held out when fewer than ``min_fit`` rows would remain."""
    from fedalign.partition import stratified_split

    fit, val = stratified_split(np.asarray(y), fraction, np.random.default_rng(seed))
    if len(fit) < min_fit:
        return np.arange(len(y)), np.zeros(0, dtype=np.int64)
    return fit, val


class Federation:
    """Statistics, barycenter, client maps and domain maps of one set of clients.

    Parameters
    ----------
    clients : dict name → (domain, X (n, d), y (n,)) — participating clients only
    tol : barycenter tolerance (relative change of the fixed point)
    """

    def __init__(self, clients: dict, tol: float = 1e-6, dp: FederationDP | None = None,
                 seed: int = 0):
        from fedalign.align import make_reference, maps_onto, stats_digest
        from fedalign.pooling import pool_stats

        self.clients, self.dp = clients, dp
        if dp is None:
            self.stats = {n: gaussian_stats(X) for n, (_, X, _) in clients.items()}
            map_stats = self.stats
        else:
            from fedalign.dp import noise_rng, reference_inputs, release_stats

            sp = dp.spec.share(dp.stats_share)
            self.stats = {n: release_stats(X, sp, noise_rng(seed, k, 1))
                          for k, (n, (_, X, _)) in enumerate(clients.items())}
            map_stats = (self.stats if dp.map_stats == "released" else
                         {n: gaussian_stats(X) for n, (_, X, _) in clients.items()})
        self.reference = make_reference(list(self.stats.values()), "samples", tol=tol)
        if dp is not None:
            self.reference.meta["dp_inputs"] = reference_inputs(
                [dict(client=n, domain=dom, dp=self.stats[n].dp) for n, (dom, _, _) in clients.items()],
                [stats_digest(st) for st in self.stats.values()])
        # every client's map and every domain's map of several clients (its clients' pooled
        # statistics, as fedalign.align.domain_map), one builder, the reference's root once
        members = {}
        for n, (dom, _, _) in clients.items():
            members.setdefault(dom, []).append(n)
        pooled = {dom: pool_stats([map_stats[n] for n in names])
                  for dom, names in members.items() if len(names) > 1}
        owners = [dict(scope="client", client=n, domain=dom) for n, (dom, _, _) in clients.items()]
        owners += [dict(scope="domain", domain=dom, clients=members[dom],
                        client_stats_sha256=[stats_digest(map_stats[n]) for n in members[dom]])
                   for dom in pooled]
        maps = maps_onto([map_stats[n] for n in clients] + list(pooled.values()),
                         self.reference, owners)
        self.maps = dict(zip(clients, maps))
        pooled_maps = dict(zip(pooled, maps[len(clients):]))
        self.domain_maps = {dom: pooled_maps[dom] if dom in pooled else self.maps[names[0]]
                            for dom, names in members.items()}

    @staticmethod
    def move(X: np.ndarray, amap, tau: float) -> np.ndarray:
        """T_τ(X) (float32); X itself at τ = 0 or without a map."""
        from fedalign.align import apply_map

        if amap is None or tau == 0:
            return np.asarray(X, dtype=np.float32)
        return apply_map(X, amap, tau)

    def score(self, heads, evals: dict, taus, n_classes: int, seed: int, balanced: bool = False) -> dict:
        """Accuracy of every head at every τ on ``evals`` {domain: (X, y)} (moved by the domain
        map; unmoved for a domain without one); ``balanced``: the mean of the per-class
        accuracies over the classes present (:func:`balanced_accuracy`). Returns
        {label: {"acc": {τ: {domain: acc}}, "info": {τ: head.info}}}."""
        from fedalign.heads import get_method, run_method

        out = {h.label: {"acc": {}, "info": {}} for h in heads}
        raw = [(X, y) for _, X, y in self.clients.values()]
        transports = [(self.maps[n].A, self.maps[n].b) for n in self.clients]
        for tau in taus:
            train = [(self.move(X, self.maps[n], tau), y) for n, (_, X, y) in self.clients.items()]
            ev = {d: (self.move(X, self.domain_maps.get(d), tau), y) for d, (X, y) in evals.items()}
            for h in heads:
                extra = {"tau_max": float(tau)} if h.method == "ofedavg" else {}
                if self.dp is not None:
                    extra.update(self.dp.head_params(tau))
                cfg = h.config(**extra)
                layer = getattr(cfg, "tau_schedule", "fixed") == "cosine" and tau > 0
                head, _ = run_method(get_method(h.method), raw if layer else train, n_classes,
                                     seed=seed, transports=transports if layer else None, config=cfg)
                out[h.label]["acc"][tau] = {
                    d: balanced_accuracy(head, X, y) if balanced else head.accuracy(X, y)
                    for d, (X, y) in ev.items() if len(y)}
                out[h.label]["info"][tau] = head.info
                if self.dp is not None:
                    out[h.label].setdefault("privacy", {})[tau] = self.privacy(head, tau)
        return out

    def privacy(self, head, tau: float) -> list:
        """Every client's privacy at τ: its statistics release (τ > 0) composed with its head
        message (:func:`fedalign.dp.compose`)."""
        from fedalign.dp import compose, summary
        from fedalign.dp.accounting import NOT_COVERED

        rec = head.info["dp"]
        covered = tau == 0 or self.dp.map_stats == "released"
        out = []
        for k, n in enumerate(self.clients):
            st = summary(self.stats[n].dp) if tau > 0 else None
            hd = summary(dict(rec["record"], clipped_fraction=rec["clipped_fraction"][k]))
            reason = None if covered else NOT_COVERED
            out.append(dict(client=n, stats=st, head=hd, head_message_covered=covered,
                            reason=reason, total=compose(st, hd, covered, reason)))
        return out


def balanced_accuracy(head, X, y) -> float:
    """Mean over the classes present in y of the per-class accuracy.

    The validation rows of a client follow its own skewed label distribution, the test split of
    a domain follows the domain's; weighting every class equally removes the client's label
    skew from the selection score (not the classes it lacks, which no training-data split can
    show).
    """
    y = np.asarray(y)
    pred = head.predict(np.asarray(X))
    return float(np.mean([np.mean(pred[y == c] == c) for c in np.unique(y)]))


def select_tau(macro: dict) -> float:
    """The τ of the best value of ``macro`` {τ: accuracy}; ties → the smallest τ. NaN values
    (nothing to score) are ignored; with none left, the smallest τ (no alignment)."""
    valid = {t: v for t, v in macro.items() if not np.isnan(v)}
    if not valid:
        return min(macro)
    best = max(valid.values())
    return min(t for t, v in valid.items() if v >= best - 1e-12)


def _macro(acc: dict) -> float:
    return float(np.mean(list(acc.values()))) if acc else float("nan")


def run_federation(domains, alpha, seed: int, taus, heads=None, clients_per_domain: int = 1,
                   test_fraction: float = 0.3, val_fraction: float = 0.2, min_client_size: int = 3,
                   tol: float = 1e-6, dp: FederationDP | None = None,
                   selection: bool = True) -> tuple[dict, dict]:
    """Run the protocol of the module docstring for one (α, seed, M).

    Returns
    -------
    result : JSON-ready dict (deterministic given the inputs and the seed)
    seconds : {"partition", "full", "selection"} wall time of the parts (not in ``result``)

    Parameters
    ----------
    domains : list of :class:`fedalign.partition.Domain`
    alpha : Dirichlet concentration (None: domain shift only)
    taus : τ values (0 is the unaligned baseline and is always included)
    heads : list of :class:`HeadSpec` or labels (default :data:`DEFAULT_HEADS`)
    dp : :class:`FederationDP` (module docstring); heads must then send DP messages
        (fedcgs, fed3r)
    selection : run the τ-selection federation (False: no validation split is scored, no τ̂)
    """
    from fedalign.partition import check_compatible, make_partition

    t0 = time.perf_counter()
    heads = [h if isinstance(h, HeadSpec) else HeadSpec.parse(h) for h in (heads or DEFAULT_HEADS)]
    if dp is not None:
        _check_dp_heads(heads)
    taus = sorted({0.0, *map(float, taus)})
    C = check_compatible(domains)
    part = make_partition(domains, alpha, seed, test_fraction, clients_per_domain,
                          min_client_size=min_client_size, exclude_small=True)
    by = {d.name: d for d in domains}
    full, fit, val = {}, {}, {}
    for k, (name, (dom, idx)) in enumerate(part.clients.items()):
        X, y = by[dom].X[idx], by[dom].y[idx]
        full[name] = (dom, X, y)
        f, v = validation_split(y, val_fraction, [seed, k, 1], min_client_size)
        fit[name] = (dom, X[f], y[f])
        val[name] = (dom, X[v], y[v])
    tests = {d: (by[d].X[idx], by[d].y[idx]) for d, idx in part.tests.items()}
    vals = {}
    for name, (dom, X, y) in val.items():
        if len(y):
            Xo, yo = vals.get(dom, (np.zeros((0, X.shape[1]), np.float32), np.zeros(0, np.int64)))
            vals[dom] = (np.concatenate([Xo, X]), np.concatenate([yo, y]))
    t1 = time.perf_counter()
    fed_full = Federation(full, tol, dp, seed)
    test_scores = fed_full.score(heads, tests, taus, C, seed)
    t2 = time.perf_counter()
    fed_sel = Federation(fit, tol, dp, seed) if selection else None
    val_scores = fed_sel.score(heads, vals, taus, C, seed, balanced=True) if selection else None
    t3 = time.perf_counter()

    from fedalign.results import json_safe as _json_safe

    results = {}
    for h in heads:
        test = test_scores[h.label]["acc"]
        oracle = select_tau({t: _macro(test[t]) for t in taus})
        results[h.label] = dict(
            method=h.method, variant=h.variant,
            params=_json_safe(_config_dict(h.config())),
            test={f"{t:g}": test[t] for t in taus})
        if selection:
            valid = val_scores[h.label]["acc"]
            results[h.label]["validation"] = {f"{t:g}": valid[t] for t in taus}
        results[h.label]["info"] = {f"{t:g}": _json_safe(test_scores[h.label]["info"][t]) for t in taus}
        if selection:
            results[h.label]["selected_tau"] = select_tau({t: _macro(valid[t]) for t in taus})
        results[h.label]["oracle_tau"] = oracle
        if dp is not None:
            results[h.label]["privacy"] = {f"{t:g}": _json_safe(v)
                                           for t, v in test_scores[h.label]["privacy"].items()}
    mapped = set(fed_full.domain_maps)
    out = dict(
        producer="fedalign federation",
        protocol=dict(alpha=alpha, seed=seed, clients_per_domain=clients_per_domain,
                      test_fraction=test_fraction, val_fraction=val_fraction,
                      min_client_size=min_client_size, redraws=0, barycenter_tol=tol,
                      barycenter_weights="samples", taus=taus, head_seed=seed,
                      tau_selection=("macro over domains of the class-balanced validation accuracy "
                                     "of the selection federation; ties → the smaller τ")),
        domains=[d.name for d in domains], class_names=list(domains[0].class_names),
        domain_rows={d.name: int(len(d.y)) for d in domains},
        participation=dict(part.participation(), taking_part=len(part.clients),
                           rows={n: int(len(v[2])) for n, v in full.items()},
                           validation_rows={n: int(len(v[2])) for n, v in val.items()}),
        test_rows={d: int(len(y)) for d, (_, y) in tests.items()},
        unmapped_domains=[d for d in tests if d not in mapped],
        barycenter=dict(full=fed_full.reference.meta["convergence"],
                        selection=fed_sel.reference.meta["convergence"] if selection else None),
        heads=results,
    )
    if not selection:
        out["protocol"]["tau_selection"] = None
    if dp is not None:
        out["dp"] = _json_safe(_dp_record(dp, fed_full))
    return out, dict(partition=t1 - t0, full=t2 - t1, selection=t3 - t2)


def _check_dp_heads(heads) -> None:
    import dataclasses

    from fedalign.heads import get_method

    bad = [h.label for h in heads if "dp_epsilon" not in
           {f.name for f in dataclasses.fields(get_method(h.method).load().Config)}]
    if bad:
        raise FedalignError(f"heads without a DP message: {', '.join(bad)} (DP heads: fedcgs, fed3r)")


def _dp_record(dp: FederationDP, fed: Federation) -> dict:
    """The federation's privacy protocol and every client's statistics release."""
    from fedalign.dp import NEIGHBOURING, summary
    from fedalign.dp.release import SIMULATION_SEED

    sp = dp.spec
    return dict(epsilon=sp.epsilon, delta=sp.delta, clip=sp.clip, mechanism=sp.mechanism,
                neighbouring=NEIGHBOURING, stats_share=dp.stats_share, map_stats=dp.map_stats,
                noise_seed=SIMULATION_SEED,
                per_client_budget=("every client's total over one run (its statistics and its "
                                   "head message composed by Gaussian DP) is (ε, δ) at every τ"),
                stats_release={n: summary(st.dp) for n, st in fed.stats.items()},
                stats_postprocessing={n: st.dp["postprocessing"] for n, st in fed.stats.items()})


def _config_dict(cfg) -> dict:
    from fedalign.dp import config_record

    return config_record(cfg)

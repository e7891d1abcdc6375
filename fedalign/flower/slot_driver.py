"""The server's SLOT-Align run (one shot; three exchanges), :func:`run_slot`.

1. ``query.stats`` → each client: n, mean, Ledoit–Wolf covariance (d × d float64); the
   server: Bures–Wasserstein barycenter (:func:`fedalign.align.make_reference`), written as
   ``OUT/ref.npz``;
2. ``train.heads`` → each client maps its own train and test files to the reference at τ
   (the reference travels in this message), then sends one aggregate per head and seed
   (FedCGS/Fed3R sums, FedPFT GMMs, O-FedAvg's head trained from the server's common start;
   a head with R rounds takes R exchanges); the server builds every global head;
3. ``evaluate.heads`` → each client with a test split: accuracy of every head on its domain;
   ``OUT/slot.json`` (the ``fedalign evaluate`` report format plus the communication record).

The nodes are asked through :class:`~fedalign.flower.exchange.Exchange`; a client lost on the
way is dropped from the federation (:mod:`fedalign.flower.exchange`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from fedalign.flower import _lib as lib
from fedalign.flower import handlers
from fedalign.flower import messages as m
from fedalign.flower.exchange import Exchange, lost_clients, majority
from fedalign.flower.messages import NodeReplyError, Payload
from fedalign.flower.settings import Settings

#: Heads the relayed run refuses: ``centralized`` would send the raw features.
REFUSED_HEADS = {"centralized": "the pooled-data reference sends raw features and labels"}


@dataclass
class _Plan:
    """What the settings ask for, checked before any node is asked: the heads, their options
    and rounds, the seeds."""

    methods: list
    params: dict
    rounds: dict
    seeds: list


@dataclass
class _Clients:
    """The clients that answered the stats query: ``names`` {node id: client}, ``order`` (by
    client), the common class names, dimension d and class count C, and their Gaussian
    proxies (in ``order``)."""

    names: dict
    order: list
    class_names: list
    d: int
    C: int
    stats: list


def run_slot(ex: Exchange, s: Settings, out: Path) -> dict:
    """SLOT-Align and the chosen heads over the nodes; writes OUT/ref.npz and OUT/slot.json."""
    t0 = time.perf_counter()
    timing = {}
    plan = _plan(s)
    nodes = ex.wait_for_nodes()
    ex.say(f"SLOT-Align: {len(nodes)} nodes; stats query")
    cl = _query_stats(ex, s, nodes)
    timing["stats"] = time.perf_counter() - t0
    ref, sha = _reference(ex, s, out, cl)
    timing["barycenter"] = time.perf_counter() - t0 - timing["stats"]

    t1 = time.perf_counter()
    jobs, built, steps, order = _train_heads(ex, s, plan, cl, ref, sha)
    timing["heads"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    domains, results = _evaluate(ex, plan, cl.names, order, jobs, built, steps)
    timing["evaluate"] = time.perf_counter() - t1
    timing["total"] = time.perf_counter() - t0

    report = _report(ex, s, plan, cl, order, domains, results, sha, timing)
    lib.write_report(out / "slot.json", lib.json_safe(report))
    ex.say(_accuracy_lines(results, list(domains)))
    for r in results:
        for line in lib.privacy_lines(r):
            ex.say(line)
    return report


def _plan(s: Settings) -> _Plan:
    methods = [h.strip() for h in s.heads.split(",") if h.strip()]
    for h in methods:
        if h in REFUSED_HEADS:
            raise lib.FedalignError(f"head {h} is not available across sites: {REFUSED_HEADS[h]}")
    params = s.head_params(methods)
    rounds = {h: lib.head_rounds(h, params.get(h)) for h in methods}  # validates names/options
    seeds = Settings.seed_list(s.seeds)
    lib.check_tau(s.tau)
    return _Plan(methods, params, rounds, seeds)


# --------------------------------------------------------------------------------------------
# 1. Statistics and the reference
# --------------------------------------------------------------------------------------------


def _check_stats(ex: Exchange, d: int, names: list):
    def check(nid, p: Payload):
        lab = ex.label(nid)
        c = p.config
        if int(c.get("d", -1)) != d:
            raise NodeReplyError(lab, f"stats reply has dimension d={c.get('d')}, the other "
                                      f"clients d={d}")
        a = m.check_arrays(lab, "stats", p.group("stats"), {"mean": (d,), "covariance": (d, d)})
        n = c.get("n")
        if not isinstance(n, int) or n < 2:
            raise NodeReplyError(lab, f"stats reply has n={n!r}, expected an integer ≥ 2")
        try:
            lib.check_spd(a["covariance"], "covariance")
        except lib.FedalignError as e:
            raise NodeReplyError(lab, f"stats reply: {e}") from None
        if list(c.get("class_names") or []) != names:
            raise NodeReplyError(lab, "stats reply has other class names than the other clients")
        return None
    return check


def _query_stats(ex: Exchange, s: Settings, nodes: list) -> _Clients:
    """``query.stats``: the clients whose statistics agree with the majority's d and class
    names, and their Gaussian proxies."""
    replies = ex.ask({n: (m.STATS, Payload({}, dict(shrinkage=s.shrinkage))) for n in nodes},
                     "slot-align", "stats")
    ok = {n: r for n, r in replies.items() if not isinstance(r, NodeReplyError)}
    d = majority(int(r.config.get("d", -1)) for r in ok.values())
    names = list(majority(tuple(r.config.get("class_names") or []) for r in ok.values()) or ())
    good = ex.keep(replies, "federation", _check_stats(ex, d, names))
    clients = {}
    for nid, r in good.items():
        c = r.config["client"]
        if c in clients.values():
            raise lib.FedalignError(f"two nodes answered as client {c!r} (node names must differ)")
        clients[nid] = c
    ex.require(good, "SLOT-Align stats")
    order = sorted(good, key=lambda n: clients[n])
    # the class count as fedalign evaluate takes it: the class names, else the largest label
    C = len(names) if names else 1 + max(int(good[n].config.get("max_label", -1)) for n in order)
    stats = [lib.client_gaussian(good[n].config["n"], good[n].group("stats")["mean"],
                                 good[n].group("stats")["covariance"],
                                 good[n].config.get("shrinkage", 0.0), names) for n in order]
    return _Clients(clients, order, names, d, C, stats)


def _reference(ex: Exchange, s: Settings, out: Path, cl: _Clients):
    """The barycenter of the clients' Gaussians, written as OUT/ref.npz → (reference, sha256)."""
    ref = lib.make_reference(cl.stats, s.weights, tol=s.tol, max_iter=s.max_iter)
    ref_path = out / "ref.npz"
    lib.save_reference(ref_path, ref, dict(producer="fedalign flower (ServerApp)",
                                           clients=[cl.names[n] for n in cl.order]))
    sha = lib.sha256_file(ref_path)
    conv = ref.meta["convergence"]
    ex.say(f"barycenter of {len(cl.order)} clients (d={cl.d}): {conv['iterations']} iterations, "
           f"residual {conv['residual']:.2e} → {ref_path}")
    return ref, sha


# --------------------------------------------------------------------------------------------
# 2. Heads
# --------------------------------------------------------------------------------------------


def _train_heads(ex: Exchange, s: Settings, plan: _Plan, cl: _Clients, ref, sha: str):
    """Every head and seed over its rounds, one ``train.heads`` exchange a round (the first
    carries the reference: each node aligns its files, then trains).

    Returns
    -------
    jobs : [{id, method, seed}]
    built : {job id: the global head}
    steps : {node id: the ``align`` step its train file records (its statistics' release)}
    order : the nodes left, by client
    """
    jobs = [dict(id=f"{h}/s{seed}", method=h, seed=int(seed))
            for h in plan.methods for seed in plan.seeds]
    init = {j["id"]: lib.head_server_init(j["method"], plan.params.get(j["method"]), cl.d, cl.C,
                                          j["seed"])
            for j in jobs}
    built, steps, order = {}, {}, list(cl.order)
    for r in range(max(plan.rounds.values()) if plan.rounds else 0):
        active = [j for j in jobs if plan.rounds[j["method"]] > r]
        reqs = {nid: (m.HEADS, _heads_payload(s, plan, cl.C, active, init, k, r, ref, sha))
                for k, nid in enumerate(order)}
        replies = ex.ask(reqs, "head-jobs", f"heads round {r}")
        good = ex.keep(replies, "federation", _check_messages(ex, active, r))
        order = [n for n in order if n in good]
        ex.require(good, f"heads round {r}" + (" (with the alignment)" if r == 0 else ""))
        for n in order:
            if r == 0:
                steps[n] = good[n].config.get("align_step")
        for j in active:
            built[j["id"]], init[j["id"]] = _aggregate(plan, cl.C, good, order, j, r)
    return jobs, built, steps, order


def _heads_payload(s: Settings, plan: _Plan, C: int, active: list, init: dict, k: int, r: int,
                   ref, sha: str) -> Payload:
    """Client k's ``train.heads`` message of round r: the active jobs, their broadcasts, and in
    round 0 the reference and τ."""
    arrays = {f"init/{j['id']}/r{r}": _arrays(init[j["id"]]) for j in active
              if init[j["id"]] is not None}
    cfg = dict(n_classes=C, jobs=[dict(id=f"{j['id']}/r{r}", method=j["method"],
                                       params=plan.params.get(j["method"]), seed=j["seed"],
                                       k=k, round=r) for j in active])
    if r == 0:  # the reference travels with the first heads message: align, then train
        arrays[handlers.REFERENCE] = {"mean": ref.mean, "covariance": ref.covariance}
        cfg.update(tau=s.tau, reference_sha256=sha)
    return Payload(arrays, cfg)


def _check_messages(ex: Exchange, active: list, r: int):
    def check(nid, p):
        for j in active:
            m.check_finite_message(ex.label(nid), f"{j['method']} (seed {j['seed']})",
                                   p.group(f"msg/{j['id']}/r{r}"),
                                   lib.head_message_keys(j["method"]))
    return check


def _aggregate(plan: _Plan, C: int, good: dict, order: list, j: dict, r: int):
    """(head, next broadcast or None) of job j after round r, from the clients' messages."""
    msgs = [{k: _scalar(v) for k, v in good[n].group(f"msg/{j['id']}/r{r}").items()}
            for n in order]
    try:
        return lib.head_server_aggregate(j["method"], plan.params.get(j["method"]), msgs, C,
                                         j["seed"], r, plan.rounds[j["method"]])
    except (ValueError, FloatingPointError, np.linalg.LinAlgError) as e:
        raise lib.FedalignError(f"{j['method']} (seed {j['seed']}): the clients' messages "
                                f"do not give a head ({e})") from None


# --------------------------------------------------------------------------------------------
# 3. Evaluation and the report
# --------------------------------------------------------------------------------------------


def _evaluate(ex: Exchange, plan: _Plan, clients: dict, order: list, jobs: list, built: dict,
              steps: dict):
    """``evaluate.heads`` → ({domain: (client, reply config)}, [MethodResult] per head)."""
    arrays = {f"head/{j['id']}": {"W": built[j["id"]].W, "b": built[j["id"]].b} for j in jobs}
    replies = ex.ask({n: (m.EVALUATE, Payload(arrays, {})) for n in order}, "evaluate")
    good = ex.keep(replies, "evaluation")
    domains = {}
    for n in order:
        if n in good and good[n].config.get("domain"):
            dom = good[n].config["domain"]
            if dom in domains:
                raise lib.FedalignError(f"two nodes ({domains[dom][0]} and {clients[n]}) hold the "
                                        f"test split of domain {dom!r}")
            domains[dom] = (clients[n], good[n].config)
    if not domains:
        raise lib.FedalignError("no node holds a test split (node config test='…')")
    results = []
    seeds = plan.seeds
    for h in plan.methods:
        per_seed = [{dom: float(cfg["accuracy"][f"{h}/s{seed}"]) for dom, (_, cfg) in domains.items()}
                    for seed in seeds]
        cfg = lib.head_config(h, plan.params.get(h))[1]
        privacy = _privacy(clients, order, steps, built[f"{h}/s{seeds[-1]}"])
        results.append(lib.MethodResult(h, [int(x) for x in seeds], per_seed,
                                        lib.config_record(cfg), privacy=privacy))
    return domains, results


def _privacy(clients: dict, order: list, steps: dict, head) -> list:
    """Each client's privacy over one run, as ``fedalign evaluate`` reports it
    (:func:`fedalign.evaluate.privacy_of`): its statistics' release record (the ``align`` step
    its node named) composed with its head message (the head's DP record, that of the last
    seed, as the file pipeline's). Empty when nothing is a DP release."""
    sites = [SimpleNamespace(name=clients[n],
                             provenance={"history": [steps[n]] if steps.get(n) else []})
             for n in order]
    return lib.privacy_of(sites, getattr(head, "info", {}).get("dp"))


def _report(ex: Exchange, s: Settings, plan: _Plan, cl: _Clients, order: list, domains: dict,
            results: list, sha: str, timing: dict) -> dict:
    """The content of OUT/slot.json."""
    clients, stats_of = cl.names, dict(zip(cl.order, cl.stats))
    return dict(
        producer="fedalign flower",
        protocol=("SLOT-Align across sites: stats → barycenter → each client aligns its own "
                  "files at τ → one global head per method and seed from the clients' "
                  "aggregates; accuracy per test domain reported by its node"),
        class_names=list(cl.class_names), seeds=[int(x) for x in plan.seeds],
        domains=list(domains), alignment=dict(tau=float(s.tau), reference_sha256=sha),
        clients=[dict(name=clients[n], node=str(n), n=int(stats_of[n].n),
                      domain=next((dm for dm, (c, _) in domains.items() if c == clients[n]), None))
                 for n in order],
        methods={r.method: r.to_json() for r in results},
        communication=_comm_report(ex, cl.C, cl.d, s.fedavg_rounds),
        dropped=lost_clients(ex), exchanges=list(ex.exchanges),
        warnings=list(ex.warnings), timing_s=timing, settings=dataclasses.asdict(s),
    )


def _arrays(d: dict) -> dict:
    return {k: np.asarray(v) for k, v in d.items()}


def _scalar(v):
    v = np.asarray(v)
    return v[()] if v.ndim == 0 else v


def _accuracy_lines(results, domains) -> str:
    lines = ["accuracy (%), mean ± std over seeds:",
             "  " + "  ".join(f"{x:>14}" for x in ["method"] + domains + ["macro"])]
    for r in results:
        s = r.summary()
        cells = [f"{100 * s[dm]['mean']:.1f} ± {100 * s[dm]['std']:.1f}" for dm in domains + ["macro"]]
        lines.append("  " + "  ".join(f"{x:>14}" for x in [r.method] + cells))
    return "\n".join(lines)


def fedavg_bytes(C: int, d: int) -> dict:
    """Bytes one client sends and receives per round of FedAvg of a linear head (C × d + C
    float32, as Flower's FedAvg ships a model: ``ArrayRecord`` down; ``ArrayRecord`` plus a
    ``MetricRecord`` with ``num-examples`` up), counted like every other message."""
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

    model = {"W": Array(np.zeros((C, d), np.float32)), "b": Array(np.zeros(C, np.float32))}
    down = RecordDict({"arrays": ArrayRecord(model)})
    up = RecordDict({"arrays": ArrayRecord(model), "metrics": MetricRecord({"num-examples": 1})})
    return {"sent": m.payload_bytes(down), "received": m.payload_bytes(up)}


def _comm_report(ex: Exchange, C, d, fedavg_rounds) -> dict:
    per_round = fedavg_bytes(C, d) if C and d else None
    out = {"counted": "bytes of each message's records as Flower's message_size_mod counts them "
                      "(array bytes + keys); 'sent' = server → client, 'received' = client → server",
           "per_client": ex.comm}
    if per_round is not None:
        out["fedavg_linear_head"] = dict(per_round=per_round, rounds=int(fedavg_rounds),
                                         total={k: v * int(fedavg_rounds) for k, v in per_round.items()},
                                         shape=[int(C), int(d)])
    return out

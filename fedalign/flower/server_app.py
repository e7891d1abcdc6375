"""The ServerApp: SLOT-Align and DeFed-GMM-DaDiL over Flower's Grid.

``app`` is the ``flwr.serverapp.ServerApp`` named in ``examples/flower/pyproject.toml``; its
``main(grid, context)`` reads the run config (:class:`Settings`) and runs :func:`run_slot` or
:func:`run_defed`. Both talk to the nodes only through :class:`Exchange` (push messages, poll
the replies, check them, count their bytes), so they run the same on the deployment engine
and on an in-process grid (the tests).

SLOT-Align (one shot; three exchanges):

1. ``query.stats`` → each client: n, mean, Ledoit–Wolf covariance (d × d float64); the
   server: Bures–Wasserstein barycenter (:func:`fedalign.align.make_reference`), written as
   ``OUT/ref.npz``;
2. ``train.heads`` → each client maps its own train and test files to the reference at τ
   (the reference travels in this message), then sends one aggregate per head and seed
   (FedCGS/Fed3R sums, FedPFT GMMs, O-FedAvg's head trained from the server's common start;
   a head with R rounds takes R exchanges); the server builds every global head;
3. ``evaluate.heads`` → each client with a test split: accuracy of every head on its domain;
   ``OUT/slot.json`` (the ``fedalign evaluate`` report format plus the communication record).

DeFed-GMM-DaDiL (relayed gossip): ``query.hello`` (rounds of the nodes' states), then
``train.dadil_init`` (fresh states, round-0 atoms) or ``query.dadil_atoms`` (a restarted
server: the nodes' published atoms, from their own files), then for t = 1…R one
``train.dadil_round``: each client gets the atoms (round t−1) of the peers *it* named in its
previous reply — drawn with its own seeded generator, as in the file pipeline — runs the round
on its own state, publishes its atoms and names its peers for round t + 1. The server is a
mailbox: it holds the latest atoms of every client and never sees α, a GMM or a state. It
does see the atoms (so does the SuperLink that relays them). After its last round the target
scores its DeFed classifier on its held-out split (``dadil-evaluate``'s rows) →
``OUT/defed-FEDERATION.json``.

Faults: a node that does not answer within ``timeout`` or whose reply is refused (error,
wrong shape, NaN/Inf, non-SPD covariance) is dropped with one warning naming it; the run goes
on while at least ``min-clients`` remain, else it stops with those messages. In gossip a
dropped peer is skipped: clients that had named it draw again from the clients that did
publish. A server restarted between rounds resumes from the nodes' states; a node that was
lost and comes back (its state some rounds behind) catches up: it runs the rounds it missed,
each with the atoms its peers published in that round (their own files, ``query.dadil_atoms``),
as a late ``fedalign dadil-round`` on the round folders would. Both reports record every
exchange (``exchanges``: seconds, bytes both ways, nodes that answered) and every client lost
(``dropped``: where, why, and the exchanges it missed).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedalign.defaults import TAU
from fedalign.flower import _lib as lib
from fedalign.flower import handlers
from fedalign.flower import messages as m
from fedalign.flower.messages import NodeReplyError, Payload, node_label

#: Heads the relayed run refuses: ``centralized`` would send the raw features.
REFUSED_HEADS = {"centralized": "the pooled-data reference sends raw features and labels"}


@dataclass
class Settings:
    """The run config (``[tool.flwr.app.config]``, ``flwr run --run-config``); keys are these
    names with ``-`` for ``_``."""

    method: str = "slot"             # slot | defed
    out: str = ""                    # the server's output folder (absolute path)
    min_clients: int = 2             # go on while at least this many clients remain
    clients: int = 0                 # wait for this many nodes (0: min-clients)
    wait: float = 120.0              # seconds to wait for them
    timeout: float = 600.0           # seconds per exchange before a node counts as dropped
    poll: float = 0.2                # seconds between polls for replies
    # SLOT-Align
    tau: float = TAU                 # fedalign.defaults.TAU (the command line's --tau)
    heads: str = "fedcgs,fedpft,fed3r,ofedavg"
    seeds: str = "0"
    params: str = ""                 # METHOD.KEY=VALUE … (as fedalign evaluate --param)
    weights: str = "samples"
    tol: float = 1e-10
    max_iter: int = 100
    shrinkage: str = "auto"
    fedavg_rounds: int = 100         # rounds of the FedAvg comparison in the communication record
    # DeFed-GMM-DaDiL
    strategy: str = "aggregation"
    federation: str = ""             # name of the federation (node folder); default: strategy
    rounds: int = 4                  # rounds done when the run ends (resumes count on)
    local_steps: int = 5
    n_atoms: int = 3
    n_components: int = 0            # components per atom (0: the GMM's)
    dadil_seed: int = 0
    preset: str = "fedalign"
    fresh: bool = False              # start over even where states exist
    eval_seeds: str = "0"

    @classmethod
    def from_run_config(cls, cfg) -> "Settings":
        from fedalign.grammar import parse_bool

        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw = {}
        for key, value in dict(cfg or {}).items():
            name = str(key).replace("-", "_")
            if name not in fields:
                raise lib.FedalignError(f"unknown run config key {key!r} (keys: "
                                        f"{', '.join(k.replace('_', '-') for k in fields)})")
            default = fields[name].default
            try:
                if isinstance(default, bool):  # the command line's one rule: no other word
                    kw[name] = parse_bool(value, f"run config {key}")
                else:
                    kw[name] = type(default)(value)
            except (TypeError, ValueError):
                raise lib.FedalignError(f"run config {key}: cannot read {value!r} as "
                                        f"{type(default).__name__}") from None
        s = cls(**kw)
        if s.method not in ("slot", "defed"):
            raise lib.FedalignError(f"run config method must be slot or defed, got {s.method!r}")
        if not s.out:
            raise lib.FedalignError("run config out='FOLDER' (the server's output folder) is not set")
        if s.min_clients < 1:
            raise lib.FedalignError(f"min-clients must be ≥ 1, got {s.min_clients}")
        return s

    @property
    def federation_name(self) -> str:
        return self.federation or self.strategy

    @staticmethod
    def seed_list(text: str, key: str = "seeds") -> list:
        """The run config's seeds: integers separated by commas or spaces, ``a-b`` for a range
        (``"0-2"``, ``"0, 3"``): the command line's grammar (:func:`fedalign.grammar.parse_seeds`),
        checked by :func:`fedalign.evaluate.check_seeds`."""
        from fedalign.evaluate import check_seeds
        from fedalign.grammar import parse_seeds

        return check_seeds(parse_seeds([text], flag=f"run config {key}"))

    def head_params(self, methods) -> dict:
        """The run config's ``params``: space-separated ``METHOD.KEY=VALUE`` (values stay text,
        as the heads read them; :func:`fedalign.grammar.parse_params`) → checked by
        :func:`fedalign.evaluate.check_params`."""
        from fedalign.evaluate import check_params
        from fedalign.grammar import parse_params

        return check_params(parse_params(str(self.params).split(), flag="run config params"),
                            methods)


# --------------------------------------------------------------------------------------------
# Exchanges with the nodes: push, poll, check, count bytes
# --------------------------------------------------------------------------------------------


class Exchange:
    """The server's side of the messages: one :meth:`ask` per exchange.

    ``comm[client][stage] = {"sent": bytes, "received": bytes, "messages": n}``: bytes of each
    message's records (:func:`~fedalign.flower.messages.payload_bytes`) attributed per record:
    a record named ``KIND/STAGE/…`` counts for STAGE (a head), any other for the exchange's
    stage.
    """

    def __init__(self, grid, settings: Settings, say=print):
        self.grid, self.s, self.say = grid, settings, say
        self.names: dict = {}
        self.comm: dict = {}
        self.warnings: list = []
        #: one entry per :meth:`ask`: stage, label, nodes asked, answers, seconds, bytes
        self.exchanges: list = []
        #: {client: {"node", "lost_at", "reason"}} of the clients dropped during the run
        self.dropped: dict = {}
        self._label, self._received = "", 0

    def label(self, nid) -> str:
        return node_label(nid, self.names.get(nid))

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.say(f"WARNING: {text}")

    def wait_for_nodes(self) -> list:
        want = max(self.s.clients, self.s.min_clients)
        t_end = time.monotonic() + self.s.wait
        while True:
            nodes = sorted(int(n) for n in self.grid.get_node_ids())
            if len(nodes) >= want or time.monotonic() > t_end:
                break
            time.sleep(min(1.0, self.s.poll * 5))
        if len(nodes) < self.s.min_clients:
            raise lib.FedalignError(f"{len(nodes)} node(s) connected within {self.s.wait:g} s, "
                                    f"fewer than min-clients={self.s.min_clients}")
        if len(nodes) < want:
            self.warn(f"{len(nodes)} of the {want} expected nodes connected within "
                      f"{self.s.wait:g} s; going on with them")
        return nodes

    def _count(self, nid, rd, stage: str, direction: str) -> None:
        client = self.names.get(nid, str(nid))
        book = self.comm.setdefault(client, {})
        for name, rec in rd.items():
            parts = name.split("/")
            st = parts[1] if len(parts) >= 3 else stage
            e = book.setdefault(st, {"sent": 0, "received": 0, "messages": 0})
            e[direction] += int(rec.count_bytes())
        book.setdefault(stage, {"sent": 0, "received": 0, "messages": 0})["messages"] += \
            1 if direction == "sent" else 0

    def ask(self, requests: dict, stage: str, label: str = "") -> dict:
        """Send {node id: (message type, Payload)}; return {node id: Payload | NodeReplyError}.

        A node that does not answer within ``timeout``, whose ClientApp failed or that
        reported an error gets a :class:`NodeReplyError`. The exchange's wall time and bytes
        (both ways; every byte passes through the SuperLink) go to :attr:`exchanges`.
        """
        from flwr.app import Message

        t0 = time.perf_counter()
        self._label, self._received = label or stage, 0
        msgs, by_id = [], {}
        sent = 0
        for nid, (mtype, payload) in requests.items():
            rd = m.to_recorddict(payload)
            sent += m.payload_bytes(rd)
            self._count(nid, rd, stage, "sent")
            msgs.append(Message(rd, dst_node_id=int(nid), message_type=mtype, group_id=stage,
                                ttl=max(self.s.timeout + 60.0, 120.0)))
        ids = list(self.grid.push_messages(msgs))
        pending = {i for i in ids if i}
        for i, msg in zip(ids, msgs):
            by_id[i] = msg.metadata.dst_node_id
        out = {}
        t_end = time.monotonic() + self.s.timeout
        while pending and time.monotonic() < t_end:
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                pending.discard(mid)
                nid = by_id.get(mid, reply.metadata.src_node_id)
                out[nid] = self._read(nid, reply, stage, requests[nid][0])
            if pending:
                time.sleep(self.s.poll)
        for nid in requests:
            if nid not in out:
                out[nid] = NodeReplyError(self.label(nid), f"no reply to {requests[nid][0]} "
                                                           f"within {self.s.timeout:g} s (dropped out)")
        self.exchanges.append(dict(stage=stage, label=self._label, nodes=len(requests),
                                   answered=sum(not isinstance(r, NodeReplyError)
                                                for r in out.values()),
                                   seconds=time.perf_counter() - t0, sent=int(sent),
                                   received=int(self._received)))
        return out

    def _read(self, nid, reply, stage, mtype):
        if reply.has_error():
            reason = " ".join(str(reply.error.reason).split())[-300:]
            return NodeReplyError(self.label(nid), f"the ClientApp failed on {mtype}: {reason}")
        self._count(nid, reply.content, stage, "received")
        self._received += m.payload_bytes(reply.content)
        try:
            p = m.from_recorddict(reply.content)
        except Exception as e:  # an unreadable reply
            return NodeReplyError(self.label(nid), f"unreadable reply to {mtype}: {e}")
        if p.config.get("error"):
            return NodeReplyError(self.label(nid), f"error: {p.config['error']}")
        client = p.config.get("client")
        if client and nid not in self.names:
            self.names[nid] = str(client)
            # bytes counted under the node id before its name was known
            if str(nid) in self.comm:
                for st, e in self.comm.pop(str(nid)).items():
                    tgt = self.comm.setdefault(str(client), {}).setdefault(
                        st, {"sent": 0, "received": 0, "messages": 0})
                    for k in tgt:
                        tgt[k] += e[k]
        elif client and self.names.get(nid) != client:
            return NodeReplyError(self.label(nid), f"answered as {client!r}")
        return p

    def keep(self, replies: dict, what: str, check=None) -> dict:
        """The replies that pass ``check(nid, payload)`` (which may raise NodeReplyError);
        the others are dropped with a warning."""
        good = {}
        for nid, r in sorted(replies.items()):
            if not isinstance(r, NodeReplyError) and check is not None:
                try:
                    r = check(nid, r) or r
                except NodeReplyError as e:
                    r = e
            if isinstance(r, NodeReplyError):
                self.warn(f"{r} — dropped from the {what}")
                client = self.names.get(nid, str(nid))
                self.dropped.setdefault(client, dict(node=str(nid), lost_at=self._label,
                                                     reason=str(r)))
                continue
            good[nid] = r
        return good

    def require(self, good: dict, what: str) -> None:
        if len(good) < self.s.min_clients:
            lost = [w for w in self.warnings if "dropped" in w]
            raise lib.FedalignError(f"{what}: {len(good)} client(s) left, fewer than "
                                    f"min-clients={self.s.min_clients}"
                                    + ("; " + "; ".join(lost[-5:]) if lost else ""))


# --------------------------------------------------------------------------------------------
# SLOT-Align
# --------------------------------------------------------------------------------------------


def _majority(values):
    vals = list(values)
    return max(sorted(set(vals), key=str), key=vals.count) if vals else None


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


def run_slot(ex: Exchange, s: Settings, out: Path) -> dict:
    """SLOT-Align and the chosen heads over the nodes; writes OUT/ref.npz and OUT/slot.json."""
    from fedalign.dp import config_record
    from fedalign.results import MethodResult

    t0 = time.perf_counter()
    timing = {}
    methods = [h.strip() for h in s.heads.split(",") if h.strip()]
    for h in methods:
        if h in REFUSED_HEADS:
            raise lib.FedalignError(f"head {h} is not available across sites: {REFUSED_HEADS[h]}")
    params = s.head_params(methods)
    rounds = {h: lib.head_rounds(h, params.get(h)) for h in methods}  # validates names/options
    seeds = Settings.seed_list(s.seeds)
    lib.check_tau(s.tau)

    nodes = ex.wait_for_nodes()
    ex.say(f"SLOT-Align: {len(nodes)} nodes; stats query")
    replies = ex.ask({n: (m.STATS, Payload({}, dict(shrinkage=s.shrinkage))) for n in nodes},
                     "slot-align", "stats")
    ok = {n: r for n, r in replies.items() if not isinstance(r, NodeReplyError)}
    d = _majority(int(r.config.get("d", -1)) for r in ok.values())
    names = _majority(tuple(r.config.get("class_names") or []) for r in ok.values())
    good = ex.keep(replies, "federation", _check_stats(ex, d, list(names or ())))
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
    stats = [lib.GaussianStats(int(good[n].config["n"]), np.asarray(good[n].group("stats")["mean"], float),
                               np.asarray(good[n].group("stats")["covariance"], float),
                               float(good[n].config.get("shrinkage", 0.0)), None, list(names or ()))
             for n in order]
    timing["stats"] = time.perf_counter() - t0
    ref = lib.make_reference(stats, s.weights, tol=s.tol, max_iter=s.max_iter)
    ref_path = out / "ref.npz"
    lib.save_reference(ref_path, ref, dict(producer="fedalign flower (ServerApp)",
                                           clients=[clients[n] for n in order]))
    sha = lib.sha256_file(ref_path)
    conv = ref.meta["convergence"]
    ex.say(f"barycenter of {len(order)} clients (d={d}): {conv['iterations']} iterations, "
           f"residual {conv['residual']:.2e} → {ref_path}")
    timing["barycenter"] = time.perf_counter() - t0 - timing["stats"]

    # ---------------------------------------------------------------- heads
    t1 = time.perf_counter()
    jobs = [dict(id=f"{h}/s{seed}", method=h, seed=int(seed)) for h in methods for seed in seeds]
    init = {j["id"]: lib.head_server_init(j["method"], params.get(j["method"]), d, C, j["seed"])
            for j in jobs}
    built, steps = {}, {}
    for r in range(max(rounds.values()) if rounds else 0):
        active = [j for j in jobs if rounds[j["method"]] > r]
        reqs = {}
        for k, nid in enumerate(order):
            arrays = {f"init/{j['id']}/r{r}": _arrays(init[j["id"]]) for j in active
                      if init[j["id"]] is not None}
            cfg = dict(n_classes=C, jobs=[dict(id=f"{j['id']}/r{r}", method=j["method"],
                                               params=params.get(j["method"]), seed=j["seed"],
                                               k=k, round=r) for j in active])
            if r == 0:  # the reference travels with the first heads message: align, then train
                arrays[handlers.REFERENCE] = {"mean": ref.mean, "covariance": ref.covariance}
                cfg.update(tau=s.tau, reference_sha256=sha)
            reqs[nid] = (m.HEADS, Payload(arrays, cfg))
        replies = ex.ask(reqs, "head-jobs", f"heads round {r}")

        def check(nid, p, active=active, r=r):
            for j in active:
                m.check_finite_message(ex.label(nid), f"{j['method']} (seed {j['seed']})",
                                       p.group(f"msg/{j['id']}/r{r}"),
                                       lib.head_message_keys(j["method"]))
        good = ex.keep(replies, "federation", check)
        order = [n for n in order if n in good]
        ex.require(good, f"heads round {r}" + (" (with the alignment)" if r == 0 else ""))
        for n in order:
            if r == 0:
                steps[n] = good[n].config.get("align_step")
        for j in active:
            msgs = [{k: _scalar(v) for k, v in good[n].group(f"msg/{j['id']}/r{r}").items()}
                    for n in order]
            try:
                head, nxt = lib.head_server_aggregate(j["method"], params.get(j["method"]), msgs, C,
                                                      j["seed"], r, rounds[j["method"]])
            except (ValueError, FloatingPointError, np.linalg.LinAlgError) as e:
                raise lib.FedalignError(f"{j['method']} (seed {j['seed']}): the clients' messages "
                                        f"do not give a head ({e})") from None
            built[j["id"]] = head
            init[j["id"]] = nxt
    timing["heads"] = time.perf_counter() - t1

    # ---------------------------------------------------------------- evaluation
    t1 = time.perf_counter()
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
    for h in methods:
        per_seed = [{dom: float(cfg["accuracy"][f"{h}/s{seed}"]) for dom, (_, cfg) in domains.items()}
                    for seed in seeds]
        cfg = lib.head_config(h, params.get(h))[1]
        privacy = _privacy(clients, order, steps, built[f"{h}/s{seeds[-1]}"])
        results.append(MethodResult(h, [int(x) for x in seeds], per_seed, config_record(cfg),
                                    privacy=privacy))
    timing["evaluate"] = time.perf_counter() - t1
    timing["total"] = time.perf_counter() - t0

    report = dict(
        producer="fedalign flower",
        protocol=("SLOT-Align across sites: stats → barycenter → each client aligns its own "
                  "files at τ → one global head per method and seed from the clients' "
                  "aggregates; accuracy per test domain reported by its node"),
        class_names=list(names or ()), seeds=[int(x) for x in seeds], domains=list(domains),
        alignment=dict(tau=float(s.tau), reference_sha256=sha),
        clients=[dict(name=clients[n], node=str(n), n=int(_find_n(stats, order, n)),
                      domain=next((dm for dm, (c, _) in domains.items() if c == clients[n]), None))
                 for n in order],
        methods={r.method: r.to_json() for r in results},
        communication=_comm_report(ex, methods, C, d, s.fedavg_rounds),
        dropped=_dropped(ex), exchanges=list(ex.exchanges),
        warnings=list(ex.warnings), timing_s=timing, settings=dataclasses.asdict(s),
    )
    _write_json(out / "slot.json", report)
    ex.say(_accuracy_lines(results, list(domains)))
    from fedalign.evaluate import privacy_lines

    for r in results:
        for line in privacy_lines(r):
            ex.say(line)
    return report


def _privacy(clients: dict, order: list, steps: dict, head) -> list:
    """Each client's privacy over one run, as ``fedalign evaluate`` reports it
    (:func:`fedalign.evaluate.privacy_of`): its statistics' release record (the ``align`` step
    its node named) composed with its head message (the head's DP record, that of the last
    seed, as the file pipeline's). Empty when nothing is a DP release."""
    from types import SimpleNamespace

    from fedalign.evaluate import privacy_of

    sites = [SimpleNamespace(name=clients[n],
                             provenance={"history": [steps[n]] if steps.get(n) else []})
             for n in order]
    return privacy_of(sites, getattr(head, "info", {}).get("dp"))


def _dropped(ex: Exchange) -> list:
    """The clients lost during the run: where, why, and the exchanges they missed (the one
    they were lost in and every later one)."""
    labels = [e["label"] for e in ex.exchanges]
    out = []
    for client, e in sorted(ex.dropped.items()):
        i = labels.index(e["lost_at"]) if e["lost_at"] in labels else len(labels)
        missed = list(dict.fromkeys(labels[i:]))
        out.append(dict(client=client, node=e["node"], lost_at=e["lost_at"], reason=e["reason"],
                        missed=missed))
    return out


def _find_n(stats, order, nid):
    return stats[order.index(nid)].n if nid in order else 0


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


def _comm_report(ex: Exchange, methods, C, d, fedavg_rounds) -> dict:
    per_round = fedavg_bytes(C, d) if C and d else None
    out = {"counted": "bytes of each message's records as Flower's message_size_mod counts them "
                      "(array bytes + keys); 'sent' = server → client, 'received' = client → server",
           "per_client": ex.comm}
    if per_round is not None:
        out["fedavg_linear_head"] = dict(per_round=per_round, rounds=int(fedavg_rounds),
                                         total={k: v * int(fedavg_rounds) for k, v in per_round.items()},
                                         shape=[int(C), int(d)])
    return out


def _write_json(path: Path, obj) -> None:
    from fedalign.files import write_report
    from fedalign.results import json_safe

    write_report(path, json_safe(obj))


# --------------------------------------------------------------------------------------------
# DeFed-GMM-DaDiL
# --------------------------------------------------------------------------------------------


def _check_atoms(ex: Exchange, shape: list, t: int):
    A, K, d, C = shape

    def check(nid, p: Payload):
        lab = ex.label(nid)
        a = m.check_arrays(lab, f"round {t} atoms", p.group("atoms"),
                           {"means": (A, K, d), "variances": (A, K, d), "label_logits": (A, K, C)})
        if np.any(a["variances"] <= 0):
            raise NodeReplyError(lab, f"round {t} atoms: variances must be > 0")
        if int(p.config.get("round", -1)) != t:
            raise NodeReplyError(lab, f"sent atoms of round {p.config.get('round')}, expected {t}")
        return None
    return check


def run_defed(ex: Exchange, s: Settings, out: Path) -> dict:
    """DeFed-GMM-DaDiL gossip relayed through the server; writes OUT/defed-FEDERATION.json."""
    t0 = time.perf_counter()
    fed = s.federation_name
    lib.check_client_id(fed)
    if s.strategy not in lib.STRATEGIES:
        raise lib.FedalignError(f"strategy must be one of {', '.join(lib.STRATEGIES)}, got {s.strategy!r}")
    eval_seeds = Settings.seed_list(s.eval_seeds, "eval-seeds")
    nodes = ex.wait_for_nodes()
    base = dict(federation=fed, strategy=s.strategy)
    def has_gmm(nid, p):
        if not p.config.get("has_gmm"):
            raise NodeReplyError(ex.label(nid), "has no gmm='…' in its node config")

    hello = ex.keep(ex.ask({n: (m.HELLO, Payload({}, dict(base))) for n in nodes}, "defed",
                           "hello"),
                    "federation", has_gmm)
    names = {n: p.config["client"] for n, p in hello.items()}
    if len(set(names.values())) < len(names):
        raise lib.FedalignError("two nodes answered with the same client name")
    ex.require(hello, "DeFed hello")
    alive = sorted(hello, key=lambda n: names[n])
    state_round = {n: int(hello[n].config.get("round", -1)) for n in alive}
    everyone = [names[n] for n in alive]
    mailbox: dict = {}
    peers_next: dict = {}
    drawn_from: dict = {}
    shape = None
    resumed = False

    if s.fresh or all(r < 0 for r in state_round.values()):
        init = dict(n_atoms=s.n_atoms, seed=s.dadil_seed, preset=s.preset,
                    n_components=s.n_components or None)
        reqs = {n: (m.DADIL_INIT, Payload({}, dict(base, init=init, force=bool(s.fresh),
                                                   next_candidates=everyone))) for n in alive}
        replies = ex.ask(reqs, "defed", "round 0")
        ok = [r for r in replies.values() if not isinstance(r, NodeReplyError)]
        shape = _majority(tuple(r.config.get("shape") or ()) for r in ok)
        good = ex.keep(replies, "federation", _check_atoms(ex, list(shape or (0, 0, 0, 0)), 0))
        start = 0
        for n in alive:
            state_round[n] = 0
    else:
        missing = [names[n] for n in alive if state_round[n] < 0]
        if missing:
            raise lib.FedalignError(f"clients {', '.join(missing)} have no state of federation "
                                    f"{fed!r} while the others do: run with fresh=true to start over")
        start = min(state_round.values())
        behind = [names[n] for n in alive if state_round[n] < max(state_round.values())]
        if max(state_round.values()) - start > 1:  # a node that was lost, back again
            verb = "catches" if len(behind) == 1 else "catch"
            ex.say(f"DeFed {fed}: {', '.join(behind)} {verb} up from round "
                   f"{start} on, with the atoms the others published in those rounds")
        resumed = True
        shape = _majority(tuple(hello[n].config.get("shape") or ()) for n in alive)
        reqs = {n: (m.DADIL_ATOMS, Payload({}, dict(base, round=start, next_candidates=everyone)))
                for n in alive}
        good = ex.keep(ex.ask(reqs, "defed", f"atoms of round {start}"), "federation",
                       _check_atoms(ex, list(shape), start))
        ex.say(f"DeFed {fed}: resuming at round {start} from the nodes' states")
    shape = list(shape)
    alive = [n for n in alive if n in good]
    ex.require(good, "DeFed start")
    mailbox[start] = {names[n]: good[n].group("atoms") for n in alive}
    for n in alive:
        if state_round[n] == start:
            peers_next[n] = list(good[n].config.get("peers_next") or [])
            drawn_from[n] = set(everyone)
    history = []
    evaluation = dict(row=s.strategy, seeds=[int(x) for x in eval_seeds])
    results = None
    for t in range(start + 1, int(s.rounds) + 1):
        publishers = sorted(mailbox[t - 1])
        todo = [n for n in alive if state_round[n] == t - 1]
        ahead = [n for n in alive if state_round[n] >= t]
        # a client whose peers were drawn from another pool than the clients that published
        redraw = [n for n in todo if drawn_from.get(n) != set(publishers)]
        if redraw:
            rp = ex.ask({n: (m.DADIL_PEERS, Payload({}, dict(base, next_candidates=publishers)))
                         for n in redraw}, "defed", f"redraw before round {t}")
            rp = ex.keep(rp, "federation")
            for n in redraw:
                if n in rp:
                    peers_next[n] = list(rp[n].config.get("peers_next") or [])
                    drawn_from[n] = set(publishers)
            todo = [n for n in todo if n not in redraw or n in rp]
            alive = [n for n in alive if n not in redraw or n in rp]
        nxt = sorted(names[n] for n in alive)
        last = t == int(s.rounds)
        reqs = {}
        for n in todo:
            fwd = {f"peer/{p}": mailbox[t - 1][p] for p in peers_next[n]}
            cfg = dict(base, round=t, local_steps=s.local_steps, candidates=publishers,
                       next_candidates=None if last else nxt)
            if last:  # the target evaluates right after its last round (no extra exchange)
                cfg["evaluate"] = evaluation
            reqs[n] = (m.DADIL_ROUND, Payload(fwd, cfg))
        for n in ahead:  # a server restarted mid-round: these did round t already
            reqs[n] = (m.DADIL_ATOMS, Payload({}, dict(base, round=t, next_candidates=nxt)))
        replies = ex.ask(reqs, "defed", f"round {t}")
        good = ex.keep(replies, "federation", _check_atoms(ex, shape, t))
        alive = [n for n in alive if n in good]
        ex.require(good, f"DeFed round {t}")
        mailbox[t] = {names[n]: good[n].group("atoms") for n in alive}
        for n in alive:
            state_round[n] = max(state_round[n], t)  # ahead: done already
            peers_next[n] = list(good[n].config.get("peers_next") or [])
            drawn_from[n] = set(nxt)
        history.append({names[n]: dict(peers=good[n].config.get("peers"),
                                       loss_first=good[n].config.get("loss_first"),
                                       loss_last=good[n].config.get("loss_last")) for n in alive})
        mailbox.pop(t - 1, None)
        if last:
            results = {names[n]: good[n].config.get("result") for n in alive}
            for n in alive:
                if good[n].config.get("result_error"):
                    ex.warn(f"node {ex.label(n)}: the evaluation failed: "
                            f"{good[n].config['result_error']}")
        ex.say(f"DeFed {fed} round {t}: " + "; ".join(
            f"{names[n]} ← {', '.join(good[n].config.get('peers') or []) or '—'}" for n in alive))
    t_rounds = time.perf_counter() - t0

    if results is None:  # no round left to run (or nodes that were ahead): evaluate alone
        replies = ex.ask({n: (m.DADIL_EVALUATE, Payload({}, dict(base, **evaluation)))
                          for n in alive}, "defed", "evaluate")
        good = ex.keep(replies, "evaluation")
        results = {names[n]: good[n].config.get("result") for n in alive if n in good}
    targets = {c: r for c, r in results.items() if r}
    report = dict(producer="fedalign flower", method="DeFed-GMM-DaDiL (relayed gossip)",
                  federation=fed, strategy=s.strategy, rounds=int(s.rounds), resumed=resumed,
                  started_at_round=int(start), clients=[names[n] for n in alive],
                  atoms_shape=shape, rounds_record=history,
                  communication={"counted": "bytes of each message's records (array bytes + "
                                            "keys); 'sent' = server → client",
                                 "per_client": ex.comm},
                  dropped=_dropped(ex), exchanges=list(ex.exchanges),
                  warnings=list(ex.warnings),
                  timing_s=dict(rounds=t_rounds, total=time.perf_counter() - t0),
                  settings=dataclasses.asdict(s), targets=targets)
    if len(targets) == 1:  # the layout of a dadil-evaluate report (fedalign report reads it)
        report.update(next(iter(targets.values())))
    _write_json(out / f"defed-{fed}.json", report)
    for c, res in targets.items():
        ex.say(f"DeFed {fed}: target {c}: " + ", ".join(
            f"{k} {100 * v['mean']:.1f} ± {100 * v['std']:.1f}" for k, v in res["summary"].items()))
    return report


# --------------------------------------------------------------------------------------------
# The ServerApp
# --------------------------------------------------------------------------------------------


def run(grid, run_config, say=print) -> dict:
    """Run the configured method over ``grid`` (any ``flwr.serverapp.Grid``)."""
    s = Settings.from_run_config(run_config)
    out = Path(s.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    ex = Exchange(grid, s, say)
    return run_slot(ex, s, out) if s.method == "slot" else run_defed(ex, s, out)


def _make_app():
    from logging import INFO, WARNING

    from flwr.common.logger import log
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        def say(text):
            for line in str(text).splitlines():
                log(WARNING if line.startswith("WARNING") else INFO, "%s", line)

        try:
            run(grid, context.run_config, say)
        except lib.FedalignError as e:  # bad input: one line, then the run is marked failed
            log(40, "error: %s", " ".join(str(e).split()))
            raise lib.FedalignError(" ".join(str(e).split())) from None

    return app


app = _make_app()

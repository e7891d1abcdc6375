"""The server's DeFed-GMM-DaDiL run (relayed gossip), :func:`run_defed`.

``query.hello`` (rounds of the nodes' states), then ``train.dadil_init`` (fresh states,
round-0 atoms) or ``query.dadil_atoms`` (a restarted server: the nodes' published atoms, from
their own files), then for t = 1…R one ``train.dadil_round``: each client gets the atoms
(round t−1) of the peers *it* named in its previous reply — drawn with its own seeded
generator, as in the file pipeline — runs the round on its own state, publishes its atoms and
names its peers for round t + 1. The server is a mailbox: it holds the latest atoms of every
client and never sees α, a GMM or a state. It does see the atoms (so does the SuperLink that
relays them). After its last round the target scores its DeFed classifier on its held-out
split (``dadil-evaluate``'s rows) → ``OUT/defed-FEDERATION.json``.

With ``premap='target'`` a fresh start first maps every source onto the target's completed
Gaussian and fits every node's GMM, in three exchanges (:mod:`fedalign.flower.premap`); the
rounds then run on those GMMs (``premap`` travels in every message) instead of ``gmm=``.

Faults (besides those of :mod:`fedalign.flower.exchange`): a dropped peer is skipped — clients
that had named it draw again (``query.dadil_peers``) from the clients that did publish. A
server restarted between rounds resumes from the nodes' states; a node that was lost and comes
back (its state some rounds behind) catches up: it runs the rounds it missed, each with the
atoms its peers published in that round (their own files, ``query.dadil_atoms``), as a late
``fedalign dadil-round`` on the round folders would.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.flower import _lib as lib
from fedalign.flower import messages as m
from fedalign.flower.exchange import Exchange, lost_clients, majority
from fedalign.flower.messages import NodeReplyError, Payload
from fedalign.flower.premap import run_premap
from fedalign.flower.settings import Settings


@dataclass
class _Relay:
    """What the relay holds between rounds.

    Attributes
    ----------
    base : the config every message carries (federation, strategy)
    names : {node id: client}
    everyone : the clients that said hello, sorted
    alive : node ids still in the federation, by client
    state_round : {node id: rounds its state has done}
    mailbox : {round: {client: atoms}}, the latest round only once a round is done
    peers_next : {node id: the peers it named for its next round}
    drawn_from : {node id: the clients it drew them from}
    """

    base: dict
    names: dict
    everyone: list
    alive: list
    state_round: dict
    mailbox: dict = field(default_factory=dict)
    peers_next: dict = field(default_factory=dict)
    drawn_from: dict = field(default_factory=dict)


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
    base = dict(federation=fed, strategy=s.strategy, **({"premap": s.premap} if s.premap else {}))
    relay, hello = _hello(ex, nodes, base)
    premap = None
    if s.premap and (s.fresh or all(r < 0 for r in relay.state_round.values())):
        premap = run_premap(ex, s, relay, out)
    start, shape, resumed = _start(ex, s, relay, hello)
    history = []
    evaluation = dict(row=s.strategy, seeds=[int(x) for x in eval_seeds])
    results = None
    for t in range(start + 1, int(s.rounds) + 1):
        results = _round(ex, s, relay, t, shape, evaluation, history)
    t_rounds = time.perf_counter() - t0

    if results is None:  # no round left to run (or nodes that were ahead): evaluate alone
        replies = ex.ask({n: (m.DADIL_EVALUATE, Payload({}, dict(relay.base, **evaluation)))
                          for n in relay.alive}, "defed", "evaluate")
        good = ex.keep(replies, "evaluation")
        results = {relay.names[n]: good[n].config.get("result") for n in relay.alive if n in good}
    targets = {c: r for c, r in results.items() if r}
    names = relay.names
    report = dict(producer="fedalign flower", method="DeFed-GMM-DaDiL (relayed gossip)",
                  federation=fed, strategy=s.strategy, rounds=int(s.rounds), resumed=resumed,
                  started_at_round=int(start), clients=[names[n] for n in relay.alive],
                  atoms_shape=shape, rounds_record=history,
                  communication={"counted": "bytes of each message's records (array bytes + "
                                            "keys); 'sent' = server → client",
                                 "per_client": ex.comm},
                  dropped=lost_clients(ex), exchanges=list(ex.exchanges),
                  warnings=list(ex.warnings),
                  timing_s=dict(rounds=t_rounds, total=time.perf_counter() - t0),
                  settings=dataclasses.asdict(s), targets=targets)
    if premap is not None:
        report["premap"] = premap
    if len(targets) == 1:  # the layout of a dadil-evaluate report (fedalign report reads it)
        report.update(next(iter(targets.values())))
    lib.write_report(out / f"defed-{fed}.json", lib.json_safe(report))
    for c, res in targets.items():
        ex.say(f"DeFed {fed}: target {c}: " + ", ".join(
            f"{k} {100 * v['mean']:.1f} ± {100 * v['std']:.1f}" for k, v in res["summary"].items()))
    return report


def _hello(ex: Exchange, nodes: list, base: dict):
    """``query.hello``: the nodes that hold a GMM (with ``premap``: a training file), their
    names and their states' rounds → (relay, {node id: reply})."""
    need = "train" if base.get("premap") else "gmm"

    def has_input(nid, p):
        if not p.config.get(f"has_{need}"):
            raise NodeReplyError(ex.label(nid), f"has no {need}='…' in its node config")

    hello = ex.keep(ex.ask({n: (m.HELLO, Payload({}, dict(base))) for n in nodes}, "defed",
                           "hello"),
                    "federation", has_input)
    names = {n: p.config["client"] for n, p in hello.items()}
    if len(set(names.values())) < len(names):
        raise lib.FedalignError("two nodes answered with the same client name")
    ex.require(hello, "DeFed hello")
    alive = sorted(hello, key=lambda n: names[n])
    state_round = {n: int(hello[n].config.get("round", -1)) for n in alive}
    return _Relay(base, names, [names[n] for n in alive], alive, state_round), hello


def _start(ex: Exchange, s: Settings, relay: _Relay, hello: dict):
    """Round 0 (fresh states) or the round the nodes' states resume from, in the mailbox →
    (start round, atoms shape [A, K, d, C], resumed)."""
    names, alive, state_round = relay.names, relay.alive, relay.state_round
    fed = relay.base["federation"]
    resumed = False
    if s.fresh or all(r < 0 for r in state_round.values()):
        init = dict(n_atoms=s.n_atoms, seed=s.dadil_seed, preset=s.preset,
                    n_components=s.n_components or None)
        reqs = {n: (m.DADIL_INIT, Payload({}, dict(relay.base, init=init, force=bool(s.fresh),
                                                   next_candidates=relay.everyone)))
                for n in alive}
        replies = ex.ask(reqs, "defed", "round 0")
        ok = [r for r in replies.values() if not isinstance(r, NodeReplyError)]
        shape = majority(tuple(r.config.get("shape") or ()) for r in ok)
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
        shape = majority(tuple(hello[n].config.get("shape") or ()) for n in alive)
        reqs = {n: (m.DADIL_ATOMS, Payload({}, dict(relay.base, round=start,
                                                    next_candidates=relay.everyone)))
                for n in alive}
        good = ex.keep(ex.ask(reqs, "defed", f"atoms of round {start}"), "federation",
                       _check_atoms(ex, list(shape), start))
        ex.say(f"DeFed {fed}: resuming at round {start} from the nodes' states")
    relay.alive = [n for n in alive if n in good]
    ex.require(good, "DeFed start")    # before the shape: no node left → the usual error
    shape = list(shape)
    relay.mailbox[start] = {names[n]: good[n].group("atoms") for n in relay.alive}
    for n in relay.alive:
        if state_round[n] == start:
            relay.peers_next[n] = list(good[n].config.get("peers_next") or [])
            relay.drawn_from[n] = set(relay.everyone)
    return start, shape, resumed


def _redraw(ex: Exchange, relay: _Relay, t: int, publishers: list, todo: list) -> list:
    """Clients whose peers were drawn from another pool than the clients that published
    round t − 1 draw again from those (``query.dadil_peers``); those that do not answer are
    dropped. Returns ``todo`` without them."""
    redraw = [n for n in todo if relay.drawn_from.get(n) != set(publishers)]
    if not redraw:
        return todo
    rp = ex.ask({n: (m.DADIL_PEERS, Payload({}, dict(relay.base, next_candidates=publishers)))
                 for n in redraw}, "defed", f"redraw before round {t}")
    rp = ex.keep(rp, "federation")
    for n in redraw:
        if n in rp:
            relay.peers_next[n] = list(rp[n].config.get("peers_next") or [])
            relay.drawn_from[n] = set(publishers)
    relay.alive = [n for n in relay.alive if n not in redraw or n in rp]
    return [n for n in todo if n not in redraw or n in rp]


def _round(ex: Exchange, s: Settings, relay: _Relay, t: int, shape: list, evaluation: dict,
           history: list):
    """Round t: every client that has done t − 1 rounds gets its named peers' atoms and runs
    it; those that did it already (a server restarted mid-round) send their round-t atoms.
    Appends the round's record to ``history``; returns the targets' results after the last
    round, else None."""
    names = relay.names
    publishers = sorted(relay.mailbox[t - 1])
    todo = [n for n in relay.alive if relay.state_round[n] == t - 1]
    ahead = [n for n in relay.alive if relay.state_round[n] >= t]
    todo = _redraw(ex, relay, t, publishers, todo)
    nxt = sorted(names[n] for n in relay.alive)
    last = t == int(s.rounds)
    reqs = {}
    for n in todo:
        fwd = {f"peer/{p}": relay.mailbox[t - 1][p] for p in relay.peers_next[n]}
        cfg = dict(relay.base, round=t, local_steps=s.local_steps, candidates=publishers,
                   next_candidates=None if last else nxt)
        if last:  # the target evaluates right after its last round (no extra exchange)
            cfg["evaluate"] = evaluation
        reqs[n] = (m.DADIL_ROUND, Payload(fwd, cfg))
    for n in ahead:  # a server restarted mid-round: these did round t already
        reqs[n] = (m.DADIL_ATOMS, Payload({}, dict(relay.base, round=t, next_candidates=nxt)))
    replies = ex.ask(reqs, "defed", f"round {t}")
    good = ex.keep(replies, "federation", _check_atoms(ex, shape, t))
    alive = relay.alive = [n for n in relay.alive if n in good]
    ex.require(good, f"DeFed round {t}")
    relay.mailbox[t] = {names[n]: good[n].group("atoms") for n in alive}
    for n in alive:
        relay.state_round[n] = max(relay.state_round[n], t)  # ahead: done already
        relay.peers_next[n] = list(good[n].config.get("peers_next") or [])
        relay.drawn_from[n] = set(nxt)
    history.append({names[n]: dict(peers=good[n].config.get("peers"),
                                   loss_first=good[n].config.get("loss_first"),
                                   loss_last=good[n].config.get("loss_last")) for n in alive})
    relay.mailbox.pop(t - 1, None)
    results = None
    if last:
        results = {names[n]: good[n].config.get("result") for n in alive}
        for n in alive:
            if good[n].config.get("result_error"):
                ex.warn(f"node {ex.label(n)}: the evaluation failed: "
                        f"{good[n].config['result_error']}")
    ex.say(f"DeFed {relay.base['federation']} round {t}: " + "; ".join(
        f"{names[n]} ← {', '.join(good[n].config.get('peers') or []) or '—'}" for n in alive))
    return results

"""Client-side handlers: what a SuperNode computes from its own files for each message.

Every handler takes the message :class:`~fedalign.flower.messages.Payload` and the node's
:class:`Node` (its node config) and returns the reply payload. They hold no method of their
own — each calls the library (:mod:`fedalign.flower._lib`) on the node's private files — and
they know nothing of Flower, so they are tested without a network.

Node config (``flower-supernode --node-config``)::

    name='ink'                      client id (letters, digits, _ . -)
    dir='/site/fedalign'            private working folder (aligned features, maps, DaDiL state)
    train='/site/ink.train.h5'      SLOT-Align: training features (labeled)
    test='/site/ink.test.h5'        SLOT-Align: the domain's test split (optional)
    gmm='/site/ink.gmm.npz'         DeFed-GMM-DaDiL: the client's GMM (``fedalign fit-gmm``;
                                    not read with premap='target': the node fits its own)
    dadil-test='/site/ink.test.h5'  DeFed: the target's held-out test split (optional)
    threads=1                       torch/BLAS threads of DaDiL rounds (as ``dadil-round``)

What leaves the node: SLOT — n, mean and Ledoit–Wolf covariance; the heads' aggregates
(:mod:`fedalign.heads`); per-domain accuracy. DeFed — the atoms it publishes (means,
variances, label logits, round), the ids of the peers it draws, its round, and the target's
accuracy; with premap='target' first a source's class statistics (class counts, class sums,
Σx, Σxxᵀ) and the target's completed reference (mean, covariance, its label-shift record).
Never features, labels, α, the GMM or the state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedalign.flower import _lib as lib
from fedalign.flower.messages import Payload

#: Files under the node's ``dir``.
SLOT_DIR = "slot"
DADIL_DIR = "dadil"
#: premap='target' files, under the federation's folder ``premap/``
PREMAP_FILES = {"stats": "{}.stats.npz", "aligned": "{}.to_target.h5", "gmm": "{}.gmm.npz",
                "reference": "{}.ref.npz"}


@dataclass
class Node:
    """A SuperNode's settings (its node config)."""

    name: str
    dir: Path
    train: Path | None = None
    test: Path | None = None
    gmm: Path | None = None
    dadil_test: Path | None = None
    threads: int = 1

    @classmethod
    def from_config(cls, cfg) -> "Node":
        """From a node config mapping; bad or missing entries → FedalignError."""
        cfg = dict(cfg or {})
        name = cfg.get("name")
        if not name:
            raise lib.FedalignError("the node config has no name='CLIENT' "
                                    "(flower-supernode --node-config \"name='ink' dir='…' …\")")
        lib.check_client_id(str(name))
        if not cfg.get("dir"):
            raise lib.FedalignError(f"node {name}: the node config has no dir='FOLDER' (the "
                                    "node's private working folder)")

        def path(key):
            v = cfg.get(key)
            return Path(str(v)).expanduser() if v not in (None, "") else None

        threads = int(cfg.get("threads", 1))
        if threads < 1:
            raise lib.FedalignError(f"node {name}: threads must be ≥ 1, got {threads}")
        return cls(str(name), path("dir"), path("train"), path("test"), path("gmm"),
                   path("dadil-test"), threads)

    def need(self, key: str) -> Path:
        p = getattr(self, key.replace("-", "_"))
        if p is None:
            raise lib.FedalignError(f"node {self.name}: this run needs {key}='PATH' in the "
                                    "node config")
        return p

    # SLOT-Align files
    def slot_path(self, what: str) -> Path:
        d = self.dir / SLOT_DIR
        d.mkdir(parents=True, exist_ok=True)
        return d / {"stats": f"{self.name}.stats.npz", "map": f"{self.name}.map.npz",
                    "train": f"{self.name}.train.h5", "test": f"{self.name}.test.h5"}[what]

    # DeFed-GMM-DaDiL files: the layout of a file-pipeline federation (state/, round_XXX/)
    def dadil_paths(self, federation: str, t: int) -> tuple[Path, Path]:
        lib.check_client_id(federation)
        return lib.federation_paths(self.dir / DADIL_DIR / federation, self.name, t)

    def premap_path(self, federation: str, what: str) -> Path:
        """``dir/dadil/FEDERATION/premap/NAME.…``: the per-class stats, the train rows mapped
        onto the target (``aligned``), the GMM, the target's reference."""
        lib.check_client_id(federation)
        d = self.dir / DADIL_DIR / federation / "premap"
        d.mkdir(parents=True, exist_ok=True)
        return d / PREMAP_FILES[what].format(self.name)

    def dadil_gmm(self, config: dict) -> Path:
        """The GMM of the DeFed rounds: the one premap wrote (``premap`` in the message), else
        the node config's ``gmm=``."""
        if config.get("premap"):
            return self.premap_path(config["federation"], "gmm")
        return self.need("gmm")


def _domain(path: Path, info: dict) -> str:
    return str(info["provenance"].get("domain") or path.name.split(".")[0])


def _max_label(y) -> int:
    return int(np.max(y)) if len(y) else -1


# --------------------------------------------------------------------------------------------
# SLOT-Align
# --------------------------------------------------------------------------------------------


def stats(p: Payload, node: Node) -> Payload:
    """``query.stats``: n, mean and Ledoit–Wolf covariance of the training file.

    Also the class names, the largest label (train and test) and the dimension, which the
    server checks across clients. The full stats file stays on the node (for its map).
    """
    train = node.need("train")
    st = lib.compute_stats(train, p.config.get("shrinkage", "auto"))
    lib.save_stats(node.slot_path("stats"), st, dict(producer="fedalign flower", source=str(train)))
    _, y, _ = lib.read_features(train)
    max_label = _max_label(y)
    if node.test is not None:
        _, yt, _ = lib.read_features(node.test)
        max_label = max(max_label, _max_label(yt))
    return Payload({"stats": {"mean": st.mean, "covariance": st.covariance}},
                   dict(client=node.name, n=int(st.n), shrinkage=float(st.shrinkage),
                        class_names=list(st.class_names), max_label=max_label, d=int(st.d)))


#: The record of the reference in ``train.align`` / ``train.heads`` messages.
REFERENCE = "ref/slot-align/reference"


def align(p: Payload, node: Node) -> Payload:
    """``train.align``: map the training file (and the test split) to the reference at τ.

    The map is built from the node's own statistics (``fedalign align --stats``); the test
    split is mapped by the same map (``fedalign align --map``). Aligned files and the map stay
    on the node. A ``train.heads`` message that carries the reference aligns first.
    """
    tau = lib.check_tau(float(p.config["tau"]))
    ref = _reference(p.group(REFERENCE), p.config.get("reference_sha256"))
    st = lib.load_stats(node.slot_path("stats"))
    amap = lib.client_map(st, ref)
    prov = dict(reference_sha256=p.config.get("reference_sha256"), via="fedalign flower")
    lib.align_file(node.need("train"), node.slot_path("train"), amap, tau, provenance=prov)
    lib.save_map(node.slot_path("map"), amap)
    n_test = 0
    if node.test is not None:
        lib.align_file(node.test, node.slot_path("test"), amap, tau, provenance=prov)
        n_test = int(len(lib.read_features(node.slot_path("test"))[1]))
    return Payload({}, dict(client=node.name, aligned=True, n_test=n_test))


def _reference(r: dict, sha256) -> "lib.Reference":
    """The reference of a message's record (mean (d,), covariance (d, d), weights, n)."""
    return lib.Reference(np.asarray(r["mean"], float), np.asarray(r["covariance"], float),
                         np.asarray(r.get("weights", []), float),
                         np.asarray(r.get("n", []), np.int64), dict(sha256=sha256))


def heads(p: Payload, node: Node) -> Payload:
    """``train.heads``: one message per job (head, seed, round) from the aligned training file.

    Config: ``jobs`` [{id, method, params, seed, k, round}], ``n_classes``; arrays: ``init/ID``
    the server's broadcast of that job (O-FedAvg's start), absent for one-shot aggregates.
    Only labeled rows train (as ``fedalign evaluate``). With the reference (the first
    round), the node aligns its files first (:func:`align`). The reply names the ``align``
    step of its train file's provenance (its statistics' release record) for the server's
    privacy accounting.
    """
    aligned = {}
    if p.group(REFERENCE):
        aligned = align(p, node).config
    X, y, info = lib.read_features(node.slot_path("train") if p.config.get("aligned", True)
                                   else node.need("train"))
    keep = y >= 0
    X, y = X[keep], y[keep]
    if not len(y):
        raise lib.FedalignError(f"node {node.name}: no labeled training rows")
    C = int(p.config["n_classes"])
    out = {}
    for job in p.config["jobs"]:
        init = _init_of(p.group(f"init/{job['id']}"))
        msg = lib.head_client_update(job["method"], job.get("params"), X, y, C, int(job["seed"]),
                                     int(job["k"]), int(job["round"]), init)
        out[f"msg/{job['id']}"] = {k: np.asarray(v) for k, v in msg.items()}
    # the release record of its statistics (the align step of its train file's provenance:
    # digests and DP records, no data), for the server's privacy accounting
    steps = [h for h in info["provenance"].get("history", []) if h.get("step") == "align"]
    return Payload(out, dict(aligned, client=node.name, align_step=steps[-1] if steps else None))


def _init_of(arrays: dict):
    if not arrays:
        return None
    init = {k: np.asarray(v) for k, v in arrays.items()}
    if "round" in init:
        init["round"] = int(init["round"])
    return init


def evaluate(p: Payload, node: Node) -> Payload:
    """``evaluate.heads``: accuracy of every global head on the node's aligned test split."""
    if node.test is None:
        return Payload({}, dict(client=node.name, domain=None, accuracy={}))
    path = node.slot_path("test") if p.config.get("aligned", True) else node.test
    X, y, info = lib.read_features(path)
    acc = {}
    for name, arrays in p.arrays.items():
        if name.startswith("head/"):
            head = lib.LinearHead(np.asarray(arrays["W"], float), np.asarray(arrays["b"], float))
            acc[name[len("head/"):]] = head.accuracy(X, y)
    return Payload({}, dict(client=node.name, domain=_domain(node.test, info),
                            n_test=int(np.sum(y >= 0)), accuracy=acc))


# --------------------------------------------------------------------------------------------
# DeFed-GMM-DaDiL
# --------------------------------------------------------------------------------------------


def _atoms_payload(pa) -> dict:
    return {"means": pa.means, "variances": pa.variances, "label_logits": pa.label_logits}


def hello(p: Payload, node: Node) -> Payload:
    """``query.hello``: the node's id and, for a DeFed federation, its state's round and shape
    (round −1: no state yet)."""
    cfg = dict(client=node.name, has_train=node.train is not None,
               has_gmm=node.gmm is not None, round=-1)
    fed = p.config.get("federation")
    if fed:
        sp, _ = node.dadil_paths(fed, 0)
        if sp.is_file():
            st = lib.load_state(sp)
            if st.client != node.name:
                raise lib.FedalignError(f"node {node.name}: {sp} is the state of {st.client}")
            cfg.update(round=int(st.round), shape=list(st.shape),
                       role=st.settings.get("role"), n_atoms=int(st.settings.get("n_atoms", 0)))
    return Payload({}, cfg)


def _next_peers(node: Node, sp: Path, p: Payload) -> list:
    nxt = p.config.get("next_candidates")
    if nxt is None:
        return []
    return lib.draw_peers(lib.load_state(sp), nxt, p.config["strategy"])


def _reply_atoms(node: Node, st, sp, p: Payload, extra: dict | None = None) -> Payload:
    cfg = dict(client=node.name, round=int(st.round), shape=list(st.shape),
               role=st.settings.get("role"), peers_next=_next_peers(node, sp, p))
    cfg.update(extra or {})
    return Payload({"atoms": _atoms_payload(st.published())}, cfg)


def dadil_init(p: Payload, node: Node) -> Payload:
    """``train.dadil_init``: a fresh state and the round-0 atoms (``dadil-round --init``).

    Config: ``federation``, ``init`` (n_atoms, seed, n_components, preset, …), ``force``;
    ``strategy`` and ``next_candidates`` to name the peers of round 1.
    """
    lib.limit_threads(node.threads)
    sp, ap = node.dadil_paths(p.config["federation"], 0)
    sp.parent.mkdir(parents=True, exist_ok=True)
    ap.parent.mkdir(parents=True, exist_ok=True)
    st = lib.init_files(node.name, node.dadil_gmm(p.config), sp, ap,
                        force=bool(p.config.get("force")),
                        **dict(p.config.get("init") or {}))
    return _reply_atoms(node, st, sp, p)


def dadil_round(p: Payload, node: Node) -> Payload:
    """``train.dadil_round``: round t from the forwarded atoms of the peers this node named.

    Config: ``federation``, ``round`` t, ``strategy``, ``local_steps``, ``candidates`` (the
    clients that published round t−1), ``next_candidates``; arrays ``peer/ID`` — the atoms of
    each named peer (round t−1).
    """
    lib.limit_threads(node.threads)
    t = int(p.config["round"])
    sp, ap = node.dadil_paths(p.config["federation"], t)
    ap.parent.mkdir(parents=True, exist_ok=True)
    st0 = lib.load_state(sp)
    if st0.round != t - 1:
        raise lib.FedalignError(f"node {node.name}: asked for round {t}, but its state has "
                                f"{st0.round} rounds done")
    forwarded = {}
    for name, a in p.arrays.items():
        if name.startswith("peer/"):
            peer = name[len("peer/"):]
            forwarded[peer] = lib.PublishedAtoms(np.asarray(a["means"], float),
                                                 np.asarray(a["variances"], float),
                                                 np.asarray(a["label_logits"], float), t - 1, peer)
    st, rec = lib.relay_round(sp, ap, p.config["strategy"], int(p.config["local_steps"]),
                              node.name, node.dadil_gmm(p.config), p.config["candidates"],
                              forwarded)
    losses = rec.get("losses") or []
    extra = dict(peers=list(rec["peers"]), loss_first=losses[0] if losses else None,
                 loss_last=losses[-1] if losses else None)
    if p.config.get("evaluate"):  # the last round: the target evaluates right after it
        try:
            extra["result"] = dadil_evaluate(Payload({}, dict(p.config["evaluate"],
                                                              federation=p.config["federation"])),
                                             node).config["result"]
        except lib.FedalignError as e:  # the round stands; the server reports the evaluation
            extra["result_error"] = " ".join(str(e).split())
    return _reply_atoms(node, st, sp, p, extra)


def dadil_atoms(p: Payload, node: Node) -> Payload:
    """``query.dadil_atoms``: the atoms the node published in round r (from its own files),
    for a server that restarted; with ``next_candidates``, the peers of round r + 1."""
    r = int(p.config["round"])
    sp, ap = node.dadil_paths(p.config["federation"], r)
    st = lib.load_state(sp)
    if st.round < r:
        raise lib.FedalignError(f"node {node.name}: has no atoms of round {r} (its state has "
                                f"{st.round} rounds done)")
    pa = lib.load_atoms(ap)
    if pa.round != r or pa.producer != node.name:
        raise lib.FedalignError(f"node {node.name}: {ap} holds round {pa.round} of {pa.producer}")
    peers = _next_peers(node, sp, p) if st.round == r else []
    return Payload({"atoms": _atoms_payload(pa)},
                   dict(client=node.name, round=r, shape=list(pa.shape), peers_next=peers,
                        state_round=int(st.round)))


def dadil_peers(p: Payload, node: Node) -> Payload:
    """``query.dadil_peers``: redraw the peers of the next round from ``next_candidates``
    (a peer it named dropped out)."""
    sp, _ = node.dadil_paths(p.config["federation"], 0)
    return Payload({}, dict(client=node.name, peers_next=_next_peers(node, sp, p)))


def dadil_evaluate(p: Payload, node: Node) -> Payload:
    """``evaluate.dadil``: the target's DeFed classifier on its held-out test split
    (``fedalign dadil-evaluate --test … --state NAME=…``); nodes without ``dadil-test`` answer
    with no result."""
    if node.dadil_test is None:
        return Payload({}, dict(client=node.name, result=None))
    lib.limit_threads(node.threads)
    fed = p.config["federation"]
    sp, _ = node.dadil_paths(fed, 0)
    res = lib.evaluate_target_files(node.dadil_test, states={p.config.get("row", fed): sp},
                                    seeds=[int(s) for s in p.config.get("seeds", [0])])
    return Payload({}, dict(client=node.name, result=res.to_json()))


# --------------------------------------------------------------------------------------------
# DeFed-GMM-DaDiL's first half (premap='target'): the sources onto the target's Gaussian
# --------------------------------------------------------------------------------------------


def class_stats(p: Payload, node: Node) -> Payload:
    """``query.class_stats``: a source's class statistics — of ``fedalign stats --per-class``'s
    file (``premap/NAME.stats.npz``), what ``target-reference`` reads: class counts (C,),
    class sums (C, d), Σx (d,), Σxxᵀ (d, d)."""
    train = node.need("train")
    path = node.premap_path(p.config["federation"], "stats")
    st = lib.compute_stats(train, "auto", per_class=True)
    lib.save_stats(path, st, dict(producer="fedalign flower", source=str(train)))
    msg = lib.class_message(lib.load_stats(path), path)
    return Payload({"class_stats": msg}, dict(client=node.name, d=int(st.d), n=int(st.n),
                                              class_names=list(st.class_names)))


def target_reference(p: Payload, node: Node) -> Payload:
    """``train.target_reference``: ``fedalign target-reference`` on the target's training rows
    and the sources' class statistics (records ``source/ID``, in ``sources``' order), kept as
    ``premap/NAME.ref.npz``; replies its mean (d,), covariance (d, d), n, label-shift record."""
    train = node.need("train")
    sources = list(p.config["sources"])
    msgs = [{k: np.asarray(v) for k, v in p.group(f"source/{c}").items()} for c in sources]
    ref, rec = lib.reference_from_messages(train, msgs)
    lib.save_reference(node.premap_path(p.config["federation"], "reference"), ref,
                       dict(producer="fedalign flower", target=str(train), sources=sources))
    return Payload({"reference": {"mean": ref.mean, "covariance": ref.covariance}},
                   dict(client=node.name, d=int(ref.d), n=int(ref.n[0]), label_shift=rec))


def premap(p: Payload, node: Node) -> Payload:
    """``train.premap``: the node's GMM for the DeFed rounds, ``premap/NAME.gmm.npz``: a source
    maps its training rows onto the message's reference (``fedalign align --tau 1`` →
    ``premap/NAME.to_target.h5``) and fits its labeled GMM on them, the target its unlabeled
    GMM on its own rows (``fit-gmm [--unlabeled] -k gmm_k --seed gmm_seed``); all or none."""
    fed, train = p.config["federation"], node.need("train")
    gp = node.premap_path(fed, "gmm")
    k, seed = int(p.config["gmm_k"]), int(p.config["gmm_seed"])
    with lib.atomic_outputs() as tx:
        if p.config["role"] == "target":
            g = lib.fit_gmm_file(train, gp, k, seed=seed, unlabeled=True,
                                 producer="fedalign flower")
        else:
            sha = p.config.get("reference_sha256")
            amap = lib.client_map(lib.compute_stats(train), _reference(p.group("reference"), sha))
            ap = node.premap_path(fed, "aligned")
            lib.align_file(train, ap, amap, 1.0, provenance=lib.map_provenance(amap, sha))
            g = lib.fit_gmm_file(tx.temporary(ap), gp, k, seed=seed, source=ap,
                                 producer="fedalign flower")
    return Payload({}, dict(client=node.name, role=p.config["role"], gmm=dict(
        K=int(g.K), d=int(g.d), labeled=bool(g.labeled), sha256=lib.sha256_file(gp))))


#: message type → handler
HANDLERS = {}


def _register():
    from fedalign.flower import messages as m

    HANDLERS.update({m.HELLO: hello, m.STATS: stats, m.ALIGN: align, m.HEADS: heads,
                     m.EVALUATE: evaluate, m.DADIL_INIT: dadil_init, m.DADIL_ROUND: dadil_round,
                     m.DADIL_ATOMS: dadil_atoms, m.DADIL_PEERS: dadil_peers,
                     m.DADIL_EVALUATE: dadil_evaluate, m.CLASS_STATS: class_stats,
                     m.TARGET_REFERENCE: target_reference, m.PREMAP: premap})


_register()


def handle(message_type: str, p: Payload, node_config) -> Payload:
    """Run the handler of a message type on this node."""
    node = Node.from_config(node_config)
    try:
        fn = HANDLERS[message_type]
    except KeyError:
        raise lib.FedalignError(f"node {node.name}: unknown message type {message_type!r}") from None
    return fn(p, node)

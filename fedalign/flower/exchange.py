"""The server's side of the messages: push them to the nodes, poll the replies, check them,
count their bytes, and keep the record of every exchange and of every client lost.

Both drivers (:mod:`fedalign.flower.slot_driver`, :mod:`fedalign.flower.defed_driver`) talk to
the nodes only through :class:`Exchange`, so they run the same on the deployment engine and on
an in-process grid (:class:`fedalign.flower.loopback.LoopbackGrid`, the tests).

Faults: a node that does not answer within ``timeout`` or whose reply is refused (error,
wrong shape, NaN/Inf, non-SPD covariance) is dropped with one warning naming it
(:meth:`Exchange.keep`); the run goes on while at least ``min-clients`` remain, else it stops
with those messages (:meth:`Exchange.require`). Both reports record every exchange
(``exchanges``: seconds, bytes both ways, nodes that answered) and every client lost
(``dropped``, :func:`lost_clients`: where, why, and the exchanges it missed).
"""

from __future__ import annotations

import time

from fedalign.flower import _lib as lib
from fedalign.flower import messages as m
from fedalign.flower.messages import NodeReplyError, node_label
from fedalign.flower.settings import Settings


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
        """Stop the run (FedalignError, with the last drops) when fewer than ``min-clients``
        clients are left after ``what``."""
        if len(good) < self.s.min_clients:
            lost = [w for w in self.warnings if "dropped" in w]
            raise lib.FedalignError(f"{what}: {len(good)} client(s) left, fewer than "
                                    f"min-clients={self.s.min_clients}"
                                    + ("; " + "; ".join(lost[-5:]) if lost else ""))


def majority(values):
    """The most common of the replies' values (ties: the first in text order), None for none."""
    vals = list(values)
    return max(sorted(set(vals), key=str), key=vals.count) if vals else None


def lost_clients(ex: Exchange) -> list:
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

"""An in-process ``Grid``: the ServerApp's messages go straight to ClientApp calls.

No SuperLink, no SuperNodes, no network: every message built by the ServerApp logic is handed
to the real ClientApp (``app(message, context)``) with that node's ``Context`` (its node
config), and the reply goes back as a Flower ``Message``, through the same records, checks
and byte counts as on the deployment engine. Used by the tests; also a dry run of a
federation's configuration on one machine::

    from fedalign.flower.loopback import LoopbackGrid
    from fedalign.flower.server_app import run
    grid = LoopbackGrid([{"name": "ink", "dir": "…", "train": "…", "test": "…"}, …])
    run(grid, {"method": "slot", "out": "out/flower", "heads": "fedcgs"})

Faults for tests: ``drop`` (node ids that never answer) and ``tamper`` (a function
``(node_id, message_type, reply) -> reply`` applied to every reply).
"""

from __future__ import annotations

from flwr.app import Context, RecordDict
from flwr.serverapp import Grid


def _set_identity() -> None:
    """Flower builds a message from the process's task identity (set by its runtime in a
    ServerApp process); in this process the loopback grid is the SuperLink (node 1)."""
    from flwr.supercore.task_identity import TaskIdentity

    for key, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        if getattr(TaskIdentity, key) is None:
            setattr(TaskIdentity, key, value)


class LoopbackGrid(Grid):
    """A ``flwr.serverapp.Grid`` whose nodes are ClientApp calls in this process."""

    def __init__(self, node_configs, client_app=None, run_config=None, first_id: int = 1001):
        if client_app is None:
            from fedalign.flower.client_app import app as client_app
        self.client_app = client_app
        self.contexts = {first_id + i: Context(run_id=1, node_id=first_id + i,
                                               node_config=dict(cfg), state=RecordDict(),
                                               run_config=dict(run_config or {}))
                         for i, cfg in enumerate(node_configs)}
        self.drop: set = set()
        self.tamper = None
        self._replies: dict = {}
        self._run = None
        self.log: list = []  # (node id, message type, sent Message, reply Message | None)
        _set_identity()

    # -- Grid interface ------------------------------------------------------------------------
    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        from flwr.app import Message

        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self):
        return [n for n in self.contexts if n not in self.drop]

    def push_messages(self, messages):
        ids = []
        for i, msg in enumerate(messages):
            mid = f"loopback-{len(self.log)}-{i}"
            msg.metadata.__dict__["_message_id"] = mid
            nid = msg.metadata.dst_node_id
            reply = None
            if nid in self.contexts and nid not in self.drop:
                reply = self.client_app(msg, self.contexts[nid])
                if self.tamper is not None:
                    reply = self.tamper(nid, msg.metadata.message_type, reply)
            self.log.append((nid, msg.metadata.message_type, msg, reply))
            if reply is not None:
                self._replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(list(messages)))

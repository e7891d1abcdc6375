"""The ClientApp: each message type runs its handler (:mod:`fedalign.flower.handlers`) on the
node's own files, named in its node config.

Bad input at the node (a missing file, a wrong file kind, NaN features, …) is answered with
one ``error`` line, which the server reports naming the node; anything else is a bug and
travels back as Flower's error reply (with its traceback in the SuperNode's log).
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedalign.flower._lib import FedalignError
from fedalign.flower import handlers
from fedalign.flower.messages import Payload, from_recorddict, to_recorddict

app = ClientApp()


def answer(msg: Message, context: Context) -> Message:
    """Run the handler of ``msg``'s type on this node; a FedalignError becomes an error reply."""
    mtype = msg.metadata.message_type
    try:
        reply = handlers.handle(mtype, from_recorddict(msg.content), context.node_config)
    except FedalignError as e:
        name = str(dict(context.node_config or {}).get("name") or "")
        reply = Payload({}, dict(client=name or None, error=" ".join(str(e).split())))
    return Message(to_recorddict(reply), reply_to=msg)


def _register(category: str, action: str) -> None:
    decorator = {"query": app.query, "train": app.train, "evaluate": app.evaluate}[category]
    decorator(action)(answer)


for _mtype in handlers.HANDLERS:
    _register(*_mtype.split("."))

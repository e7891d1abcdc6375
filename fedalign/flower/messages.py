"""What travels between the ServerApp and the ClientApps, and how it is checked.

A :class:`Payload` is the content of one message in plain Python: named groups of numpy
arrays (each an ``ArrayRecord`` on the wire) and one ``config`` dict (a ``ConfigRecord``;
nested values travel as one JSON string). :func:`to_recorddict` / :func:`from_recorddict`
convert it to and from Flower's ``RecordDict``; float64 arrays round-trip bit for bit (Flower
stores arrays as ``.npy`` bytes).

Bytes (:func:`payload_bytes`) are counted as Flower's ``message_size_mod`` counts them: the
array bytes plus the keys of every record (``record.count_bytes()``), i.e. the payload without
the transport's framing.

The ``check_*`` functions validate a reply before the server uses it: expected keys, shapes,
finite values; a bad reply raises :class:`NodeReplyError`, one line naming the node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from fedalign.flower._lib import FedalignError

#: Message types (``<category>.<action>``) the ClientApp answers.
HELLO = "query.hello"
STATS = "query.stats"
ALIGN = "train.align"
HEADS = "train.heads"
EVALUATE = "evaluate.heads"
DADIL_INIT = "train.dadil_init"
DADIL_ROUND = "train.dadil_round"
DADIL_ATOMS = "query.dadil_atoms"
DADIL_PEERS = "query.dadil_peers"
DADIL_EVALUATE = "evaluate.dadil"
# DeFed's first half (premap='target'): the sources onto the target's completed Gaussian
CLASS_STATS = "query.class_stats"
TARGET_REFERENCE = "train.target_reference"
PREMAP = "train.premap"

_JSON_KEY = "_json"


class NodeReplyError(FedalignError):
    """A node's reply was refused (missing, failed, wrong shape, NaN …); names the node."""

    def __init__(self, node: str, message: str):
        super().__init__(f"node {node}: {message}")
        self.node = node
        self.reason = message


@dataclass
class Payload:
    """Content of one message: ``arrays`` {group: {key: ndarray}} and ``config`` (JSON-able)."""

    arrays: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def group(self, name: str) -> dict:
        return self.arrays.get(name, {})


# --------------------------------------------------------------------------------------------
# Flower records
# --------------------------------------------------------------------------------------------


def to_recorddict(p: Payload):
    """:class:`Payload` → ``flwr.app.RecordDict``."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    rd = RecordDict()
    for name, arrays in p.arrays.items():
        if name == "config":
            raise ValueError("'config' is reserved for the config record")
        rd[name] = ArrayRecord({k: Array(np.array(v, order="C"))
                                for k, v in arrays.items()})
    rd["config"] = ConfigRecord({_JSON_KEY: json.dumps(p.config, sort_keys=True)})
    return rd


def from_recorddict(rd) -> Payload:
    """``flwr.app.RecordDict`` → :class:`Payload` (arrays as numpy, config parsed)."""
    from flwr.app import ArrayRecord

    arrays, config = {}, {}
    for name, rec in rd.items():
        if name == "config":
            config = json.loads(str(rec[_JSON_KEY])) if _JSON_KEY in rec else dict(rec)
        elif isinstance(rec, ArrayRecord):
            arrays[name] = {k: a.numpy() for k, a in rec.items()}
    return Payload(arrays, config)


def payload_bytes(rd) -> int:
    """Bytes of a ``RecordDict`` as Flower's ``message_size_mod`` counts them."""
    return int(sum(rec.count_bytes() for rec in rd.values()))


# --------------------------------------------------------------------------------------------
# Reply checks (server side)
# --------------------------------------------------------------------------------------------


def _shape(shape) -> str:
    return "(" + ", ".join("?" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_arrays(node: str, what: str, arrays: dict, spec: dict, finite: bool = True) -> dict:
    """Every key of ``spec`` present with its shape (None: any size), numeric and finite.

    Returns the arrays as float64/int64 numpy arrays (keys of ``spec`` only).
    """
    out = {}
    for key, shape in spec.items():
        if key not in arrays:
            raise NodeReplyError(node, f"{what} reply has no '{key}'")
        a = np.asarray(arrays[key])
        if a.dtype.kind not in "biuf":
            raise NodeReplyError(node, f"{what} reply: '{key}' is not numeric (dtype {a.dtype})")
        if shape is not None and (a.ndim != len(shape) or any(
                s is not None and s != t for s, t in zip(shape, a.shape))):
            raise NodeReplyError(node, f"{what} reply: '{key}' has shape {a.shape}, expected "
                                       f"{_shape(shape)}")
        if finite and a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            bad = int(np.sum(~np.isfinite(a)))
            raise NodeReplyError(node, f"{what} reply: '{key}' has {bad} NaN/Inf value"
                                       f"{'s' if bad > 1 else ''}")
        out[key] = a
    return out


def check_finite_message(node: str, what: str, msg: dict, keys) -> dict:
    """A head's client message: only declared keys, numeric, finite (NaN/Inf refused)."""
    extra = set(msg) - set(keys)
    if extra:
        raise NodeReplyError(node, f"{what} reply has undeclared keys {sorted(extra)}")
    return check_arrays(node, what, msg, {k: None for k in msg})


def node_label(node_id: int, client: str | None = None) -> str:
    """``ink (node 1234…)`` or ``1234…`` when the node's name is not known yet."""
    short = str(node_id)
    return f"{client} (node {short})" if client else short

"""O-FedAvg: one-shot federated averaging of locally trained linear softmax heads.

Server → clients: a common initialisation (W₀, b₀). Client k trains a linear softmax head on
its data and sends (W_k, b_k, n_k). Server: W = Σ_k ω_k W_k with ω_k = 1/K (``weighting=
"equal"``, the reference setting) or ω_k = n_k / N (``"samples"``).

Reference setting: SGD lr 1e-3, momentum 0.9, weight decay 1e-5, batch 64, 10 epochs.
``softmax_before_ce`` reproduces the reference code, which applies a softmax before the
cross-entropy loss (off by default).

McMahan et al., "Communication-efficient learning of deep networks from decentralized data",
AISTATS 2017 (one round).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
from fedalign.heads import LinearHead
from fedalign.heads.linear import default_init, train_softmax

MESSAGE_KEYS = ("W", "b", "n")


@dataclass
class Config:
    epochs: int = 10
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 1e-5
    batch_size: int = 64
    weighting: str = "equal"
    softmax_before_ce: bool = False

    def validate(self):
        if self.weighting not in ("equal", "samples"):
            raise FedalignError(f"ofedavg.weighting must be equal or samples, got {self.weighting!r}")


def server_init(d: int, n_classes: int, config: Config, seed: int) -> dict:
    """The common starting point broadcast to every client."""
    W0, b0 = default_init(d, n_classes, seed)
    return {"W": W0, "b": b0}


def client_update(X, y, n_classes: int, config: Config, seed: int, init=None) -> dict:
    """Train locally; the message is the head and the sample count."""
    start = (init["W"], init["b"]) if init is not None else None
    W, b = train_softmax(X, y, n_classes, epochs=config.epochs, lr=config.lr,
                         batch_size=config.batch_size, momentum=config.momentum,
                         weight_decay=config.weight_decay,
                         softmax_before_ce=config.softmax_before_ce, seed=seed, init=start)
    return {"W": W, "b": b, "n": np.int64(len(y))}


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    """Average the client heads once."""
    n = np.array([float(m["n"]) for m in messages])
    w = n / n.sum() if config.weighting == "samples" else np.full(len(n), 1.0 / len(n))
    W = sum(wk * m["W"] for wk, m in zip(w, messages))
    b = sum(wk * m["b"] for wk, m in zip(w, messages))
    return LinearHead(np.asarray(W, float), np.asarray(b, float))

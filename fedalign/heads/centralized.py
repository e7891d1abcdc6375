"""Centralized: a linear softmax head trained on the pooled raw data — the upper reference.

Its "message" is the client's raw features and labels, i.e. exactly what federated learning
must not share; it exists only to bound what the federated heads can reach on the same data.
Default: SGD lr 0.01, momentum 0.9, weight decay 1e-5, batch 64, 50 epochs. It has no
reference implementation, so only ``variant=fedalign`` exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedalign.heads import LinearHead
from fedalign.heads.linear import train_softmax

#: The only method whose message holds raw rows.
MESSAGE_KEYS = ("X", "y")
SHARES_RAW_DATA = True


@dataclass
class Config:
    variant: str = "fedalign"
    epochs: int = 50
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    batch_size: int = 64
    optimizer: str = "sgd"

    VARIANTS = {"fedalign": {}}


def client_update(X, y, n_classes: int, config: Config, seed: int, init=None) -> dict:
    return {"X": np.asarray(X, np.float32), "y": np.asarray(y, np.int64)}


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    X = np.concatenate([m["X"] for m in messages])
    y = np.concatenate([m["y"] for m in messages])
    W, b = train_softmax(X, y, n_classes, epochs=config.epochs, lr=config.lr,
                         batch_size=config.batch_size, optimizer=config.optimizer,
                         momentum=config.momentum, weight_decay=config.weight_decay, seed=seed)
    return LinearHead(W, b)

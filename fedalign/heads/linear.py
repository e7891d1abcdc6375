"""Training a linear softmax head with torch (shared by ofedavg, fedpft and centralized).

Deterministic given the seed: the initialisation and the mini-batch order come from a numpy
generator, and torch runs on the CPU in float32.
"""

from __future__ import annotations

import numpy as np

from fedalign.errors import FedalignError


def default_init(d: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's ``nn.Linear`` initialisation, U(−1/√d, 1/√d), drawn from a numpy generator."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(d)
    return rng.uniform(-bound, bound, (n_classes, d)), rng.uniform(-bound, bound, n_classes)


def train_softmax(X, y, n_classes: int, *, epochs: int, lr: float, batch_size: int,
                  optimizer: str = "sgd", momentum: float = 0.9, weight_decay: float = 1e-5,
                  softmax_before_ce: bool = False, seed: int = 0, init=None):
    """Minimise the cross-entropy of softmax(X Wᵀ + b) by mini-batch SGD or AdamW.

    Parameters
    ----------
    X : (n, d) features; y : (n,) labels in [0, C)
    softmax_before_ce : apply a softmax to the logits before the cross-entropy (which applies
        its own log-softmax), as the SLOT-Align reference code does. Off by default.
    init : optional (W (C, d), b (C,)) starting point; default :func:`default_init`.

    Returns
    -------
    W : (C, d) float64, b : (C,) float64
    """
    import torch

    # One thread: these heads are tiny, and on a shared machine torch's thread pool is
    # dozens of times slower than a single thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(torch, X, y, n_classes, epochs, lr, batch_size, optimizer, momentum,
                      weight_decay, softmax_before_ce, seed, init)
    finally:
        torch.set_num_threads(threads)


def _train(torch, X, y, n_classes, epochs, lr, batch_size, optimizer, momentum, weight_decay,
           softmax_before_ce, seed, init):
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    n, d = X.shape
    if n == 0:
        raise FedalignError("cannot train a head on zero samples")
    rng = np.random.default_rng(seed)
    W0, b0 = init if init is not None else default_init(d, n_classes, int(rng.integers(2**31)))
    W = torch.tensor(np.asarray(W0, dtype=np.float32), requires_grad=True)
    b = torch.tensor(np.asarray(b0, dtype=np.float32), requires_grad=True)
    if optimizer == "sgd":
        opt = torch.optim.SGD([W, b], lr=lr, momentum=momentum, weight_decay=weight_decay)
    elif optimizer == "adamw":
        opt = torch.optim.AdamW([W, b], lr=lr, weight_decay=weight_decay)
    else:
        raise FedalignError(f"optimizer must be sgd or adamw, got {optimizer!r}")
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    for _ in range(int(epochs)):
        order = torch.from_numpy(rng.permutation(n))
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            logits = Xt[idx] @ W.T + b
            if softmax_before_ce:
                logits = torch.softmax(logits, dim=1)
            loss = torch.nn.functional.cross_entropy(logits, yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return W.detach().numpy().astype(np.float64), b.detach().numpy().astype(np.float64)

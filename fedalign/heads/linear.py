"""Training a linear softmax head with torch (shared by ofedavg, fedpft and centralized).

Deterministic given the seed: the initialisation and the mini-batch order come from a numpy
generator, and torch runs on the CPU in float32.

Options beyond plain mini-batch cross-entropy (all off by default):

- ``logit_offset`` o (C,): the loss is CE(softmax(x Wᵀ + b + o), y). With o_c = log π_c, the
  client's class prior, this is the *logit-adjusted* ("balanced softmax") loss of
  Menon et al. (ICLR 2021) / FedLC (Zhang et al., ICML 2022): the head learns scores free of
  the client's label distribution (classes the client lacks have o_c = −∞: no gradient).
- ``transport`` (A, b) with per-epoch ``taus``: a frozen transport layer in front of the head,
  epoch e trains on T_{τ_e}(x) = (1 − τ_e) x + τ_e (A x + b) (SLOT-Align's τ schedule).
- ``softmax_before_ce``: a softmax applied before the cross-entropy (the SLOT-Align reference
  code's ``LinearClassifier`` returns probabilities that ``nn.CrossEntropyLoss`` soft-maxes again).
"""

from __future__ import annotations

import numpy as np

from fedalign.errors import FedalignError


def default_init(d: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's ``nn.Linear`` initialisation, U(−1/√d, 1/√d), drawn from a numpy generator."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(d)
    return rng.uniform(-bound, bound, (n_classes, d)), rng.uniform(-bound, bound, n_classes)


def epochs_for(n: int, batch_size: int, epochs: int, min_steps: int = 0) -> int:
    """Epochs to run so that a client of n rows takes at least ``min_steps`` optimizer steps:
    max(epochs, ⌈min_steps / ⌈n / batch_size⌉⌉)."""
    per_epoch = max(1, -(-int(n) // int(batch_size)))
    return max(int(epochs), -(-int(min_steps) // per_epoch))


def train_softmax(X, y, n_classes: int, *, epochs: int, lr: float, batch_size: int,
                  optimizer: str = "sgd", momentum: float = 0.9, weight_decay: float = 1e-5,
                  softmax_before_ce: bool = False, seed: int = 0, init=None, logit_offset=None,
                  transport=None, taus=None, info: dict | None = None):
    """Minimise the cross-entropy of softmax(X Wᵀ + b) by mini-batch SGD or AdamW.

    Parameters
    ----------
    X : (n, d) features; y : (n,) labels in [0, C)
    softmax_before_ce : apply a softmax to the logits before the cross-entropy (which applies
        its own log-softmax), as the SLOT-Align reference code does. Off by default.
    init : optional (W (C, d), b (C,)) starting point; default :func:`default_init`.
    logit_offset : optional (C,) added to the logits in the loss only (−inf allowed for
        classes the client lacks); the returned head does not include it.
    transport : optional (A (d, d), b (d,)) frozen map; epoch e trains on
        X + τ_e (X Aᵀ + b − X), i.e. T_{τ_e}(X); requires ``taus`` of length ``epochs``.
    info : optional dict, filled with ``final_loss`` (the objective without weight decay at the
        returned parameters and the last epoch's τ, on all n rows), ``steps`` and ``epochs``.

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
                      weight_decay, softmax_before_ce, seed, init, logit_offset, transport, taus, info)
    finally:
        torch.set_num_threads(threads)


def _train(torch, X, y, n_classes, epochs, lr, batch_size, optimizer, momentum, weight_decay,
           softmax_before_ce, seed, init, logit_offset, transport, taus, info):
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    n, d = X.shape
    if n == 0:
        raise FedalignError("cannot train a head on zero samples")
    epochs = int(epochs)
    if transport is not None and (taus is None or len(taus) != epochs):
        raise FedalignError(f"a transport layer needs one τ per epoch ({epochs}), got "
                            f"{'none' if taus is None else len(taus)}")
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
    X0, yt = torch.from_numpy(X), torch.from_numpy(y)
    delta = None
    if transport is not None:
        A, t = (np.asarray(a, dtype=np.float64) for a in transport)
        delta = torch.from_numpy((X @ A.T + t - X).astype(np.float32))  # T_1(X) − X
    off = None if logit_offset is None else torch.tensor(np.asarray(logit_offset, np.float32))

    def loss_of(Xb, yb):
        logits = Xb @ W.T + b
        if off is not None:
            logits = logits + off
        if softmax_before_ce:
            logits = torch.softmax(logits, dim=1)
        return torch.nn.functional.cross_entropy(logits, yb)

    Xt, steps = X0, 0
    for e in range(epochs):
        if delta is not None:
            Xt = X0 + float(taus[e]) * delta
        order = torch.from_numpy(rng.permutation(n))
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = loss_of(Xt[idx], yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    if info is not None:
        with torch.no_grad():
            info.update(final_loss=float(loss_of(Xt, yt)), steps=steps, epochs=epochs)
    return W.detach().numpy().astype(np.float64), b.detach().numpy().astype(np.float64)

"""Training a linear softmax head (shared by ofedavg, fedpft and centralized).

Deterministic given the seed: the initialisation and the mini-batch order come from a numpy
generator; the training is numpy in float64 (the gradient written out, PyTorch's SGD and AdamW
step for step: :func:`train_softmax`).

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

    The loss of a batch B of m rows is L = (1/m) Σ_{i∈B} −log p_{i,y_i}, p_i = softmax(z_i),
    z_i = W x_i + b (+ o); its gradient is ∂L/∂z_i = (p_i − e_{y_i}) / m, so
    ∂L/∂W = Gᵀ X_B and ∂L/∂b = Gᵀ 1 with G the (m, C) matrix of those rows. The optimisers
    are PyTorch's, step for step: SGD with momentum μ and coupled weight decay λ
    (g = ∇L + λθ; v = g at the first step, v = μ v + g after; θ ← θ − lr v) and AdamW
    (θ ← (1 − lr λ) θ, then Adam with β = (0.9, 0.999), ε = 1e-8), on W and b alike.

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

    Notes
    -----
    numpy, float64, one BLAS thread (these heads are tiny: a thread pool only costs time on
    a shared machine). The gradient is written out rather than taken by autograd: the same
    maths as the torch (float32) trainer this replaces, 2–5× less time per step (d = 1280,
    C = 10, batch 64) and no torch import (~1.5 s of every ``evaluate``). A client with
    n ≤ ``batch_size`` rows takes one full-batch step per epoch (its shuffle would only
    reorder a sum, so none is drawn).
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _train(X, y, n_classes, epochs, lr, batch_size, optimizer, momentum, weight_decay,
                      softmax_before_ce, seed, init, logit_offset, transport, taus, info)


def _loss_grad(Xb, yb, Wb, off, softmax_before_ce, grad=True):
    """Mean cross-entropy of the rows ``Xb`` (m, d + 1; last column 1) under the augmented
    head ``Wb`` = [W b] (C, d + 1), and its gradient (C, d + 1) (module docstring)."""
    Z = Xb @ Wb.T
    if off is not None:
        Z += off
    m = len(yb)
    rows = np.arange(m)
    S = None
    if softmax_before_ce:  # z → s = softmax(z) → CE(s): the chain rule through the softmax
        Z -= Z.max(axis=1, keepdims=True)
        np.exp(Z, out=Z)
        Z /= Z.sum(axis=1, keepdims=True)
        S, Z = Z, Z.copy()
    Z -= Z.max(axis=1, keepdims=True)
    E = np.exp(Z)
    tot = E.sum(axis=1)
    loss = float(np.mean(np.log(tot) - Z[rows, yb]))
    if not grad:
        return loss, None
    G = E
    G /= tot[:, None]
    G[rows, yb] -= 1.0
    if S is not None:
        G = S * (G - np.einsum("ij,ij->i", G, S)[:, None])
    G /= m
    return loss, G.T @ Xb


def _train(X, y, n_classes, epochs, lr, batch_size, optimizer, momentum, weight_decay,
           softmax_before_ce, seed, init, logit_offset, transport, taus, info):
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    n, d = X.shape
    if n == 0:
        raise FedalignError("cannot train a head on zero samples")
    if optimizer not in ("sgd", "adamw"):
        raise FedalignError(f"optimizer must be sgd or adamw, got {optimizer!r}")
    epochs, batch_size = int(epochs), int(batch_size)
    if transport is not None and (taus is None or len(taus) != epochs):
        raise FedalignError(f"a transport layer needs one τ per epoch ({epochs}), got "
                            f"{'none' if taus is None else len(taus)}")
    rng = np.random.default_rng(seed)
    W0, b0 = init if init is not None else default_init(d, n_classes, int(rng.integers(2**31)))
    # the augmented head [W b] on rows [x 1]: one product per direction, one update
    Wb = np.empty((n_classes, d + 1))
    Wb[:, :d], Wb[:, d] = W0, b0
    X0 = np.empty((n, d + 1))
    X0[:, :d], X0[:, d] = X, 1.0
    delta = None
    if transport is not None:
        A, t = (np.asarray(a, dtype=np.float64) for a in transport)
        delta = X @ A.T + t - X  # T_1(X) − X
    off = None if logit_offset is None else np.asarray(logit_offset, np.float64)
    lr, momentum, weight_decay = float(lr), float(momentum), float(weight_decay)
    buf = exp_avg = exp_avg_sq = None
    if optimizer == "adamw":
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        exp_avg, exp_avg_sq = np.zeros_like(Wb), np.zeros_like(Wb)

    Xt, yt, steps = X0, y, 0
    for e in range(epochs):
        if delta is not None:
            Xt = X0.copy()
            Xt[:, :d] += float(taus[e]) * delta
        if n > batch_size:
            order = rng.permutation(n)
            Xe, ye = Xt[order], y[order]
        else:  # one full batch: the shuffle would only reorder its sum
            Xe, ye = Xt, y
        for start in range(0, n, batch_size):
            _, g = _loss_grad(Xe[start:start + batch_size], ye[start:start + batch_size], Wb, off,
                              softmax_before_ce)
            steps += 1
            if optimizer == "sgd":
                if weight_decay:
                    g += weight_decay * Wb
                if momentum:
                    if buf is None:
                        buf = g
                    else:
                        buf *= momentum
                        buf += g
                    g = buf
                Wb -= lr * g
            else:
                if weight_decay:
                    Wb *= 1.0 - lr * weight_decay
                exp_avg *= beta1
                exp_avg += (1.0 - beta1) * g
                exp_avg_sq *= beta2
                exp_avg_sq += (1.0 - beta2) * g * g
                bc1, bc2 = 1.0 - beta1 ** steps, 1.0 - beta2 ** steps
                Wb -= (lr / bc1) * exp_avg / (np.sqrt(exp_avg_sq) / np.sqrt(bc2) + eps)
    if info is not None:
        info.update(final_loss=_loss_grad(Xt, yt, Wb, off, softmax_before_ce, grad=False)[0],
                    steps=steps, epochs=epochs)
    return Wb[:, :d].copy(), Wb[:, d].copy()

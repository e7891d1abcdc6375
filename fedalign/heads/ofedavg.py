"""O-FedAvg: one-shot federated averaging of locally trained linear softmax heads.

Server → clients: a common initialisation (W₀, b₀). Client k trains a linear softmax head on
its data and sends (W_k, b_k, n_k) and its final training loss. Server: W = Σ_k ω_k W_k,
b = Σ_k ω_k b_k with ω_k = 1/K (``weighting="equal"``) or ω_k = n_k / N (``"samples"``). With
``rounds = R > 1`` this repeats R times, each round starting from the previous average.

Transport layer (``tau_schedule="cosine"``, SLOT-Align's main configuration): the client trains
on its *unaligned* features through its frozen SLOT-Align map (A_k, b_k) (τ = 1), epoch e on
T_{τ_e}(x) = (1 − τ_e) x + τ_e (A_k x + b_k), with the reference's reversed cosine schedule

    τ_e = s_{E−1−e},   s_j = τ_min + ½ (τ_max − τ_min) (1 + cos(π j / E)),   j = 0 … E−1

(:func:`cosine_schedule`: the first epoch is near τ_min, the last exactly τ_max). With R > 1
rounds the schedule runs over the rounds instead (length R) and τ stays fixed within a round.
The head is evaluated on test features mapped at τ_max. ``tau_schedule="fixed"`` trains on the
features as given (already aligned at τ by ``fedalign align``, like every other head).

Variants (``ofedavg.variant``):

- ``reference`` — the SLOT-Align reference code (``run_ofedavg.py`` with ``slotalign/
  federated.py``, ``models.py``, ``schedules.py``; ``--transport-mode scheduled
  --tau-schedule cosine_anneal --tau-min 0``): SGD lr 1e-3, momentum 0.9, weight decay 1e-5,
  batch 64, 10 local epochs, 1 round, equal client weights, softmax applied before the
  cross-entropy, the cosine transport schedule from τ_min = 0 to τ_max, evaluation at τ_max.
  Differences that remain, and why:

  1. Random streams: the reference seeds torch globally and shuffles with a torch generator
     seeded ``seed + round·K + k``; here every draw comes from a numpy generator per client
     (:func:`fedalign.heads.client_seed`). Same distributions (U(−1/√d, 1/√d) for W₀ and b₀ as
     ``nn.Linear``, uniform mini-batch order), other draws: the same seed must give the same
     files whatever torch version or device.
  2. The transport layer computes X + τ (X Aᵀ + b − X) with the difference precomputed once
     per client (float64); the reference forms ((1−τ) I + τ A) in float32 and multiplies every
     batch. Equal up to float32 rounding (~1e-7 relative), d² fewer flops per batch.
  3. The loss reported is the objective at the final parameters on all the client's rows; the
     reference logs the mean of its batch losses over all local epochs (a lagging average).
  4. Classes: the reference's ``C`` is the dataset's class count; here the shared class list of
     the client files (the same thing when every class exists somewhere).
  5. Arithmetic: the head trains in float64 numpy with the gradient written out
     (:func:`fedalign.heads.linear.train_softmax`), the reference in float32 torch autograd;
     the same SGD step for step, equal up to float32 rounding.

- ``fedalign`` (default) — the robust choice: SGD lr 0.01, momentum 0.9, weight decay 1e-5,
  batch 64, 100 epochs and at least ``min_steps = 300`` optimizer steps per client (so a client
  of 20 rows is trained as far as one of 2,000: the budget converges on the client sizes a
  Dirichlet split produces; the final training loss is reported), a *logit-adjusted* local
  loss (``logit_adjust``: CE(softmax(xWᵀ + b + log π_k), y) with π_k the client's class
  prior, so each local head is free of its client's label skew and the average scores
  classes under a uniform prior), sample-weighted averaging, plain cross-entropy, features
  aligned beforehand (``tau_schedule = fixed``).

McMahan et al., "Communication-efficient learning of deep networks from decentralized data",
AISTATS 2017 (one round); Menon et al., "Long-tail learning via logit adjustment", ICLR 2021.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError
from fedalign.heads import LinearHead
from fedalign.heads.linear import default_init, epochs_for, train_softmax

MESSAGE_KEYS = ("W", "b", "n", "loss")
TRANSPORT = True


@dataclass
class Config:
    variant: str = "fedalign"
    epochs: int = 100
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    batch_size: int = 64
    weighting: str = "samples"
    softmax_before_ce: bool = False
    logit_adjust: bool = True
    min_steps: int = 300
    rounds: int = 1
    tau_schedule: str = "fixed"
    tau_min: float = 0.0
    tau_max: float = -1.0  # −1: the τ the test files are mapped with (set by evaluate)

    VARIANTS = {
        "fedalign": {},
        "reference": dict(epochs=10, lr=1e-3, momentum=0.9, weight_decay=1e-5, batch_size=64,
                          weighting="equal", softmax_before_ce=True, logit_adjust=False,
                          min_steps=0, rounds=1, tau_schedule="cosine", tau_min=0.0),
    }

    def validate(self):
        if self.weighting not in ("equal", "samples"):
            raise FedalignError(f"ofedavg.weighting must be equal or samples, got {self.weighting!r}")
        if self.tau_schedule not in ("fixed", "cosine"):
            raise FedalignError(f"ofedavg.tau_schedule must be fixed or cosine, got {self.tau_schedule!r}")
        if not 0.0 <= self.tau_min <= 1.0:
            raise FedalignError(f"ofedavg.tau_min must be in [0, 1], got {self.tau_min}")
        if not (self.tau_max == -1.0 or 0.0 <= self.tau_max <= 1.0):
            raise FedalignError(f"ofedavg.tau_max must be in [0, 1], got {self.tau_max}")
        if self.epochs < 1 and self.min_steps < 1:
            raise FedalignError("ofedavg: epochs or min_steps must be ≥ 1")


def cosine_schedule(steps: int, tau_min: float, tau_max: float) -> list:
    """The reference's reversed ``cosine_anneal`` schedule: ``steps`` values, last = τ_max.

    s_j = τ_min + ½ (τ_max − τ_min)(1 + cos(π j / steps)) for j = 0 … steps−1, reversed.
    """
    if steps < 1:
        raise FedalignError("a τ schedule needs at least one step")
    vals = [tau_min + 0.5 * (tau_max - tau_min) * (1.0 + math.cos(math.pi * j / steps))
            for j in range(steps)]
    return vals[::-1]


def server_init(d: int, n_classes: int, config: Config, seed: int) -> dict:
    """The common starting point broadcast to every client."""
    W0, b0 = default_init(d, n_classes, seed)
    return {"W": W0, "b": b0, "round": 0}


def next_init(head: LinearHead, r: int) -> dict:
    """Broadcast of round r: the previous round's average."""
    return {"W": head.W, "b": head.b, "round": r}


def epoch_taus(config: Config, epochs: int, r: int = 0) -> list:
    """τ of each local epoch of round r for a client with a transport layer."""
    if config.tau_max < 0:
        raise FedalignError("ofedavg: a transport layer needs ofedavg.tau_max (the evaluation τ)")
    if config.tau_schedule == "fixed":
        return [config.tau_max] * epochs
    if config.rounds == 1:
        return cosine_schedule(epochs, config.tau_min, config.tau_max)
    return [cosine_schedule(config.rounds, config.tau_min, config.tau_max)[r]] * epochs


def client_update(X, y, n_classes: int, config: Config, seed: int, init=None, transport=None) -> dict:
    """Train locally; the message is the head, the sample count and the final training loss."""
    start = (init["W"], init["b"]) if init is not None else None
    r = int(init.get("round", 0)) if init is not None else 0
    y = np.asarray(y)
    epochs = epochs_for(len(y), config.batch_size, config.epochs, config.min_steps)
    taus = None if transport is None else epoch_taus(config, epochs, r)
    offset = None
    if config.logit_adjust:
        counts = np.bincount(y, minlength=n_classes).astype(np.float64)
        with np.errstate(divide="ignore"):
            offset = np.log(counts / counts.sum())  # −inf for classes the client lacks
    info: dict = {}
    W, b = train_softmax(X, y, n_classes, epochs=epochs, lr=config.lr,
                         batch_size=config.batch_size, momentum=config.momentum,
                         weight_decay=config.weight_decay,
                         softmax_before_ce=config.softmax_before_ce, seed=seed, init=start,
                         logit_offset=offset, transport=transport, taus=taus, info=info)
    return {"W": W, "b": b, "n": np.int64(len(y)), "loss": np.float64(info["final_loss"])}


def server_aggregate(messages, n_classes: int, config: Config, seed: int = 0) -> LinearHead:
    """Average the client heads once; ``info`` holds the sample-weighted final training loss."""
    n = np.array([float(m["n"]) for m in messages])
    w = n / n.sum() if config.weighting == "samples" else np.full(len(n), 1.0 / len(n))
    W = sum(wk * m["W"] for wk, m in zip(w, messages))
    b = sum(wk * m["b"] for wk, m in zip(w, messages))
    losses = [float(m["loss"]) for m in messages]
    info = dict(train_loss=float(np.average(losses, weights=n)), client_losses=losses)
    return LinearHead(np.asarray(W, float), np.asarray(b, float), info)

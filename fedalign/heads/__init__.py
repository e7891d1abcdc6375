"""One-shot federated heads: what each client sends, and what the server builds from it.

Every method is a module with

- ``MESSAGE_KEYS``: the names of the arrays a client message may contain (what leaves a client);
- ``Config``: a dataclass of the method's options (``--param METHOD.KEY=VALUE`` in the CLI);
- ``client_update(X, y, n_classes, config, seed, init=None) -> dict``: runs on a client, on its
  private features X (n, d) and labels y (n,), and returns the message (a dict of numpy arrays);
- ``server_aggregate(messages, n_classes, config, seed) -> LinearHead``: runs on the server and
  sees ONLY the messages;
- optionally ``server_init(d, n_classes, config, seed) -> dict``: a broadcast the server sends
  to every client before training (O-FedAvg's common initialisation).

=============  ==============================================================  ==============
method         message (per client)                                             reference
=============  ==============================================================  ==============
ofedavg        a locally trained linear softmax head (W, b) and n               McMahan 2017
fedcgs         class counts/sums, Σx, Σxxᵀ → LDA head from global statistics      FedCGS
fedpft         per-class GMM parameters in float16 → synthetic features         Beitollahi 2024
fed3r          XᵀX and XᵀY → closed-form ridge classifier                        Fanì 2024
centralized    raw features and labels (the pooled-data upper reference)        —
=============  ==============================================================  ==============

:func:`run_method` runs a method end to end on a list of clients.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

import numpy as np

from fedalign.errors import FedalignError


@dataclass
class LinearHead:
    """Linear classifier: scores = X Wᵀ + b. W (C, d) float64, b (C,) float64 (−inf: never)."""

    W: np.ndarray
    b: np.ndarray

    def scores(self, X: np.ndarray) -> np.ndarray:
        """(n, C) class scores."""
        return np.asarray(X, dtype=np.float64) @ self.W.T + self.b

    def predict(self, X: np.ndarray) -> np.ndarray:
        """(n,) predicted class indices."""
        return np.argmax(self.scores(X), axis=1)

    def accuracy(self, X: np.ndarray, y: np.ndarray) -> float:
        """Fraction of labeled rows (y ≥ 0) predicted correctly."""
        keep = np.asarray(y) >= 0
        if not np.any(keep):
            raise FedalignError("no labeled rows to evaluate")
        return float(np.mean(self.predict(np.asarray(X)[keep]) == np.asarray(y)[keep]))


@dataclass(frozen=True)
class Method:
    """A registered method: its module and the preset options it starts from."""

    name: str
    module: str
    preset: dict = dataclasses.field(default_factory=dict)
    description: str = ""

    def load(self):
        return importlib.import_module(f"fedalign.heads.{self.module}")

    def config(self, params: dict | None = None):
        """The method's Config with the preset, then ``params`` (strings are converted)."""
        return make_config(self.load().Config, {**self.preset, **(params or {})}, self.name)


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("ofedavg", "ofedavg", {}, "one-shot FedAvg of local linear softmax heads"),
        Method("fedcgs", "fedcgs", {}, "LDA head from exact global statistics"),
        Method("fedpft", "fedpft", {"preset": "k10-diag"},
               "per-class GMMs (K=10 diag, fp16) → synthetic features → SGD head"),
        Method("fedpft-k1", "fedpft", {"preset": "k1-spherical"},
               "per-class GMMs (K=1 spherical, fp16) → synthetic features → AdamW head"),
        Method("fed3r", "fed3r", {}, "closed-form ridge classifier from XᵀX, XᵀY"),
        Method("centralized", "centralized", {}, "linear head on the pooled raw data (upper reference)"),
    ]
}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise FedalignError(f"unknown method {name!r} (choose from {', '.join(METHODS)})") from None


def make_config(cls, params: dict, name: str = ""):
    """Build a Config dataclass from a dict, converting strings to the fields' default types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for key, value in params.items():
        if key not in fields:
            raise FedalignError(
                f"{name or cls.__module__}: unknown option {key!r} (options: {', '.join(fields)})"
            )
        default = fields[key].default
        kw[key] = _convert(value, default, f"{name}.{key}")
        _check_bounds(kw[key], key, f"{name or cls.__module__}.{key}")
    cfg = cls(**kw)
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


#: Ranges of the numeric options common to the heads (checked on the values a user gives):
#: (lower bound, whether the bound itself is allowed).
OPTION_BOUNDS = {
    "epochs": (0, True), "batch_size": (1, True), "lr": (0, False), "momentum": (0, True),
    "weight_decay": (0, True), "components": (1, True), "gmm_max_iter": (1, True),
    "min_per_component": (0, True), "lam": (0, False), "ridge": (0, True),
}


def _check_bounds(value, key, label):
    if key not in OPTION_BOUNDS or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    lo, closed = OPTION_BOUNDS[key]
    if not (value >= lo if closed else value > lo):
        raise FedalignError(f"{label} must be {'≥' if closed else '>'} {lo}, got {value}")


def _convert(value, default, label):
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    try:
        if isinstance(default, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        return type(default)(value)
    except ValueError:
        raise FedalignError(f"{label}: cannot read {value!r} as {type(default).__name__}") from None


def client_seed(seed: int, k: int) -> int:
    """Independent, reproducible seed of client k for run seed ``seed``."""
    return int(np.random.SeedSequence([int(seed), int(k)]).generate_state(1)[0])


def run_method(method: str | Method, clients, n_classes: int, seed: int = 0, params: dict | None = None):
    """Run a method: every client computes its message, the server builds the head.

    Parameters
    ----------
    clients : list of (X (n_k, d), y (n_k,)) pairs
    n_classes : C, the size of the shared label space

    Returns
    -------
    head : :class:`LinearHead`
    messages : list of dict (exactly what left each client)
    """
    m = get_method(method) if isinstance(method, str) else method
    mod, cfg = m.load(), m.config(params)
    d = np.asarray(clients[0][0]).shape[1]
    init = mod.server_init(d, n_classes, cfg, seed) if hasattr(mod, "server_init") else None
    messages = []
    for k, (X, y) in enumerate(clients):
        msg = mod.client_update(np.asarray(X), np.asarray(y), n_classes, cfg, client_seed(seed, k), init=init)
        extra = set(msg) - set(mod.MESSAGE_KEYS)
        if extra:  # a programming error, not bad input
            raise RuntimeError(f"{m.name}: message has undeclared keys {sorted(extra)}")
        messages.append(msg)
    return mod.server_aggregate(messages, n_classes, cfg, seed), messages

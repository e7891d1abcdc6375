"""One-shot federated heads: what each client sends, and what the server builds from it.

Every method is a module with

- ``MESSAGE_KEYS``: the names of the arrays a client message contains (what leaves a client);
  optionally ``OPTIONAL_MESSAGE_KEYS``, arrays only some messages carry (a DP message's
  clipped fraction);
- ``Config``: a dataclass of the method's options (``--param METHOD.KEY=VALUE`` in the CLI);
- ``client_update(X, y, n_classes, config, seed, init=None) -> dict``: runs on a client, on its
  private features X (n, d) and labels y (n,), and returns the message (a dict of numpy arrays);
- ``server_aggregate(messages, n_classes, config, seed) -> LinearHead``: runs on the server and
  sees ONLY the messages;
- optionally ``server_init(d, n_classes, config, seed) -> dict``: a broadcast the server sends
  to every client before training (O-FedAvg's common initialisation);
- optionally ``TRANSPORT = True``: ``client_update`` accepts ``transport=(A (d, d), b (d,))``,
  the client's frozen SLOT-Align map (τ = 1), and trains through it (O-FedAvg's τ schedule);
- optionally ``next_init(head, round) -> dict``: the broadcast of the next round when
  ``config.rounds > 1`` (O-FedAvg).

Variants: a head whose ``Config`` has a ``variant`` field declares ``VARIANTS = {name:
{option: value}}`` on the Config class. ``variant=reference`` reproduces that head's reference
implementation (the remaining differences are listed in the head's docstring);
``variant=fedalign`` (the default) is this package's robust choice. A variant only supplies
defaults: options given explicitly (``--param HEAD.KEY=VALUE``) win.

=============  ==============================================================  ==============
method         message (per client)                                             reference
=============  ==============================================================  ==============
ofedavg        a locally trained linear softmax head (W, b), n, final loss       McMahan 2017
fedcgs         class counts/sums, Σx, Σxxᵀ → LDA head from global statistics      FedCGS
fedpft         per-class GMM parameters in float16 → synthetic features         Beitollahi 2024
fed3r          XᵀX and XᵀY → closed-form ridge classifier                        Fanì 2024
centralized    raw features and labels (the pooled-data upper reference)        —
=============  ==============================================================  ==============

Differential privacy: the heads whose messages are sums (fedcgs, fed3r) take ``dp_epsilon``,
``dp_delta``, ``clip`` and ``dp_mechanism`` (off by default): each client clips its rows and
adds Gaussian noise to its message (:mod:`fedalign.dp`), the server post-processes, and
``head.info["dp"]`` records the release.

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
    """Linear classifier: scores = X Wᵀ + b. W (C, d) float64, b (C,) float64 (−inf: never).

    ``info`` holds what the server noticed while building the head (e.g. O-FedAvg's final
    training loss, FedPFT's unfitted classes); it never holds client data. ``notes``: what the
    server has to say about the head, one line each (FedPFT: ``client 0 class 3: a single
    sample, no GMM fitted (count sent)``), returned with it (no module keeps them).
    """

    W: np.ndarray
    b: np.ndarray
    info: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)

    def scores(self, X: np.ndarray) -> np.ndarray:
        """(n, C) class scores."""
        return np.asarray(X, dtype=np.float64) @ self.W.T + self.b

    def predict(self, X: np.ndarray) -> np.ndarray:
        """(n,) predicted class indices."""
        return np.argmax(self.scores(X), axis=1)

    def accuracy(self, X: np.ndarray, y: np.ndarray) -> float:
        """Fraction of labeled rows (y ≥ 0) predicted correctly (:func:`fedalign.metrics.accuracy`;
        no labeled row: :class:`FedalignError`)."""
        from fedalign.metrics import accuracy

        return accuracy(self.predict, X, y)


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
    """Build a Config dataclass from a dict, converting strings to the fields' default types.

    When ``cls`` declares ``VARIANTS``, the chosen variant's options (``params["variant"]``, or
    the field's default) fill in every option that ``params`` does not give.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    variants = getattr(cls, "VARIANTS", None)
    if variants is not None and "variant" in fields:
        v = str(params.get("variant", fields["variant"].default)).strip()
        if v not in variants:
            only = "" if "reference" in variants else " (this head has no reference implementation)"
            raise FedalignError(f"{name or cls.__module__}.variant must be one of "
                                f"{', '.join(variants)}, got {v!r}{only}")
        params = {**variants[v], **params, "variant": v}
    kw = {}
    for key, value in params.items():
        if key not in fields:
            raise FedalignError(
                f"{name or cls.__module__}: unknown option {key!r} (options: {', '.join(fields)})"
            )
        default = fields[key].default
        kw[key] = _convert(value, default, f"{name or cls.__module__}.{key}")
        _check_finite(kw[key], default, f"{name or cls.__module__}.{key}")
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
    "min_per_component": (0, True), "lam": (0, False), "ridge": (0, True), "min_steps": (0, True),
    "rounds": (1, True), "gmm_tol": (0, False),
}


def _check_finite(value, default, label):
    """A float option follows :func:`fedalign.grammar.check_number` (finite; 0 or a magnitude
    in [1e-150, 1e150]: ``fedpft.lr=1e308`` trained a head of NaN weights and reported its
    accuracy) — unless it is the option's own default (``dp_epsilon=inf``: no DP)."""
    from fedalign.grammar import check_number

    if isinstance(value, float) and value != default:
        check_number(value, label)


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
            from fedalign.grammar import BOOL_WORDS

            if value.lower() not in BOOL_WORDS:
                raise ValueError(value)
            return BOOL_WORDS[value.lower()]
        return type(default)(value)
    except ValueError:
        raise FedalignError(f"{label}: cannot read {value!r} as {type(default).__name__}") from None


def message_keys(mod) -> tuple:
    """Every key a client message of the head module ``mod`` may carry: ``MESSAGE_KEYS``, then
    ``OPTIONAL_MESSAGE_KEYS`` (those only some messages carry, e.g. a DP message's)."""
    return tuple(mod.MESSAGE_KEYS) + tuple(getattr(mod, "OPTIONAL_MESSAGE_KEYS", ()))


def check_labels(y, n_classes: int) -> np.ndarray:
    """A client's labels as int64, refused unless every one is a class in [0, C): an unlabeled
    row (−1) would be counted in FedCGS's Σx but no class, or one-hot encoded as the last class
    (Fed3R, O-FedAvg), silently. Callers drop unlabeled rows first."""
    y = np.asarray(y)
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= n_classes):
        bad = y[(y < 0) | (y >= n_classes)] if np.issubdtype(y.dtype, np.number) else y
        raise FedalignError(f"a client's labels must be classes 0…{n_classes - 1}, got "
                            f"{bad.flat[0] if bad.size else y.dtype} (drop unlabeled rows, "
                            "label −1, before training a head)")
    return y.astype(np.int64)


def client_seed(seed: int, k: int) -> int:
    """Independent, reproducible seed of client k for run seed ``seed``."""
    return int(np.random.SeedSequence([int(seed), int(k)]).generate_state(1)[0])


def round_seed(seed: int, k: int, r: int) -> int:
    """Seed of client k in round r (round 0: :func:`client_seed`)."""
    if r == 0:
        return client_seed(seed, k)
    return int(np.random.SeedSequence([int(seed), int(k), int(r)]).generate_state(1)[0])


def client_message(mod, name: str, X, y, n_classes: int, cfg, seed: int, k: int, r: int,
                   init=None, **extra) -> dict:
    """Client k's message of round r from head module ``mod``: ``client_update`` on its
    checked labels with :func:`round_seed`; a key the module does not declare
    (:func:`message_keys`) is a programming error. One round of :func:`run_method`'s loop,
    also what a relayed (Flower) client sends."""
    msg = mod.client_update(np.asarray(X), check_labels(y, n_classes), n_classes, cfg,
                            round_seed(seed, k, r), init=init, **extra)
    undeclared = set(msg) - set(message_keys(mod))
    if undeclared:  # a programming error, not bad input
        raise RuntimeError(f"{name}: message has undeclared keys {sorted(undeclared)}")
    return msg


def run_method(method: str | Method, clients, n_classes: int, seed: int = 0, params: dict | None = None,
               transports=None, config=None):
    """Run a method: every client computes its message, the server builds the head.

    Parameters
    ----------
    clients : list of (X (n_k, d), y (n_k,)) pairs
    n_classes : C, the size of the shared label space
    transports : optional list of (A (d, d), b (d,)), client k's frozen SLOT-Align map (τ = 1),
        for heads with a transport layer (``TRANSPORT = True``: O-FedAvg's τ schedule);
        ``clients`` then hold the *unaligned* features
    config : an already built Config (instead of ``params``)

    With ``config.rounds = R > 1`` (O-FedAvg) the clients train R times, each round from the
    server's previous aggregate; the messages returned are those of the last round.

    Returns
    -------
    head : :class:`LinearHead`
    messages : list of dict (exactly what left each client in the last round)
    """
    m = get_method(method) if isinstance(method, str) else method
    mod = m.load()
    cfg = config if config is not None else m.config(params)
    d = np.asarray(clients[0][0]).shape[1]
    if transports is not None:
        if not getattr(mod, "TRANSPORT", False):
            raise FedalignError(f"{m.name} trains on (pre-aligned) features and has no transport layer; "
                                "client maps are for ofedavg.tau_schedule=cosine")
        if len(transports) != len(clients):
            raise FedalignError(f"{len(transports)} client maps for {len(clients)} clients")
    rounds = int(getattr(cfg, "rounds", 1))
    init = mod.server_init(d, n_classes, cfg, seed) if hasattr(mod, "server_init") else None
    history = []
    for r in range(rounds):
        messages = []
        for k, (X, y) in enumerate(clients):
            extra = {} if transports is None else {"transport": transports[k]}
            messages.append(client_message(mod, m.name, X, y, n_classes, cfg, seed, k, r, init,
                                           **extra))
        head = mod.server_aggregate(messages, n_classes, cfg, seed)
        if rounds > 1:
            history.append(dict(head.info))
            if r + 1 < rounds:
                init = mod.next_init(head, r + 1)
    if rounds > 1:
        head.info["rounds"] = history
    return head, messages

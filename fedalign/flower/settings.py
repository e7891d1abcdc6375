"""The run config of the ServerApp (``[tool.flwr.app.config]``, ``flwr run --run-config``).

:class:`Settings` holds one field per key (``min-clients`` is ``min_clients``), with the
command line's defaults (:mod:`fedalign.defaults`: ``tau``, ``n-atoms``, ``local-steps``).
Text is read with the command line's grammar (:mod:`fedalign.grammar`), so a value means what
it means after the matching flag: a yes/no key takes the words of
:func:`~fedalign.grammar.parse_bool` (any other word is an error, never False), ``shrinkage``
those of :func:`~fedalign.grammar.parse_shrinkage`, ``seeds`` / ``eval-seeds`` those of
:func:`~fedalign.grammar.parse_seeds` and ``params`` those of
:func:`~fedalign.grammar.parse_params`. Every error is one :class:`FedalignError` naming the
key (``run config fresh: expected true or false …``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedalign.flower import _lib as lib

#: ``premap`` values: off, or every source onto the target's completed Gaussian
PREMAP = ("", "target")


@dataclass
class Settings:
    """The run config (``[tool.flwr.app.config]``, ``flwr run --run-config``); keys are these
    names with ``-`` for ``_``."""

    method: str = "slot"             # slot | defed
    out: str = ""                    # the server's output folder (absolute path)
    min_clients: int = 2             # go on while at least this many clients remain
    clients: int = 0                 # wait for this many nodes (0: min-clients)
    wait: float = 120.0              # seconds to wait for them
    timeout: float = 600.0           # seconds per exchange before a node counts as dropped
    poll: float = 0.2                # seconds between polls for replies
    # SLOT-Align
    tau: float = lib.TAU             # fedalign.defaults.TAU (the command line's --tau)
    heads: str = "fedcgs,fedpft,fed3r,ofedavg"
    seeds: str = "0"
    params: str = ""                 # METHOD.KEY=VALUE … (as fedalign evaluate --param)
    weights: str = "samples"
    tol: float = 1e-10
    max_iter: int = 100
    shrinkage: str = "auto"          # auto | none | a number in [0, 1] (as fedalign stats)
    fedavg_rounds: int = 100         # rounds of the FedAvg comparison in the communication record
    # DeFed-GMM-DaDiL
    strategy: str = "aggregation"
    federation: str = ""             # name of the federation (node folder); default: strategy
    rounds: int = 4                  # rounds done when the run ends (resumes count on)
    local_steps: int = lib.LOCAL_STEPS  # fedalign.defaults.LOCAL_STEPS (dadil-round's)
    n_atoms: int = lib.N_ATOMS       # fedalign.defaults.N_ATOMS
    n_components: int = 0            # components per atom (0: the GMM's)
    dadil_seed: int = 0
    preset: str = "fedalign"
    fresh: bool = False              # start over even where states exist
    eval_seeds: str = "0"
    # DeFed-GMM-DaDiL's first half as exchanges (fedalign.flower.premap): "" (off: each node's
    # gmm=) or "target" (every source mapped onto the target's completed Gaussian at τ = 1)
    premap: str = ""
    target: str = ""                 # premap: the target's client id
    gmm_k: int = 5                   # premap: components per class (fit-gmm -k)
    gmm_seed: int = 0                # premap: EM seed of every node's GMM (fit-gmm --seed)

    @classmethod
    def from_run_config(cls, cfg) -> "Settings":
        """The settings of a run config mapping; an unknown key, a value that does not read
        as its field's type or word, or a missing ``out`` → FedalignError."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw = {}
        for key, value in dict(cfg or {}).items():
            name = str(key).replace("-", "_")
            if name not in fields:
                raise lib.FedalignError(f"unknown run config key {key!r} (keys: "
                                        f"{', '.join(k.replace('_', '-') for k in fields)})")
            kw[name] = _read(name, key, value, fields[name].default)
        s = cls(**kw)
        if s.method not in ("slot", "defed"):
            raise lib.FedalignError(f"run config method must be slot or defed, got {s.method!r}")
        if not s.out:
            raise lib.FedalignError("run config out='FOLDER' (the server's output folder) is not set")
        if s.min_clients < 1:
            raise lib.FedalignError(f"min-clients must be ≥ 1, got {s.min_clients}")
        for key in ("dadil-seed", "gmm-seed"):   # as the command line's --seed: [0, MAX_SEED]
            lib.check_seed(getattr(s, key.replace("-", "_")), f"run config {key}")
        s._check_premap()
        return s

    def _check_premap(self) -> None:
        """``premap`` is "" or "target"; "target" needs ``target`` (a client id) and
        ``gmm-k`` ≥ 1 (``gmm-seed``: :meth:`from_run_config`)."""
        if self.premap not in PREMAP:
            raise lib.FedalignError(f"run config premap must be '' (off) or 'target', got "
                                    f"{self.premap!r}")
        if self.premap and not self.target:
            raise lib.FedalignError("run config premap='target' needs target='CLIENT' (the "
                                    "target's client id)")
        if self.target:
            try:
                lib.check_client_id(self.target)
            except lib.FedalignError as e:
                raise lib.FedalignError(f"run config target: {e}") from None
        if self.gmm_k < 1:
            raise lib.FedalignError(f"run config gmm-k must be ≥ 1, got {self.gmm_k}")

    @property
    def federation_name(self) -> str:
        return self.federation or self.strategy

    @staticmethod
    def seed_list(text: str, key: str = "seeds") -> list:
        """The run config's seeds: integers separated by commas or spaces, ``a-b`` for a range
        (``"0-2"``, ``"0, 3"``): the command line's grammar (:func:`fedalign.grammar.parse_seeds`),
        checked by :func:`fedalign.evaluate.check_seeds`."""
        return lib.check_seeds(lib.parse_seeds([text], flag=f"run config {key}"))

    def head_params(self, methods) -> dict:
        """The run config's ``params``: space-separated ``METHOD.KEY=VALUE`` (values stay text,
        as the heads read them; :func:`fedalign.grammar.parse_params`) → checked by
        :func:`fedalign.evaluate.check_params`."""
        return lib.check_params(lib.parse_params(str(self.params).split(),
                                                 flag="run config params"), methods)


def _read(name: str, key, value, default):
    """One run config value as its field holds it (``key`` as written, for the error)."""
    flag = f"run config {key}"
    if isinstance(default, bool):  # the command line's one rule: no other word
        return lib.parse_bool(value, flag)
    try:
        text = type(default)(value)
    except (TypeError, ValueError):
        raise lib.FedalignError(f"{flag}: cannot read {value!r} as "
                                f"{type(default).__name__}") from None
    if name == "shrinkage":
        return _shrinkage(text, flag)
    return text


def _shrinkage(text: str, flag: str) -> str:
    """``shrinkage`` read as ``fedalign stats --shrinkage`` reads it
    (:func:`fedalign.grammar.parse_shrinkage`: ``auto``, ``none`` in any case, or a number in
    [0, 1]); a word travels to the nodes as the word, a number as the text it was given."""
    value = lib.parse_shrinkage(text, flag)
    return value if isinstance(value, str) else text

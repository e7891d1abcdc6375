"""A DeFed-GMM-DaDiL client's state and the files it reads and writes.

Every client ℓ keeps a private copy of the dictionary (atoms P_1..P_A, labeled diagonal GMMs
with K uniform-weight components) and its own barycentric weights α_ℓ ∈ Δ_A; only atoms
travel (:mod:`fedalign.dadil.gossip`).

Files (:mod:`fedalign.files`)
    ``state`` (private): atoms, α, variance floor, RNG state, round, the per-round history
    (peers, losses, α after every step, step sizes), for the target the received dictionary;
    meta: client id, GMM path and SHA-256, settings. ``atoms`` (published): means, variances,
    label logits, round; meta: producer (the client id) — nothing else: no α, no GMM, no
    sample. The round-0 atoms of the fedalign preset are drawn around the client's data mean
    and spread (per dimension), which they therefore reveal, as a SLOT-Align stats message does.

Initialisation (Algorithm 1: "initializations vary across clients"): every client draws its
own atoms from ``SeedSequence(seed, spawn_key=(crc32(client), 1))`` (:func:`init_client`), so
the consensus M_ij(t) starts high and falls as gossip brings the dictionaries together.
``shared_init`` restores the former common start (all clients from the federation seed alone).
Peers are drawn with the client's own generator :func:`client_rng`, serialised in the state
(:func:`rng_to_array`).

References
----------
E. F. Montesuma, R. Castellon, F. M. N. Mboula, A. Mayoue, A. Souloumiac, C. Gouy-Pailler,
"Decentralized Federated Dataset Dictionary Learning for Multi-Source Domain Adaptation",
ICASSP 2025 (DeFed-GMM-DaDiL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign import defaults
from fedalign.dadil.atoms import Atoms, data_moments, init_atoms
from fedalign.dadil.barycenter import atoms_barycenter, check_simplex
from fedalign.dadil.optim import (Optim, check_settings,  # noqa: F401 (re-exported)
                                  client_settings)
from fedalign.dadil.rng import (check_rng_words, client_init_seed, client_rng,  # noqa: F401
                                rng_from_array, rng_to_array)
from fedalign.errors import FedalignError, spell
from fedalign.files import read_npz, write_npz
from fedalign.gmm import check_n_classes, floor_from_variance

_CLIENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


# --------------------------------------------------------------------------------------------
# Client ids (their generators: fedalign.dadil.rng)
# --------------------------------------------------------------------------------------------


def check_client_id(client: str) -> str:
    """Client ids are short names (letters, digits, ``_ . -``): they go into files and tables."""
    if not isinstance(client, str) or not _CLIENT_RE.match(client):
        raise FedalignError(f"invalid client id {client!r} (letters, digits, '_', '.', '-')")
    return client


# --------------------------------------------------------------------------------------------
# Published atoms and private state
# --------------------------------------------------------------------------------------------


@dataclass
class PublishedAtoms:
    """What a client publishes after a round: its atoms, the round and its id — nothing else.

    Attributes
    ----------
    means, variances : (A, K, d) float64
    label_logits : (A, K, C) float64 (labels are their softmax)
    round : int
    producer : str, the publishing client's id
    """

    means: np.ndarray
    variances: np.ndarray
    label_logits: np.ndarray
    round: int
    producer: str

    @property
    def shape(self) -> tuple:
        """(A, K, d, C)."""
        return (*self.means.shape, self.label_logits.shape[2])


@dataclass
class ClientState:
    """A client's private state between rounds (never published).

    Attributes
    ----------
    client : str
    means, variances : (A, K, d) float64; label_logits : (A, K, C) float64
    alpha : (A,) barycentric weights in the simplex
    round : int, rounds done (0 after ``--init``)
    rng : numpy Generator (PCG64), the client's own
    var_floor : (d,) variance floor of its atoms (from its own data, fixed at ``--init``)
    history : list of per-round records (strategy, peers, their rounds, local losses, α after
        every step, step sizes); optimiser state is not kept: it restarts every round
    gmm_path, gmm_sha256 : the client's GMM file and its hash (checked every round)
    settings : dict (:func:`client_settings` plus seed, n_atoms, n_components, n_classes,
        shared_init, role)
    received : (means, variances, label_logits) the unlabeled target received in its last
        communication (before its own local steps), or None; with ``alpha_received``, α
        re-fitted on them, they define its classifier (:func:`client_barycenter`)
    """

    client: str
    means: np.ndarray
    variances: np.ndarray
    label_logits: np.ndarray
    alpha: np.ndarray
    round: int
    rng: np.random.Generator
    var_floor: np.ndarray = None
    history: list = field(default_factory=list)
    gmm_path: str = ""
    gmm_sha256: str = ""
    settings: dict = field(default_factory=dict)
    received: tuple | None = None
    alpha_received: np.ndarray | None = None

    @property
    def shape(self) -> tuple:
        """(A, K, d, C)."""
        return (*self.means.shape, self.label_logits.shape[2])

    def published(self) -> PublishedAtoms:
        """The atoms file content for the current round."""
        return PublishedAtoms(self.means.copy(), self.variances.copy(), self.label_logits.copy(),
                              int(self.round), self.client)


def save_atoms(path, pa: PublishedAtoms) -> Path:
    """Write a published ``atoms`` file: exactly means, variances, label_logits, round, producer."""
    return write_npz(path, "atoms",
                     dict(means=np.asarray(pa.means, np.float64),
                          variances=np.asarray(pa.variances, np.float64),
                          label_logits=np.asarray(pa.label_logits, np.float64),
                          round=np.int64(pa.round)),
                     {"producer": pa.producer})


def load_atoms(path) -> PublishedAtoms:
    """Read and validate an ``atoms`` file (positive variances, a producer id)."""
    a, meta = read_npz(path, "atoms")
    extra = sorted(set(a) - {"means", "variances", "label_logits", "round"})
    if extra:  # privacy must not rest on the writer alone: an atoms file holds atoms only
        raise FedalignError(f"{path}: atoms file holds unknown arrays ({', '.join(extra)}); "
                            "a published atoms file holds only means, variances, label_logits, "
                            "round")
    producer = meta.get("producer")
    if not isinstance(producer, str) or not _CLIENT_RE.match(producer):
        raise FedalignError(f"{path}: atoms file without a valid producer id")
    if np.any(a["variances"] <= 0):
        raise FedalignError(f"{path}: atoms variances must be > 0")
    if int(a["round"]) < 0:
        raise FedalignError(f"{path}: atoms round must be ≥ 0, got {int(a['round'])}")
    return PublishedAtoms(a["means"].astype(np.float64), a["variances"].astype(np.float64),
                          a["label_logits"].astype(np.float64), int(a["round"]), producer)


def save_state(path, st: ClientState, published: dict | None = None) -> Path:
    """Write a private ``state`` file (atoms, α, floor, RNG state, round, history, GMM pointer).

    ``published``: the atoms file this state publishes, ``{"path": relative to the state's
    folder, "sha256": its bytes' hash, "round": t}`` (meta ``published``): a run that finds it
    missing or different republishes it (:func:`round_files`).
    """
    arrays = dict(means=st.means, variances=st.variances, label_logits=st.label_logits,
                  alpha=st.alpha, round=np.int64(st.round), rng_state=rng_to_array(st.rng),
                  var_floor=np.asarray(st.var_floor, np.float64))
    if st.received is not None:
        arrays.update(received_means=st.received[0], received_variances=st.received[1],
                      received_label_logits=st.received[2], alpha_received=st.alpha_received)
    meta = dict(client=st.client, gmm_path=st.gmm_path, gmm_sha256=st.gmm_sha256,
                settings=st.settings, history=st.history, producer="fedalign dadil-round")
    if published is not None:
        meta["published"] = dict(published)
    return write_npz(path, "state", arrays, meta)


_RECEIVED = ("received_means", "received_variances", "received_label_logits", "alpha_received")


def load_state(path) -> ClientState:
    """Read and validate a ``state`` file."""
    a, meta = read_npz(path, "state")
    client = meta.get("client")
    if not isinstance(client, str) or not _CLIENT_RE.match(client):
        raise FedalignError(f"{path}: state file without a valid client id")
    alpha = check_simplex(a["alpha"], f"{path}: alpha")
    if alpha.shape[0] != a["means"].shape[0]:
        raise FedalignError(f"{path}: alpha has {alpha.shape[0]} entries for "
                            f"{a['means'].shape[0]} atoms")
    if np.any(a["variances"] <= 0):
        raise FedalignError(f"{path}: state variances must be > 0")
    if int(a["round"]) < 0:
        raise FedalignError(f"{path}: state round must be ≥ 0, got {int(a['round'])}")
    floor = a["var_floor"].astype(np.float64)
    if floor.shape != a["means"].shape[2:] or np.any(floor <= 0):
        raise FedalignError(f"{path}: var_floor must be {a['means'].shape[2]} values > 0")
    history = meta.get("history") or []  # a list (read_npz checks the metadata's types)
    check_rng_words(a["rng_state"], path)
    missing = [k for k in _RECEIVED if k not in a]
    if 0 < len(missing) < len(_RECEIVED):
        raise FedalignError(f"{path}: state received dictionary without {', '.join(missing)}")
    received, alpha_r = None, None
    if not missing:
        received = tuple(a[f"received_{k}"].astype(np.float64)
                         for k in ("means", "variances", "label_logits"))
        alpha_r = check_simplex(a["alpha_received"], f"{path}: alpha_received")
        if np.any(received[1] <= 0):
            raise FedalignError(f"{path}: state received_variances must be > 0")
    return ClientState(client, a["means"].astype(np.float64), a["variances"].astype(np.float64),
                       a["label_logits"].astype(np.float64), alpha, int(a["round"]),
                       rng_from_array(a["rng_state"]), floor, history,
                       str(meta.get("gmm_path", "")), str(meta.get("gmm_sha256", "")),
                       dict(meta.get("settings") or {}), received, alpha_r)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def gmm_n_classes(gmm, n_classes: int | None = None) -> int:
    """C of a client's GMM: its labels, its class names, its fit record, else ``n_classes``."""
    C = gmm.n_classes if gmm.n_classes is not None else gmm.meta.get("n_classes", n_classes)
    if C is None:
        raise FedalignError("the GMM has neither labels nor class names: give "
                            f"{spell('n_classes')}")
    if n_classes is not None and int(n_classes) != C:
        raise FedalignError(f"n_classes {n_classes} disagrees with the GMM's {C} classes",
                            param="n_classes")
    return check_n_classes(C)


def check_gmm_for_state(st: ClientState, gmm, where: str = "GMM") -> None:
    """The GMM must have the atoms' dimension and class count."""
    A, K, d, C = st.shape
    if gmm.d != d:
        raise FedalignError(f"{where} has dimension d={gmm.d}, client {st.client}'s atoms have "
                            f"d={d}")
    if gmm.n_classes is not None and gmm.n_classes != C:
        raise FedalignError(f"{where} has {gmm.n_classes} classes, client {st.client}'s atoms "
                            f"have C={C}")


def check_peer(st: ClientState, peer: PublishedAtoms, where: str = "peer atoms") -> None:
    """A peer's atoms must have exactly the client's (A, K, d, C) and come from a round the
    client has completed (round t reads atoms of rounds ≤ t − 1: a later one is from the
    future of this client, e.g. a stale state or a mixed-up folder)."""
    if peer.shape != st.shape:
        names = ("atoms A", "components K", "dimension d", "classes C")
        diff = ", ".join(f"{n}={p} (expected {s})" for n, p, s in zip(names, peer.shape, st.shape)
                         if p != s)
        raise FedalignError(f"{where} from {peer.producer}: {diff}")
    if peer.round > st.round:
        raise FedalignError(f"{where} from {peer.producer} are of round {peer.round}, but client "
                            f"{st.client} has completed only {st.round} rounds (round "
                            f"{st.round + 1} reads atoms of rounds ≤ {st.round})")



# --------------------------------------------------------------------------------------------
# A fresh client
# --------------------------------------------------------------------------------------------


def optim_for(st: "ClientState") -> Optim:
    """The :class:`fedalign.dadil.optim.Optim` of a client state for its next round
    (:meth:`~fedalign.dadil.optim.Optim.from_settings`: its settings checked, the atoms' step
    decayed by the rounds done, the client's own variance floor)."""
    return Optim.from_settings(st.settings, st.round, st.var_floor,
                               where=f"client {st.client}'s state")


def init_client(client: str, gmm, *, n_atoms: int = defaults.N_ATOMS, seed: int = 0,
                n_components: int | None = None, n_classes: int | None = None,
                preset: str = "fedalign", shared_init: bool = False, gmm_path: str = "",
                gmm_sha256: str = "", **overrides) -> ClientState:
    """A fresh client state (Algorithm 1: every client initialises its own atoms).

    Atoms: with ``init="data"`` (the fedalign preset) means μ + s ⊙ ε and variances s², with
    μ, s² the per-dimension mean and variance of the client's own GMM
    (:func:`fedalign.dadil.atoms.data_moments`) and ε drawn from the client's own seed
    :func:`client_init_seed` (federation seed and client id); ``init="normal"`` (reference
    preset) means ε, variances 1. Labels uniform, α uniform. ``shared_init`` restores the
    earlier behaviour: every client starts from the same N(0, I) atoms drawn from the
    federation seed alone (then M_ij(0) = 0). The variance floor is ``var_floor_rel`` × the
    client's per-dimension data variance (or the absolute ``min_var``).

    Parameters
    ----------
    client : id; gmm : the client's :class:`~fedalign.gmm.GMM` (labeled → source role)
    n_atoms : A; n_components : K per atom (default: the GMM's K)
    seed : the federation seed, in [0, :data:`fedalign.defaults.MAX_SEED`]
    preset, overrides : :func:`client_settings`
    """
    check_client_id(client)
    defaults.check_seed(seed, param="seed")
    if int(n_atoms) < 1:
        raise FedalignError(f"the number of atoms must be ≥ 1, got {n_atoms}", param="n_atoms")
    settings = client_settings(preset, **overrides)
    C = gmm_n_classes(gmm, n_classes)
    K = int(n_components) if n_components is not None else gmm.K
    if K < 1:
        raise FedalignError(f"the number of components must be ≥ 1, got {K}",
                            param="n_components")
    mu, var = data_moments(gmm)
    if settings["var_floor_rel"] is not None:
        floor = floor_from_variance(var, settings["var_floor_rel"])
    else:
        floor = np.full(gmm.d, float(settings["min_var"]))
    if shared_init:
        atoms = init_atoms(int(n_atoms), K, gmm.d, C, seed=int(seed))
    elif settings["init"] == "data":
        atoms = init_atoms(int(n_atoms), K, gmm.d, C, seed=client_init_seed(seed, client),
                           center=mu, scale=np.sqrt(np.maximum(var, floor)))
    else:
        atoms = init_atoms(int(n_atoms), K, gmm.d, C, seed=client_init_seed(seed, client))
    m, v, lg = _atoms_arrays(atoms)
    settings.update(seed=int(seed), n_atoms=int(n_atoms), n_components=K, n_classes=C,
                    shared_init=bool(shared_init), role="source" if gmm.labeled else "target")
    return ClientState(client, m, np.maximum(v, floor), lg,
                       np.full(int(n_atoms), 1.0 / int(n_atoms)), 0, client_rng(seed, client),
                       floor, [], str(gmm_path), str(gmm_sha256), settings)


def _atoms_arrays(atoms):
    """(means, variances, label_logits) of :class:`~fedalign.dadil.atoms.Atoms` as float64
    copies."""
    return tuple(np.array(x, dtype=np.float64)
                 for x in (atoms.means, atoms.variances, atoms.label_logits))



def client_barycenter(st: ClientState, alpha=None, *, tol: float = 1e-6, max_iter: int = 50):
    """The client's labeled barycenter as a :class:`~fedalign.gmm.GMM`
    (:func:`~fedalign.dadil.barycenter.atoms_barycenter`).

    A target with a received dictionary (:func:`fedalign.dadil.gossip.refit_received`) uses
    B(α_received; received atoms); otherwise B(α; its own atoms). ``alpha`` overrides the weights.
    """
    if st.received is not None:
        m, v, z = st.received
        a = st.alpha_received if alpha is None else alpha
    else:
        m, v, z, a = st.means, st.variances, st.label_logits, (st.alpha if alpha is None else alpha)
    return atoms_barycenter(Atoms(m, v, z), a, tol=tol, max_iter=max_iter)


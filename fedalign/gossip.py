"""DeFed-GMM-DaDiL: serverless gossip rounds of GMM dataset-dictionary learning.

Every client ℓ keeps a private copy of the dictionary (atoms P_1..P_A, labeled diagonal GMMs
with K uniform-weight components) and its own barycentric weights α_ℓ ∈ Δ_A. Only atoms
travel. This is Algorithm 1 of the paper; one round for one client:

1. read its private state, its GMM and the atoms files its peers published last round
   (a peer file of a later round than the client's is refused);
2. communicate (peers drawn with the client's own seeded RNG, without replacement):

   - ``replacement``: adopt the atoms of one random peer;
   - ``aggregation``: replace every atom a by the equal-weight Wasserstein mean of its own
     version and the versions of two random peers, the labeled GMM barycenter
     B((1/3, 1/3, 1/3); P_a^own, P_a^p1, P_a^p2). As in Algorithm 1, atom a of each version is
     paired with atom a of the others *by index*; the components inside the paired atoms are
     matched by OT (the barycenter's plans, with the label penalty), not by index;
   - ``none``: no communication;

3. E local steps on its own loss — SMW2²(Q_ℓ, B(α_ℓ; P)) for a labeled source,
   MW2²(Q_T, B(α_T; P)) for the unlabeled target — with the optimiser started afresh (nothing
   of an optimiser survives a communication; the paper's Algorithm 1 is projected gradient
   descent, the FedDaDiL reference restarts its optimiser every round), the projections
   (variance floor, α ∈ Δ) after every step; see :mod:`fedalign.dictionary` for the steps;
4. write the new private state and publish the atoms file.

Initialisation (Algorithm 1: "initializations vary across clients"): every client draws its
own atoms from ``SeedSequence(seed, spawn_key=(crc32(client), 1))``, so the consensus
M_ij(t) starts high and falls as gossip brings the dictionaries together. ``shared_init``
restores the former common start (all clients from the federation seed alone).

The unlabeled target (fedalign preset, a labelled deviation from Algorithm 1): its loss
carries no label information, so steps on it can only move components onto the target's
clusters whatever labels those components carry. It therefore updates α only
(``target_atoms=False``; the reference preset updates its atoms too), and its classifier is
built from the dictionary it received in its last communication with α re-fitted on it
(:func:`refit_received`); see that function for the measurement.

Files (:mod:`fedalign.files`)
    ``state`` (private): atoms, α, variance floor, RNG state, round, the per-round history
    (peers, losses, α after every step, step sizes), for the target the received dictionary;
    meta: client id, GMM path and SHA-256, settings. ``atoms`` (published): means, variances,
    label logits, round; meta: producer (the client id) — nothing else: no α, no GMM, no
    sample. The round-0 atoms of the fedalign preset are drawn around the client's data mean
    and spread (per dimension), which they therefore reveal, as a SLOT-Align stats message does.

References
----------
E. F. Montesuma, R. Castellon, F. M. N. Mboula, A. Mayoue, A. Souloumiac, C. Gouy-Pailler,
"Decentralized Federated Dataset Dictionary Learning for Multi-Source Domain Adaptation",
ICASSP 2025 (DeFed-GMM-DaDiL).
"""

from __future__ import annotations

import re
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError
from fedalign.gmm_barycenter import softmax_np

STRATEGIES = ("replacement", "aggregation", "none")
#: Peers drawn per round by each strategy (aggregation: own version + 2 peers' versions).
N_PEERS = {"replacement": 1, "aggregation": 2, "none": 0}
_CLIENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
LOGIT_FLOOR = 1e-12


# --------------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------------


def limit_threads(n: int = 1) -> None:
    """Use n threads in torch and in numpy's BLAS (threadpoolctl) for the rest of the process.

    One round works on small matrices (K ≈ 50 components): on a machine shared by several
    processes, multi-threaded BLAS and torch spin-wait on each other and a step becomes ~10×
    slower than with one thread (``benchmarks/bench_dadil.py``).
    """
    import os
    import sys

    from threadpoolctl import threadpool_limits

    if int(n) < 1:
        raise FedalignError(f"--threads must be ≥ 1, got {n}")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(n))
    else:  # read by torch when it is imported (not imported here: bad input fails fast)
        os.environ["OMP_NUM_THREADS"] = str(int(n))
    threadpool_limits(limits=int(n))


def check_client_id(client: str) -> str:
    """Client ids are short names (letters, digits, ``_ . -``): they go into files and tables."""
    if not isinstance(client, str) or not _CLIENT_RE.match(client):
        raise FedalignError(f"invalid client id {client!r} (letters, digits, '_', '.', '-')")
    return client


def client_rng(seed: int, client: str) -> np.random.Generator:
    """The client's own generator: PCG64 on ``SeedSequence(seed, spawn_key=(crc32(client),))``."""
    ss = np.random.SeedSequence(int(seed), spawn_key=(zlib.crc32(client.encode()),))
    return np.random.Generator(np.random.PCG64(ss))


def rng_to_array(rng: np.random.Generator) -> np.ndarray:
    """PCG64 state as 6 uint64 words: state (hi, lo), inc (hi, lo), has_uint32, uinteger."""
    s = rng.bit_generator.state
    if s["bit_generator"] != "PCG64":
        raise ValueError("only PCG64 generators are serialisable")
    m = (1 << 64) - 1
    st, inc = s["state"]["state"], s["state"]["inc"]
    return np.array([st >> 64, st & m, inc >> 64, inc & m, s["has_uint32"], s["uinteger"]],
                    dtype=np.uint64)


def rng_from_array(a) -> np.random.Generator:
    """Inverse of :func:`rng_to_array`."""
    a = [int(x) for x in np.asarray(a, dtype=np.uint64)]
    bg = np.random.PCG64()
    bg.state = {"bit_generator": "PCG64", "state": {"state": (a[0] << 64) | a[1],
                                                     "inc": (a[2] << 64) | a[3]},
                "has_uint32": a[4], "uinteger": a[5]}
    return np.random.Generator(bg)


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
    from fedalign.files import write_npz

    return write_npz(path, "atoms",
                     dict(means=np.asarray(pa.means, np.float64),
                          variances=np.asarray(pa.variances, np.float64),
                          label_logits=np.asarray(pa.label_logits, np.float64),
                          round=np.int64(pa.round)),
                     {"producer": pa.producer})


def load_atoms(path) -> PublishedAtoms:
    """Read and validate an ``atoms`` file (positive variances, a producer id)."""
    from fedalign.files import read_npz

    a, meta = read_npz(path, "atoms")
    producer = meta.get("producer")
    if not isinstance(producer, str) or not _CLIENT_RE.match(producer):
        raise FedalignError(f"{path}: atoms file without a valid producer id")
    if np.any(a["variances"] <= 0):
        raise FedalignError(f"{path}: atoms variances must be > 0")
    return PublishedAtoms(a["means"].astype(np.float64), a["variances"].astype(np.float64),
                          a["label_logits"].astype(np.float64), int(a["round"]), producer)


def save_state(path, st: ClientState, published: dict | None = None) -> Path:
    """Write a private ``state`` file (atoms, α, floor, RNG state, round, history, GMM pointer).

    ``published``: the atoms file this state publishes, ``{"path": relative to the state's
    folder, "sha256": its bytes' hash, "round": t}`` (meta ``published``): a run that finds it
    missing or different republishes it (:func:`round_files`).
    """
    from fedalign.files import write_npz

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


def load_state(path) -> ClientState:
    """Read and validate a ``state`` file."""
    from fedalign.files import read_npz

    a, meta = read_npz(path, "state")
    client = meta.get("client")
    if not isinstance(client, str) or not _CLIENT_RE.match(client):
        raise FedalignError(f"{path}: state file without a valid client id")
    alpha = a["alpha"].astype(np.float64)
    if alpha.shape[0] != a["means"].shape[0]:
        raise FedalignError(f"{path}: alpha has {alpha.shape[0]} entries for "
                            f"{a['means'].shape[0]} atoms")
    if np.any(a["variances"] <= 0):
        raise FedalignError(f"{path}: state variances must be > 0")
    floor = a["var_floor"].astype(np.float64)
    if floor.shape != a["means"].shape[2:] or np.any(floor <= 0):
        raise FedalignError(f"{path}: var_floor must be {a['means'].shape[2]} values > 0")
    history = meta.get("history", [])
    if not isinstance(history, list):
        raise FedalignError(f"{path}: state history must be a list")
    received, alpha_r = None, None
    if "received_means" in a:
        received = tuple(a[f"received_{k}"].astype(np.float64)
                         for k in ("means", "variances", "label_logits"))
        alpha_r = a["alpha_received"].astype(np.float64)
        if np.any(received[1] <= 0):
            raise FedalignError(f"{path}: state received_variances must be > 0")
    return ClientState(client, a["means"].astype(np.float64), a["variances"].astype(np.float64),
                       a["label_logits"].astype(np.float64), alpha, int(a["round"]),
                       rng_from_array(a["rng_state"]), floor, history,
                       str(meta.get("gmm_path", "")), str(meta.get("gmm_sha256", "")),
                       dict(meta.get("settings", {})), received, alpha_r)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def gmm_n_classes(gmm, n_classes: int | None = None) -> int:
    """C of a client's GMM: its labels, its class names, its fit record, else ``n_classes``."""
    C = gmm.n_classes if gmm.n_classes is not None else gmm.meta.get("n_classes", n_classes)
    if C is None:
        raise FedalignError("the GMM has neither labels nor class names: give --n-classes")
    if n_classes is not None and int(n_classes) != C:
        raise FedalignError(f"--n-classes {n_classes} disagrees with the GMM's {C} classes")
    return int(C)


def check_gmm_for_state(st: ClientState, gmm, where: str = "GMM") -> None:
    """The GMM must have the atoms' dimension and class count."""
    A, K, d, C = st.shape
    if gmm.d != d:
        raise FedalignError(f"{where} has dimension d={gmm.d}, client {st.client}'s atoms have d={d}")
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
# Initialisation, communication, local steps
# --------------------------------------------------------------------------------------------


def client_init_seed(seed: int, client: str) -> np.random.SeedSequence:
    """The client's own initialisation seed: ``SeedSequence(seed, spawn_key=(crc32(client), 1))``
    (a stream distinct from its peer-choice generator :func:`client_rng`)."""
    return np.random.SeedSequence(int(seed), spawn_key=(zlib.crc32(client.encode()), 1))


def client_settings(preset: str = "fedalign", **overrides) -> dict:
    """The settings of a client: a named preset (:data:`fedalign.dictionary.PRESETS`) with
    explicit values (not None) taking precedence. Keys: optimizer, lr, alpha_rule, lr_alpha,
    var_floor_rel (variance floor relative to the client's per-dimension data variance) or
    min_var (absolute floor), init ("data" | "normal")."""
    from fedalign.dictionary import PRESETS

    if preset not in PRESETS:
        raise FedalignError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    out = dict(PRESETS[preset], preset=preset)
    for k, v in overrides.items():
        if k not in out:
            raise FedalignError(f"unknown DaDiL setting {k!r}")
        if v is not None:
            out[k] = v
    if overrides.get("min_var") is not None:
        out["var_floor_rel"] = None
    elif overrides.get("var_floor_rel") is not None:
        out["min_var"] = None
    if out["init"] not in ("data", "normal"):
        raise FedalignError(f"init must be 'data' or 'normal', got {out['init']!r}")
    for k in ("var_floor_rel", "min_var"):
        if out[k] is not None and not (np.isfinite(out[k]) and out[k] > 0):
            raise FedalignError(f"{k} must be > 0, got {out[k]}")
    return out


def optim_for(st: "ClientState"):
    """The :class:`fedalign.dictionary.Optim` of a client state (its settings and floor)."""
    from fedalign.dictionary import Optim

    s = st.settings
    return Optim(s["optimizer"], float(s["lr"]), s["alpha_rule"], float(s["lr_alpha"]),
                 st.var_floor)


def init_client(client: str, gmm, n_atoms: int = 3, seed: int = 0, n_components: int | None = None,
                n_classes: int | None = None, preset: str = "fedalign", shared_init: bool = False,
                gmm_path: str = "", gmm_sha256: str = "", **overrides) -> ClientState:
    """A fresh client state (Algorithm 1: every client initialises its own atoms).

    Atoms: with ``init="data"`` (the fedalign preset) means μ + s ⊙ ε and variances s², with
    μ, s² the per-dimension mean and variance of the client's own GMM
    (:func:`fedalign.dictionary.data_moments`) and ε drawn from the client's own seed
    :func:`client_init_seed` (federation seed and client id); ``init="normal"`` (reference
    preset) means ε, variances 1. Labels uniform, α uniform. ``shared_init`` restores the
    earlier behaviour: every client starts from the same N(0, I) atoms drawn from the
    federation seed alone (then M_ij(0) = 0). The variance floor is ``var_floor_rel`` × the
    client's per-dimension data variance (or the absolute ``min_var``).

    Parameters
    ----------
    client : id; gmm : the client's :class:`~fedalign.gmm.GMM` (labeled → source role)
    n_atoms : A; n_components : K per atom (default: the GMM's K)
    seed : the federation seed
    preset, overrides : :func:`client_settings`
    """
    from fedalign.dictionary import data_moments, init_atoms
    from fedalign.gmm import floor_from_variance

    check_client_id(client)
    if int(n_atoms) < 1:
        raise FedalignError(f"the number of atoms must be ≥ 1, got {n_atoms}")
    settings = client_settings(preset, **overrides)
    C = gmm_n_classes(gmm, n_classes)
    K = int(n_components) if n_components is not None else gmm.K
    if K < 1:
        raise FedalignError(f"the number of components must be ≥ 1, got {K}")
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
    return ClientState(client, m, np.maximum(v, floor), lg, np.full(int(n_atoms), 1.0 / int(n_atoms)),
                       0, client_rng(seed, client), floor, [], str(gmm_path), str(gmm_sha256),
                       settings)


def _atoms_arrays(atoms):
    """(means, variances, label_logits) of a :class:`fedalign.dictionary.Atoms` as float64 numpy."""
    out = []
    for x in (atoms.means, atoms.variances, atoms.label_logits):
        x = x.detach().cpu().numpy() if hasattr(x, "detach") else x
        out.append(np.array(x, dtype=np.float64))
    return tuple(out)


def choose_peers(rng: np.random.Generator, peers: list, k: int) -> list:
    """k distinct peers drawn uniformly with the client's generator (fewer if fewer exist).

    ``peers`` must be in a canonical order (sorted by producer) so the draw does not depend
    on the order files were given in.
    """
    k = min(int(k), len(peers))
    if k == 0:
        return []
    idx = rng.choice(len(peers), size=k, replace=False)
    return [peers[i] for i in idx]


def aggregate_atoms(versions: list, tol: float = 1e-6, max_iter: int = 50):
    """Equal-weight labeled Wasserstein mean of several versions of the same dictionary.

    Parameters
    ----------
    versions : list of (means (A, K, d), variances (A, K, d), label_logits (A, K, C))

    Returns
    -------
    means, variances, label_logits of the aggregated atoms; atom a is the labeled GMM
    barycenter B((1/n, …, 1/n); P_a^1, …, P_a^n) with K components, whose components are
    matched to each version's by OT with the label penalty (not by index). Logits are log V.
    """
    from fedalign.gmm_barycenter import labeled_barycenter_np

    n = len(versions)
    A, K, _ = versions[0][0].shape
    w = np.full(n, 1.0 / n)
    out_m, out_v, out_l = [], [], []
    for a in range(A):
        M = np.stack([v[0][a] for v in versions])
        V = np.stack([v[1][a] for v in versions])
        L = np.stack([softmax_np(v[2][a]) for v in versions])
        bm, bv, bl, _info = labeled_barycenter_np(w, M, V, L, n_components=K, tol=tol,
                                                  max_iter=max_iter)
        out_m.append(bm)
        out_v.append(bv)
        out_l.append(np.log(np.maximum(bl, LOGIT_FLOOR)))
    return np.stack(out_m), np.stack(out_v), np.stack(out_l)


def communicate(st: ClientState, peers: list, strategy: str) -> dict:
    """Apply the strategy in place (peers already checked); return a record of what was done.

    Aggregation averages the client's own version and its two peers' versions of every atom,
    with equal weights (also for a target that moves α only: its copy is the relay of earlier
    aggregates; leaving it out measured 36.3 % against 38.8 % with it on the quick-start demo
    digits, within the noise of 60 test rows, so Algorithm 1 is kept as written)."""
    if strategy not in STRATEGIES:
        raise FedalignError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    pool = sorted((p for p in peers if p.producer != st.client), key=lambda p: p.producer)
    if strategy != "none" and not pool:
        raise FedalignError(f"strategy {strategy} needs at least one peer atoms file "
                            f"(other than {st.client}'s own)")
    chosen = choose_peers(st.rng, pool, N_PEERS[strategy])
    if strategy == "replacement":
        p = chosen[0]
        st.means, st.variances, st.label_logits = p.means.copy(), p.variances.copy(), \
            p.label_logits.copy()
    elif strategy == "aggregation":
        versions = [(st.means, st.variances, st.label_logits)] + \
            [(p.means, p.variances, p.label_logits) for p in chosen]
        st.means, st.variances, st.label_logits = aggregate_atoms(versions)
        st.variances = np.maximum(st.variances, st.var_floor)
    return dict(strategy=strategy, peers=[p.producer for p in chosen],
                peer_rounds=[p.round for p in chosen])


def local_update(st: ClientState, gmm, n_steps: int) -> dict:
    """E local steps on the client's loss (SMW2² for a labeled source, MW2² for the target),
    with the client's optimiser (:func:`optim_for`), started afresh: nothing of an optimiser
    survives a communication. Returns the record of
    :func:`fedalign.dictionary.local_steps` (losses, α after every step, step sizes)."""
    from fedalign.dictionary import Atoms, local_steps

    if int(n_steps) < 0:
        raise FedalignError(f"the number of local steps must be ≥ 0, got {n_steps}")
    if int(n_steps) == 0:
        return dict(losses=[], alpha=[st.alpha.tolist()], step_mean=[], step_std=[])
    atoms = Atoms(st.means, st.variances, st.label_logits)
    update_atoms = gmm.labeled or bool(st.settings.get("target_atoms", True))
    atoms, alpha, rec = local_steps(atoms, st.alpha, gmm, int(n_steps), optim_for(st),
                                    labeled=gmm.labeled, update_atoms=update_atoms)
    st.means, st.variances, st.label_logits = _atoms_arrays(atoms)
    st.alpha = np.array(alpha, dtype=np.float64)
    return rec


#: Newton iterations of the target's α re-fit on the dictionary it received.
REFIT_STEPS = 20


def refit_received(st: ClientState, gmm, received: tuple) -> None:
    """Keep the dictionary the unlabeled target received, and α re-fitted on it (in place).

    The target's own steps minimise MW2²(Q_T, B(α_T)), which carries no label information:
    they move components onto the target's clusters whatever labels those components carry.
    Measured on Office-Caltech10 (webcam, seed 0, 5 rounds of aggregation, the target updating
    its atoms as in Algorithm 1, during development), a classifier on B(α_T) after those steps
    scored 58.6 % against 81.0 % on the dictionary received just before them. The target therefore still publishes its updated atoms (Algorithm 1), but
    builds its classifier on the received dictionary, with α_T re-fitted on it by
    :func:`fedalign.dictionary.fit_alpha` (projected Newton, from the current α_T).
    """
    from fedalign.dictionary import Atoms, fit_alpha

    alpha, _ = fit_alpha(Atoms(*received), gmm, REFIT_STEPS, labeled=False, alpha0=st.alpha,
                         rule="newton")
    st.received, st.alpha_received = received, alpha


def describe_round(st: ClientState, rec: dict) -> str:
    """One line about a round: client, round, strategy, peers, loss curve, α, step sizes."""
    L = rec.get("losses") or []
    if L:
        pts = L if len(L) <= 4 else [L[0], L[len(L) // 3], L[2 * len(L) // 3], L[-1]]
        loss = "loss " + " → ".join(f"{x:.4g}" for x in pts)
        step = f", step mean {rec['step_mean'][0]:.2g}→{rec['step_mean'][-1]:.2g}"
    else:
        loss, step = "no local steps", ""
    alpha = ", ".join(f"{a:.3f}" for a in st.alpha)
    return (f"{st.client} round {rec['round']} {rec['strategy']} "
            f"(peers: {', '.join(rec['peers']) or '—'}), {loss}, α ({alpha}){step}")


def gossip_round(st: ClientState, gmm, peers: list, strategy: str = "aggregation",
                 local_steps: int = 10) -> tuple[ClientState, PublishedAtoms, dict]:
    """One DeFed-GMM-DaDiL round for one client (in place on ``st``, which is also returned).

    Parameters
    ----------
    st : the client's state (round t−1); gmm : its GMM
    peers : :class:`PublishedAtoms` of candidate peers (own atoms are ignored)
    strategy : replacement | aggregation | none; local_steps : E

    Returns
    -------
    state (round t), the atoms to publish, and a record (peers chosen, losses).
    """
    check_gmm_for_state(st, gmm)
    for p in peers:
        check_peer(st, p)
    rec = communicate(st, peers, strategy)
    received = (st.means.copy(), st.variances.copy(), st.label_logits.copy())
    rec.update(local_update(st, gmm, local_steps))
    if not gmm.labeled:
        refit_received(st, gmm, received)
        rec["alpha_received"] = st.alpha_received.tolist()
    st.round += 1
    rec["round"] = st.round
    st.history.append(rec)
    return st, st.published(), rec


# --------------------------------------------------------------------------------------------
# File-level API (what ``fedalign dadil-round`` calls; the simulation calls it too)
# --------------------------------------------------------------------------------------------


def init_files(client: str, gmm_path, state_path, atoms_path, *, force: bool = False,
               gmm=None, gmm_sha256: str | None = None, **init_options):
    """``dadil-round --init``: write a fresh state and publish the round-0 atoms, both or neither.

    ``init_options`` are those of :func:`init_client` (n_atoms, seed, n_components, n_classes,
    preset, shared_init and the preset overrides). ``gmm``/``gmm_sha256`` may be passed
    pre-loaded (simulation); the files are the same. An existing state is refused unless
    ``force`` (it is then replaced atomically, under its lock); neither output may be the GMM.
    """
    import contextlib

    from fedalign.files import check_outputs, locked, sha256_file
    from fedalign.gmm import load_gmm

    state_path, atoms_path = Path(state_path), Path(atoms_path)
    check_outputs([gmm_path], [atoms_path, state_path])
    if state_path.exists() and not force:
        raise FedalignError(f"{state_path} exists: refusing to overwrite a client state "
                            "(use --force to start over)")
    lock = locked(state_path, "another dadil-round") if state_path.is_file() else contextlib.nullcontext()
    with lock:
        gmm = load_gmm(gmm_path) if gmm is None else gmm
        sha = sha256_file(gmm_path) if gmm_sha256 is None else gmm_sha256
        st = init_client(client, gmm, gmm_path=str(gmm_path), gmm_sha256=sha, **init_options)
        _publish(state_path, st, atoms_path)
    return st


def _publish(state_path: Path, st: ClientState, atoms_path: Path) -> None:
    """Write the state and its atoms as one transaction, the state renamed first.

    The state records the atoms file it publishes (path relative to its folder, SHA-256,
    round): a kill between the two renames leaves a state whose atoms file is missing or
    stale, which the next :func:`round_files` on this state detects and republishes.
    """
    import os

    from fedalign.files import atomic_outputs, sha256_file

    with atomic_outputs(join=False) as tx:
        save_atoms(atoms_path, st.published())
        sha = sha256_file(tx.temporary(atoms_path))
        rel = os.path.relpath(os.path.abspath(atoms_path), os.path.abspath(state_path.parent))
        save_state(state_path, st, dict(path=rel, sha256=sha, round=int(st.round)))
        tx.commit_first(state_path)


def round_files(state_path, peer_paths, atoms_path, strategy: str = "aggregation",
                local_steps: int = 10, client: str | None = None, gmm_path=None,
                gmm=None, peers: list | None = None) -> tuple[ClientState, dict]:
    """One round from files: everything is read and checked before anything is written.

    Parameters
    ----------
    state_path : the client's state (updated in place, atomically, at the end; locked against
        a second ``dadil-round`` on it for the whole round)
    peer_paths : candidate peers' atoms files (the client's own is ignored)
    atoms_path : where to publish the new atoms; it may be none of the inputs (the state, a
        peer's atoms, the GMM)
    client : expected client id (a state of another client is an error)
    gmm_path : the client's GMM (default: the path recorded in the state); its SHA-256 must
        match the one recorded at ``--init``
    gmm, peers : pre-loaded GMM / peer atoms (simulation; skips reading those files)

    The state and the new atoms are written together (:func:`_publish`); an atoms file the
    state published in an earlier, killed run but that is missing or stale is republished
    first (``rec["republished"]``).
    """
    from fedalign.files import check_outputs, locked, read_npz, sha256_file
    from fedalign.gmm import load_gmm

    state_path, atoms_path = Path(state_path), Path(atoms_path)
    if int(local_steps) < 0:
        raise FedalignError(f"local_steps must be ≥ 0, got {local_steps}")
    if not state_path.is_file():
        load_state(state_path)  # the reader's message (no such file, not a file)
    check_outputs(list(peer_paths) + [state_path, gmm_path], [atoms_path, state_path],
                  allow=[state_path])
    with locked(state_path, "another dadil-round"):
        st = load_state(state_path)
        if client is not None and client != st.client:
            raise FedalignError(f"{state_path} is the state of client {st.client}, not {client}")
        gp = Path(gmm_path) if gmm_path is not None else Path(st.gmm_path)
        check_outputs([gp], [atoms_path])
        republished = None
        pub_rec = read_npz(state_path, "state")[1].get("published")
        if isinstance(pub_rec, dict) and isinstance(pub_rec.get("path"), str):
            prev = state_path.parent / pub_rec["path"]
            if prev.parent.is_dir() and not (prev.is_file() and sha256_file(prev) == pub_rec.get("sha256")):
                from fedalign.files import atomic_outputs

                with atomic_outputs(join=False):
                    save_atoms(prev, st.published())
                republished = str(prev)
        if gmm is None:
            gmm = load_gmm(gp)
            check_gmm_for_state(st, gmm, where=str(gp))
            sha = sha256_file(gp)
            if st.gmm_sha256 and sha != st.gmm_sha256:
                raise FedalignError(f"{gp} is not the GMM client {st.client} was initialised with "
                                    f"(sha256 {sha[:12]}… ≠ {st.gmm_sha256[:12]}…)")
        if peers is None:
            peers = []
            for p in peer_paths:
                pa = load_atoms(p)
                check_peer(st, pa, where=str(p))
                peers.append(pa)
        peers = _dedupe(peers)
        st, pub, rec = gossip_round(st, gmm, peers, strategy, local_steps)
        _publish(state_path, st, atoms_path)
        if republished is not None:
            rec = dict(rec, republished=republished)
    return st, rec


def _dedupe(peers: list) -> list:
    """One atoms version per producer: the latest round (two files of one round are an error)."""
    best: dict = {}
    for p in peers:
        q = best.get(p.producer)
        if q is not None and q.round == p.round:
            if not (np.array_equal(q.means, p.means) and np.array_equal(q.variances, p.variances)):
                raise FedalignError(f"two different atoms files from {p.producer} for round {p.round}")
        if q is None or p.round > q.round:
            best[p.producer] = p
    return [best[k] for k in sorted(best)]


# --------------------------------------------------------------------------------------------
# In-process simulation (sweeps): the same files as the CLI path
# --------------------------------------------------------------------------------------------


def federation_paths(out_dir, client: str, t: int) -> tuple[Path, Path]:
    """Layout of a simulated (or Makefile-driven) federation: state and round-t atoms paths."""
    out_dir = Path(out_dir)
    return out_dir / "state" / f"{client}.state.npz", out_dir / f"round_{t:03d}" / f"{client}.atoms.npz"


def simulate(gmm_paths: dict, out_dir, rounds: int, strategy: str = "aggregation",
             local_steps: int = 10, *, progress=None, callback=None, keep_history: bool = True,
             **init_options) -> dict:
    """Run N clients × R synchronous rounds in one process, writing the CLI's files.

    Round t of every client reads the round t−1 atoms of all other clients
    (``out_dir/round_{t-1:03d}/*.atoms.npz``). The files written are byte-identical to
    ``fedalign dadil-round --init`` followed by R ``fedalign dadil-round`` calls with the same
    arguments and paths (and thread counts: the CLI uses :func:`limit_threads`, default 1);
    GMMs and peer atoms are just kept in memory between rounds.

    Parameters
    ----------
    gmm_paths : {client id: GMM file}
    out_dir : federation folder (``state/`` and ``round_XXX/`` are created)
    init_options : :func:`init_client`'s options (n_atoms, seed, preset, shared_init, …)
    progress : optional callable(k) advanced once per client-round
    callback : optional callable(t, {client: ClientState}) after every round
    keep_history : keep every ``round_XXX`` folder (False: only the last one, for sweeps)

    Returns
    -------
    {client: ClientState} after the last round (``.history`` lists the per-round records).
    """
    from fedalign.files import sha256_file
    from fedalign.gmm import load_gmm

    out_dir = Path(out_dir)
    (out_dir / "state").mkdir(parents=True, exist_ok=True)
    gmms = {c: load_gmm(p) for c, p in gmm_paths.items()}
    shas = {c: sha256_file(p) for c, p in gmm_paths.items()}
    (out_dir / "round_000").mkdir(exist_ok=True)
    published, states = {}, {}
    for c, p in gmm_paths.items():
        sp, ap = federation_paths(out_dir, c, 0)
        states[c] = init_files(c, p, sp, ap, force=True, gmm=gmms[c], gmm_sha256=shas[c],
                               **init_options)
        published[c] = states[c].published()
    if callback is not None:
        callback(0, states)
    for t in range(1, int(rounds) + 1):
        (out_dir / f"round_{t:03d}").mkdir(exist_ok=True)
        new_pub = {}
        for c in gmm_paths:
            sp, ap = federation_paths(out_dir, c, t)
            peers = [published[o] for o in gmm_paths if o != c]
            states[c], _ = round_files(sp, [], ap, strategy, local_steps, client=c,
                                         gmm=gmms[c], peers=peers)
            new_pub[c] = states[c].published()
            if progress is not None:
                progress(1)
        published = new_pub
        if not keep_history:
            shutil.rmtree(out_dir / f"round_{t - 1:03d}", ignore_errors=True)
        if callback is not None:
            callback(t, states)
    return states


# --------------------------------------------------------------------------------------------
# The target's barycenter (its classifiers: :mod:`fedalign.dadil_eval`)
# --------------------------------------------------------------------------------------------


def client_barycenter(st: ClientState, alpha=None, tol: float = 1e-6, max_iter: int = 50):
    """The client's labeled barycenter as a :class:`~fedalign.gmm.GMM`.

    A target with a received dictionary (:func:`refit_received`) uses B(α_received; received
    atoms); otherwise B(α; its own atoms). ``alpha`` overrides the weights.
    """
    if st.received is not None:
        m, v, z = st.received
        a = st.alpha_received if alpha is None else alpha
    else:
        m, v, z, a = st.means, st.variances, st.label_logits, (st.alpha if alpha is None else alpha)
    return atoms_barycenter(m, v, z, a, tol=tol, max_iter=max_iter)


def atoms_barycenter(means, variances, label_logits, alpha, tol: float = 1e-6,
                     max_iter: int = 50, class_names=()):
    """Labeled GMM barycenter B(α; P_1..P_A) of atoms arrays → :class:`~fedalign.gmm.GMM`.

    means, variances (A, K, d); label_logits (A, K, C); alpha (A,). K uniform components.
    """
    from fedalign.gmm import GMM
    from fedalign.gmm_barycenter import labeled_barycenter_np

    A, K, _ = means.shape
    bm, bv, bl, _info = labeled_barycenter_np(alpha, means, variances, softmax_np(label_logits),
                                              n_components=K, tol=tol, max_iter=max_iter)
    bl = np.clip(bl, 0.0, None)
    bl = bl / bl.sum(1, keepdims=True)
    return GMM(np.full(K, 1.0 / K), bm, np.maximum(bv, 1e-12), bl, list(class_names))


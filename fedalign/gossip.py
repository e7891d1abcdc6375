"""DeFed-GMM-DaDiL: serverless gossip rounds of GMM dataset-dictionary learning.

Every client ℓ keeps a private copy of the dictionary (atoms P_1..P_A, labeled diagonal GMMs
with K uniform-weight components) and its own barycentric weights α_ℓ ∈ Δ_A. Only atoms
travel. One round for one client:

1. read its private state, its GMM and the atoms files its peers published last round;
2. communicate (peers drawn with the client's own seeded RNG):

   - ``replacement``: adopt the atoms of one random peer;
   - ``aggregation``: replace every atom a by the equal-weight Wasserstein mean of its own
     version and the versions of two random peers, the labeled GMM barycenter
     B((1/3, 1/3, 1/3); P_a^own, P_a^p1, P_a^p2) — components matched by OT, not by index;
   - ``none``: no communication;

3. E local Adam steps on its own loss — SMW2²(Q_ℓ, B(α_ℓ; P)) for a labeled source,
   MW2²(Q_T, B(α_T; P)) for the unlabeled target;
4. write the new private state and publish the atoms file.

Files (:mod:`fedalign.files`)
    ``state`` (private): atoms, α, Adam state, RNG state, round; meta: client id, GMM path
    and SHA-256, settings. ``atoms`` (published): means, variances, label logits, round;
    meta: producer (the client id) — nothing else: no α, no GMM, no sample.

Seeds: the initial atoms depend on the federation ``--seed`` only, so all clients start from the
same dictionary (as a federated model starts from one initialisation: atom a then means the
same thing everywhere, which aggregation by atom index relies on). Each client's own
generator, ``SeedSequence(seed, spawn_key=(crc32(client),))``, drives its peer choices.

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
_OPT_PREFIX = "adam_"
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
    optim_state : dict of str → ndarray, :meth:`fedalign.dictionary.AdamState.to_arrays`
        (empty before the first local step)
    gmm_path, gmm_sha256 : the client's GMM file and its hash (checked every round)
    settings : dict (seed, n_atoms, lr, min_var, role)
    """

    client: str
    means: np.ndarray
    variances: np.ndarray
    label_logits: np.ndarray
    alpha: np.ndarray
    round: int
    rng: np.random.Generator
    optim_state: dict = field(default_factory=dict)
    gmm_path: str = ""
    gmm_sha256: str = ""
    settings: dict = field(default_factory=dict)

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


def save_state(path, st: ClientState) -> Path:
    """Write a private ``state`` file (atoms, α, Adam state, RNG state, round, GMM pointer)."""
    from fedalign.files import write_npz

    arrays = dict(means=st.means, variances=st.variances, label_logits=st.label_logits,
                  alpha=st.alpha, round=np.int64(st.round), rng_state=rng_to_array(st.rng))
    arrays.update(st.optim_state)
    meta = dict(client=st.client, gmm_path=st.gmm_path, gmm_sha256=st.gmm_sha256,
                settings=st.settings, producer="fedalign dadil-round")
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
    opt = {k: v for k, v in a.items() if k.startswith(_OPT_PREFIX)}
    return ClientState(client, a["means"].astype(np.float64), a["variances"].astype(np.float64),
                       a["label_logits"].astype(np.float64), alpha, int(a["round"]),
                       rng_from_array(a["rng_state"]), opt, str(meta.get("gmm_path", "")),
                       str(meta.get("gmm_sha256", "")), dict(meta.get("settings", {})))


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
    """A peer's atoms must have exactly the client's (A, K, d, C)."""
    if peer.shape != st.shape:
        names = ("atoms A", "components K", "dimension d", "classes C")
        diff = ", ".join(f"{n}={p} (expected {s})" for n, p, s in zip(names, peer.shape, st.shape)
                         if p != s)
        raise FedalignError(f"{where} from {peer.producer}: {diff}")


# --------------------------------------------------------------------------------------------
# Initialisation, communication, local steps
# --------------------------------------------------------------------------------------------


def init_client(client: str, gmm, n_atoms: int = 3, seed: int = 0, n_components: int | None = None,
                n_classes: int | None = None, lr: float = 0.1, min_var: float = 1e-6,
                gmm_path: str = "", gmm_sha256: str = "") -> ClientState:
    """A fresh client state: means ~ N(0, I), variances 1, uniform labels, α uniform.

    The atoms depend on ``seed`` only (common to every client of the federation); the
    client's generator (peer choices) on ``seed`` and its id.

    Parameters
    ----------
    client : id; gmm : the client's :class:`~fedalign.gmm.GMM` (labeled → source role)
    n_atoms : A; n_components : K per atom (default: the GMM's K)
    seed : the federation seed
    """
    from fedalign.dictionary import init_atoms

    check_client_id(client)
    if int(n_atoms) < 1:
        raise FedalignError(f"--n-atoms must be ≥ 1, got {n_atoms}")
    if not lr > 0:
        raise FedalignError(f"--lr must be > 0, got {lr}")
    C = gmm_n_classes(gmm, n_classes)
    K = int(n_components) if n_components is not None else gmm.K
    if K < 1:
        raise FedalignError(f"--n-components must be ≥ 1, got {K}")
    rng = client_rng(seed, client)
    atoms = init_atoms(int(n_atoms), K, gmm.d, C, seed=int(seed))  # common to the federation
    m, v, lg = _atoms_arrays(atoms)
    settings = dict(seed=int(seed), n_atoms=int(n_atoms), n_components=K, n_classes=C,
                    lr=float(lr), min_var=float(min_var),
                    role="source" if gmm.labeled else "target")
    return ClientState(client, m, v, lg, np.full(int(n_atoms), 1.0 / int(n_atoms)), 0, rng, {},
                       str(gmm_path), str(gmm_sha256), settings)


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
    """Apply the strategy in place (peers already checked); return a record of what was done."""
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
        st.variances = np.maximum(st.variances, st.settings.get("min_var", 1e-6))
    return dict(strategy=strategy, peers=[p.producer for p in chosen],
                peer_rounds=[p.round for p in chosen])


def local_update(st: ClientState, gmm, n_steps: int) -> list:
    """E Adam steps on the client's loss (SMW2² for a labeled source, MW2² for the target)."""
    from fedalign.dictionary import AdamState, Atoms, local_steps

    if int(n_steps) < 0:
        raise FedalignError(f"--local-steps must be ≥ 0, got {n_steps}")
    if int(n_steps) == 0:
        return []
    atoms = Atoms(st.means, st.variances, st.label_logits)
    atoms, alpha, opt, losses = local_steps(
        atoms, st.alpha, gmm, int(n_steps), lr=st.settings.get("lr", 0.1),
        optim_state=AdamState.from_arrays(st.optim_state, prefix=_OPT_PREFIX), min_var=st.settings.get("min_var", 1e-6),
        labeled=gmm.labeled)
    st.means, st.variances, st.label_logits = _atoms_arrays(atoms)
    a = alpha.detach().numpy() if hasattr(alpha, "detach") else alpha
    st.alpha = np.array(a, dtype=np.float64)
    st.optim_state = opt.to_arrays(prefix=_OPT_PREFIX)
    return [float(x) for x in losses]


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
    rec["losses"] = local_update(st, gmm, local_steps)
    st.round += 1
    rec["round"] = st.round
    return st, st.published(), rec


# --------------------------------------------------------------------------------------------
# File-level API (what ``fedalign dadil-round`` calls; the simulation calls it too)
# --------------------------------------------------------------------------------------------


def init_files(client: str, gmm_path, state_path, atoms_path, n_atoms: int = 3, seed: int = 0,
               n_components: int | None = None, n_classes: int | None = None, lr: float = 0.1,
               min_var: float = 1e-6, force: bool = False, gmm=None, gmm_sha256: str | None = None):
    """``dadil-round --init``: write a fresh state and publish the round-0 atoms.

    ``gmm``/``gmm_sha256`` may be passed pre-loaded (simulation); the files are the same.
    """
    from fedalign.files import sha256_file
    from fedalign.gmm import load_gmm

    state_path, atoms_path = Path(state_path), Path(atoms_path)
    if state_path.exists() and not force:
        raise FedalignError(f"{state_path} exists: refusing to overwrite a client state "
                            "(use --force to start over)")
    gmm = load_gmm(gmm_path) if gmm is None else gmm
    sha = sha256_file(gmm_path) if gmm_sha256 is None else gmm_sha256
    st = init_client(client, gmm, n_atoms, seed, n_components, n_classes, lr, min_var,
                     gmm_path=str(gmm_path), gmm_sha256=sha)
    save_atoms(atoms_path, st.published())
    save_state(state_path, st)
    return st


def round_files(state_path, peer_paths, atoms_path, strategy: str = "aggregation",
                local_steps: int = 10, client: str | None = None, gmm_path=None,
                gmm=None, peers: list | None = None) -> tuple[ClientState, dict]:
    """One round from files: everything is read and checked before anything is written.

    Parameters
    ----------
    state_path : the client's state (updated in place, atomically, at the end)
    peer_paths : candidate peers' atoms files (the client's own is ignored)
    atoms_path : where to publish the new atoms
    client : expected client id (a state of another client is an error)
    gmm_path : the client's GMM (default: the path recorded in the state); its SHA-256 must
        match the one recorded at ``--init``
    gmm, peers : pre-loaded GMM / peer atoms (simulation; skips reading those files)
    """
    from fedalign.files import sha256_file
    from fedalign.gmm import load_gmm

    st = load_state(state_path)
    if client is not None and client != st.client:
        raise FedalignError(f"{state_path} is the state of client {st.client}, not {client}")
    if gmm is None:
        gp = Path(gmm_path) if gmm_path is not None else Path(st.gmm_path)
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
    save_atoms(atoms_path, pub)
    save_state(state_path, st)
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
             local_steps: int = 10, n_atoms: int = 3, seed: int = 0, lr: float = 0.1,
             min_var: float = 1e-6, n_components: int | None = None,
             n_classes: int | None = None, progress=None, callback=None,
             keep_history: bool = True) -> dict:
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
    progress : optional callable(k) advanced once per client-round
    callback : optional callable(t, {client: ClientState}) after every round
    keep_history : keep every ``round_XXX`` folder (False: only the last one, for sweeps)

    Returns
    -------
    {client: ClientState} after the last round (``.records`` lists the per-round records).
    """
    from fedalign.files import sha256_file
    from fedalign.gmm import load_gmm

    out_dir = Path(out_dir)
    (out_dir / "state").mkdir(parents=True, exist_ok=True)
    gmms = {c: load_gmm(p) for c, p in gmm_paths.items()}
    shas = {c: sha256_file(p) for c, p in gmm_paths.items()}
    (out_dir / "round_000").mkdir(exist_ok=True)
    published, states, records = {}, {}, {c: [] for c in gmm_paths}
    for c, p in gmm_paths.items():
        sp, ap = federation_paths(out_dir, c, 0)
        states[c] = init_files(c, p, sp, ap, n_atoms, seed, n_components, n_classes, lr, min_var,
                               force=True, gmm=gmms[c], gmm_sha256=shas[c])
        published[c] = states[c].published()
    if callback is not None:
        callback(0, states)
    for t in range(1, int(rounds) + 1):
        (out_dir / f"round_{t:03d}").mkdir(exist_ok=True)
        new_pub = {}
        for c in gmm_paths:
            sp, ap = federation_paths(out_dir, c, t)
            peers = [published[o] for o in gmm_paths if o != c]
            states[c], rec = round_files(sp, [], ap, strategy, local_steps, client=c,
                                         gmm=gmms[c], peers=peers)
            records[c].append(rec)
            new_pub[c] = states[c].published()
            if progress is not None:
                progress(1)
        published = new_pub
        if not keep_history:
            shutil.rmtree(out_dir / f"round_{t - 1:03d}", ignore_errors=True)
        if callback is not None:
            callback(t, states)
    for c in states:
        states[c].records = records[c]
    return states


# --------------------------------------------------------------------------------------------
# The target's classifier
# --------------------------------------------------------------------------------------------


def client_barycenter(st: ClientState, alpha=None, tol: float = 1e-6, max_iter: int = 50):
    """B(α; the client's atoms) as a labeled :class:`~fedalign.gmm.GMM` (α default: its own)."""
    return atoms_barycenter(st.means, st.variances, st.label_logits,
                            st.alpha if alpha is None else alpha, tol=tol, max_iter=max_iter)


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


CLASSIFIERS = ("linear", "map")


def gmm_classifier(gmm, classifier: str = "linear", n_per_class: int = 500, seed: int = 0):
    """A predict function X (n, d) → (n,) from a labeled GMM.

    ``linear``: logistic-regression head trained on ``n_per_class`` labeled samples per class
    (:func:`fedalign.gmm.train_head_from_gmm`); ``map``: the MAP rule
    argmax_c Σ_k P(k | x) V_kc (:func:`fedalign.gmm.map_predict`).
    """
    from fedalign.gmm import map_predict, train_head_from_gmm

    if classifier == "map":
        return lambda X: map_predict(gmm, np.asarray(X, np.float64))
    if classifier != "linear":
        raise FedalignError(f"--classifier must be one of {', '.join(CLASSIFIERS)}, got {classifier!r}")
    head = train_head_from_gmm(gmm, n_per_class=int(n_per_class), seed=int(seed))
    return lambda X: head.predict(np.asarray(X, np.float64))


def target_classifier(st: ClientState, classifier: str = "linear", n_per_class: int = 500,
                      seed: int = 0):
    """The target client's classifier: B(α_T; its atoms) → samples → linear head (or MAP)."""
    return gmm_classifier(client_barycenter(st), classifier, n_per_class, seed)


def source_only_classifier(Xs, ys, seed: int = 0, C: float = 1.0, max_iter: int = 1000):
    """Baseline: standardised logistic regression on the pooled labeled source features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter,
                                                             random_state=int(seed)))
    clf.fit(np.asarray(Xs, np.float64), np.asarray(ys))
    return lambda X: clf.predict(np.asarray(X, np.float64))


def centralized_classifier(gmms: list, target_index: int, n_atoms: int = 3, n_iter: int = 100,
                           lr: float = 0.1, seed: int = 0, classifier: str = "linear",
                           n_per_class: int = 500):
    """Baseline: centralized GMM-DaDiL (:func:`fedalign.dictionary.learn_dictionary`), then
    the same target classifier on B(α_T; atoms). Returns (predict, history)."""
    from fedalign.dictionary import learn_dictionary

    atoms, alphas, hist = learn_dictionary(gmms, target_index, n_atoms=n_atoms, n_iter=n_iter,
                                           lr=lr, seed=seed)
    B = atoms_barycenter(atoms.means, atoms.variances, atoms.label_logits, alphas[target_index])
    return gmm_classifier(B, classifier, n_per_class, seed), hist


def accuracy(predict, X, y) -> float:
    """Fraction of labeled rows (y ≥ 0) predicted correctly."""
    y = np.asarray(y)
    keep = y >= 0
    return float(np.mean(predict(np.asarray(X)[keep]) == y[keep]))

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
   (variance floor, α ∈ Δ) after every step; see :mod:`fedalign.dadil.dictionary` for the steps;
4. write the new private state and publish the atoms file.

The unlabeled target (fedalign preset, a labelled deviation from Algorithm 1): its loss
carries no label information, so steps on it can only move components onto the target's
clusters whatever labels those components carry. It therefore updates α only
(``target_atoms=False``; the reference preset updates its atoms too), and its classifier is
built from the dictionary it received in its last communication with α re-fitted on it
(:func:`refit_received`); see that function for the measurement.

The client's state and the files are :mod:`fedalign.dadil.state`; :func:`round_files` and
:func:`init_files` are what ``fedalign dadil-round`` calls; many clients in one process:
:mod:`fedalign.dadil.simulation`.

References
----------
E. F. Montesuma, R. Castellon, F. M. N. Mboula, A. Mayoue, A. Souloumiac, C. Gouy-Pailler,
"Decentralized Federated Dataset Dictionary Learning for Multi-Source Domain Adaptation",
ICASSP 2025 (DeFed-GMM-DaDiL).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from fedalign import defaults
from fedalign.dadil.atoms import Atoms
from fedalign.dadil.barycenter import labeled_barycenter, softmax
from fedalign.dadil import dictionary
from fedalign.dadil.state import (ClientState, PublishedAtoms, _atoms_arrays, check_gmm_for_state,
                                  check_peer, init_client, load_atoms, load_state, optim_for,
                                  save_atoms, save_state)
from fedalign.errors import FedalignError
from fedalign.files import (atomic_outputs, check_outputs, locked, read_npz, same_file,
                            sha256_file)
from fedalign.gmm import load_gmm

STRATEGIES = ("replacement", "aggregation", "none")
#: Peers drawn per round by each strategy (aggregation: own version + 2 peers' versions).
N_PEERS = {"replacement": 1, "aggregation": 2, "none": 0}
LOGIT_FLOOR = 1e-12


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
    n = len(versions)
    A, K, _ = versions[0][0].shape
    w = np.full(n, 1.0 / n)
    out_m, out_v, out_l = [], [], []
    for a in range(A):
        M = np.stack([v[0][a] for v in versions])
        V = np.stack([v[1][a] for v in versions])
        L = np.stack([softmax(v[2][a]) for v in versions])
        B = labeled_barycenter(w, M, V, L, n_components=K, tol=tol, max_iter=max_iter)
        out_m.append(B.means)
        out_v.append(B.variances)
        out_l.append(np.log(np.maximum(B.labels, LOGIT_FLOOR)))
    return np.stack(out_m), np.stack(out_v), np.stack(out_l)


def communicate(st: ClientState, peers: list, strategy: str) -> dict:
    """Apply the strategy in place (peers already checked); return a record of what was done.

    Aggregation averages the client's own version and its two peers' versions of every atom,
    with equal weights (also for a target that moves α only: its copy is the relay of earlier
    aggregates; leaving it out measured 36.3 % against 38.8 % with it on the quick-start demo
    digits, within the noise of 60 test rows, so Algorithm 1 is kept as written)."""
    if strategy not in STRATEGIES:
        raise FedalignError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
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
    :func:`fedalign.dadil.dictionary.local_steps` (losses, α after every step, step sizes)."""
    if int(n_steps) < 0:
        raise FedalignError(f"the number of local steps must be ≥ 0, got {n_steps}")
    if int(n_steps) == 0:
        return dict(losses=[], alpha=[st.alpha.tolist()], step_mean=[], step_std=[])
    atoms = Atoms(st.means, st.variances, st.label_logits)
    update_atoms = gmm.labeled or bool(st.settings.get("target_atoms", True))
    steps = dictionary.local_steps(atoms, st.alpha, gmm, int(n_steps), optim_for(st),
                                   labeled=gmm.labeled, update_atoms=update_atoms)
    st.means, st.variances, st.label_logits = _atoms_arrays(steps.atoms)
    st.alpha = np.array(steps.alpha, dtype=np.float64)
    return steps.record


#: Newton iterations of the target's α re-fit on the dictionary it received, and the relative
#: loss decrease below which it stops (measured on Office-Caltech10 webcam, seed 0, 20 rounds:
#: past the first 2–3 steps the iterations gained ≈ 1e-5 each for 5–7 evaluations of the loss).
REFIT_STEPS = 20
REFIT_RTOL = 1e-4


def refit_received(st: ClientState, gmm, received: tuple) -> None:
    """Keep the dictionary the unlabeled target received, and α re-fitted on it (in place).

    The target's own steps minimise MW2²(Q_T, B(α_T)), which carries no label information:
    they move components onto the target's clusters whatever labels those components carry.
    Measured on Office-Caltech10 (webcam, seed 0, 5 rounds of aggregation, the target updating
    its atoms as in Algorithm 1, during development), a classifier on B(α_T) after those steps
    scored 58.6 % against 81.0 % on the dictionary received just before them. The target
    therefore still publishes its updated atoms (Algorithm 1), but builds its classifier on
    the received dictionary, with α_T re-fitted on it by
    :func:`fedalign.dadil.dictionary.fit_alpha` (projected Newton, from the current α_T).
    """
    fit = dictionary.fit_alpha(Atoms(*received), gmm, REFIT_STEPS, labeled=False,
                               alpha0=st.alpha, rule="newton", rtol=REFIT_RTOL)
    st.received, st.alpha_received = received, fit.alpha


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
                 local_steps: int = defaults.LOCAL_STEPS) -> tuple[ClientState, PublishedAtoms, dict]:
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
    state_path, atoms_path = Path(state_path), Path(atoms_path)
    check_outputs([gmm_path], [atoms_path, state_path])
    if state_path.exists() and not force:
        raise FedalignError(f"{state_path} exists: refusing to overwrite a client state "
                            "(use --force to start over)")
    lock = (locked(state_path, "another dadil-round") if state_path.is_file()
            else contextlib.nullcontext())
    with lock:
        gmm = load_gmm(gmm_path) if gmm is None else gmm
        sha = sha256_file(gmm_path) if gmm_sha256 is None else gmm_sha256
        st = init_client(client, gmm, gmm_path=str(gmm_path), gmm_sha256=sha, **init_options)
        publish(state_path, st, atoms_path)
    return st


def publish(state_path: Path, st: ClientState, atoms_path: Path,
            republish: tuple | None = None) -> None:
    """Write the state and its atoms as one transaction, the state renamed first.

    The state records the atoms file it publishes (path relative to its folder, SHA-256,
    round): a kill between the two renames leaves a state whose atoms file is missing or
    stale, which the next :func:`round_files` on this state detects and republishes.
    ``republish``: ``(path, PublishedAtoms)``, that earlier atoms file, written in the same
    transaction and renamed before the state (a kill after it leaves it repaired and the old
    state in place).
    """
    with atomic_outputs(join=False) as tx:
        if republish is not None:
            save_atoms(*republish)
        save_atoms(atoms_path, st.published())
        sha = sha256_file(tx.temporary(atoms_path))
        rel = os.path.relpath(os.path.abspath(atoms_path), os.path.abspath(state_path.parent))
        save_state(state_path, st, dict(path=rel, sha256=sha, round=int(st.round)))
        tx.commit_first(state_path)
        if republish is not None:
            tx.commit_first(republish[0])


def round_files(state_path, peer_paths, atoms_path, strategy: str = "aggregation",
                local_steps: int = defaults.LOCAL_STEPS, *, client: str | None = None, gmm_path=None,
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

    The state and the new atoms are written together (:func:`publish`); an atoms file the
    state published in an earlier, killed run but that is missing or stale is republished in
    the same transaction, renamed first (``rec["republished"]``): a run that fails on its
    inputs writes nothing, the repair included. Where the new atoms go to that very path they
    replace it, and nothing is republished.
    """
    state_path, atoms_path = Path(state_path), Path(atoms_path)
    if int(local_steps) < 0:
        raise FedalignError(f"local_steps must be ≥ 0, got {local_steps}", param="local_steps")
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
        republish = None  # (path, atoms) of a lost or stale earlier publication
        pub_rec = read_npz(state_path, "state")[1].get("published")
        if isinstance(pub_rec, dict) and isinstance(pub_rec.get("path"), str):
            prev = state_path.parent / pub_rec["path"]
            published = prev.is_file() and sha256_file(prev) == pub_rec.get("sha256")
            if prev.parent.is_dir() and not published and not same_file(prev, atoms_path):
                republish = (prev, st.published())
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
        peers = dedupe(peers)
        st, pub, rec = gossip_round(st, gmm, peers, strategy, local_steps)
        publish(state_path, st, atoms_path, republish)
        if republish is not None:
            rec = dict(rec, republished=str(republish[0]))
    return st, rec


def dedupe(peers: list) -> list:
    """One atoms version per producer: the latest round (two files of one round are an error)."""
    best: dict = {}
    for p in peers:
        q = best.get(p.producer)
        if q is not None and q.round == p.round:
            if not all(np.array_equal(getattr(q, k), getattr(p, k))
                       for k in ("means", "variances", "label_logits")):
                raise FedalignError(f"two different atoms files from {p.producer} for round "
                                    f"{p.round}")
        if q is None or p.round > q.round:
            best[p.producer] = p
    return [best[k] for k in sorted(best)]


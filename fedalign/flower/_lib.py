"""The library functions the Flower app calls — every import from the rest of fedalign is here.

The app itself holds no method: statistics come from :mod:`fedalign.stats`, the barycenter and
the maps from :mod:`fedalign.align` / :mod:`fedalign.gaussian`, the heads from
:mod:`fedalign.heads`, the DeFed-GMM-DaDiL rounds from the file-level round API of
:mod:`fedalign.dadil` (what ``fedalign dadil-round`` calls); the run config is read with the
command line's grammar (:mod:`fedalign.grammar`, :func:`fedalign.evaluate.check_seeds` /
:func:`~fedalign.evaluate.check_params`) and its defaults (:mod:`fedalign.defaults`), and the
reports are the library's (:mod:`fedalign.results`, :func:`fedalign.files.write_report`).
When modules move, only this file changes; no other module of :mod:`fedalign.flower` imports
the rest of fedalign (``tests/test_architecture.py`` checks it). One import waits for its first
call: :mod:`fedalign.dp` (:func:`config_record`), which loads ``scipy.optimize``, a cost a
node's start-up need not pay.

Small adapters live here because the library has no function of that shape yet (each is a
candidate to move into the library):

- :func:`client_gaussian` — a client's Gaussian proxy from the arrays of its stats message
  (n, mean, covariance; no moment sums), as :func:`fedalign.align.load_client_stats` holds a
  stats file for the barycenter;
- :func:`relay_round` — one gossip round whose peers were drawn *before* their atoms arrived
  (a relay forwards only the atoms a client asked for). The library's round draws its peers
  inside ``communicate`` (:mod:`fedalign.dadil.gossip`) from the full candidate pool; the
  adapter gives it that pool — the forwarded atoms for the named peers and, for the others,
  stand-ins of the right shape and round that the client's own generator does not pick
  (checked after the round). The library could instead take ``chosen=`` peers (a ``draw_peers`` /
  ``apply_strategy`` split of ``communicate``).
- :func:`head_client_update` / :func:`head_server_aggregate` — one round of a head, the
  client's and the server's halves of
  :func:`fedalign.heads.run_method`'s loop (server_init → client_update with
  ``round_seed(seed, k, r)`` → server_aggregate → next_init); the client's half is
  :func:`fedalign.heads.client_message`, which ``run_method`` calls too.
"""

from __future__ import annotations

import numpy as np

from fedalign.align import (Reference, client_map, load_map, make_reference, save_map,
                            save_reference)
from fedalign.align import align_file, map_provenance
from fedalign.defaults import LOCAL_STEPS, N_ATOMS, TAU, check_seed
from fedalign.errors import FedalignError
from fedalign.evaluate import check_params, check_seeds, privacy_lines, privacy_of
from fedalign.files import (atomic_outputs, check_spd, read_features, read_npz, sha256_file,
                            write_report)
from fedalign.gmm import fit_gmm_file
from fedalign.label_shift import class_message, reference_from_messages
from fedalign.linalg import SYMMETRY_RTOL
from fedalign.gaussian import check_tau
from fedalign.grammar import parse_bool, parse_params, parse_seeds, parse_shrinkage
from fedalign.heads import LinearHead, client_message, get_method, message_keys
from fedalign.results import MethodResult, json_safe
from fedalign.stats import GaussianStats, compute_stats, load_stats, save_stats

# DeFed-GMM-DaDiL (the file-level round API; the only DaDiL imports of the app)
from fedalign.dadil import (N_PEERS, STRATEGIES, PublishedAtoms, check_client_id,
                            choose_peers, federation_paths, init_files, limit_threads,
                            load_atoms, load_state, rng_from_array, rng_to_array, round_files)
from fedalign.dadil import evaluate_target_files

__all__ = [
    "FedalignError", "GaussianStats", "LOCAL_STEPS", "LinearHead", "MethodResult",
    "N_ATOMS",
    "N_PEERS", "PublishedAtoms", "Reference", "STRATEGIES", "SYMMETRY_RTOL", "TAU", "align_file",
    "atomic_outputs", "check_client_id", "check_params", "check_seed", "check_seeds", "check_spd",
    "check_tau", "class_message", "client_gaussian", "client_map", "compute_stats",
    "config_record", "draw_peers", "evaluate_target_files", "federation_paths",
    "fit_gmm_file", "get_method", "head_client_update", "head_config", "head_message_keys",
    "head_rounds", "head_server_aggregate", "head_server_init", "init_files", "json_safe",
    "limit_threads", "load_atoms", "load_map", "load_state", "load_stats", "make_reference",
    "map_provenance", "parse_bool", "parse_params", "parse_seeds", "parse_shrinkage",
    "privacy_lines", "privacy_of", "read_features", "read_npz", "reference_from_messages",
    "relay_round", "save_map", "save_reference", "save_stats", "sha256_file", "write_report",
]


def config_record(cfg) -> dict:
    """:func:`fedalign.dp.config_record` of a head's config (:mod:`fedalign.dp` is imported
    here, at the first call: it loads ``scipy.optimize``)."""
    from fedalign.dp import config_record as record

    return record(cfg)


# --------------------------------------------------------------------------------------------
# SLOT-Align: a client's Gaussian from its stats message
# --------------------------------------------------------------------------------------------


def client_gaussian(n, mean, covariance, shrinkage, class_names) -> GaussianStats:
    """A client's Gaussian proxy from the arrays of its stats message, as the server holds it
    for :func:`fedalign.align.make_reference`: n, mean and covariance in float64, the
    shrinkage it reported, no moment sums (what :func:`fedalign.align.load_client_stats`
    keeps of a stats file). The caller has checked the arrays (shapes, finite, SPD)."""
    return GaussianStats(int(n), np.asarray(mean, float), np.asarray(covariance, float),
                         float(shrinkage), None, list(class_names))


# --------------------------------------------------------------------------------------------
# Heads: run_method's loop, split into the server's and the client's halves
# --------------------------------------------------------------------------------------------


def head_config(method: str, params: dict | None):
    """(module, Config) of a registered head; refuses what a relayed run cannot do."""
    m = get_method(method)
    mod, cfg = m.load(), m.config(params or {})
    if getattr(cfg, "tau_schedule", "fixed") != "fixed":
        raise FedalignError(f"{method}: tau_schedule={cfg.tau_schedule} trains through the "
                            "client's map (transport layer); the Flower app runs heads on the "
                            "aligned features only (tau_schedule=fixed)")
    return mod, cfg


def head_rounds(method: str, params: dict | None) -> int:
    """Rounds R of a head (``config.rounds``, 1 for one-shot heads)."""
    return int(getattr(head_config(method, params)[1], "rounds", 1))


def head_server_init(method: str, params: dict | None, d: int, n_classes: int, seed: int):
    """The broadcast before round 0 (O-FedAvg's common start), or None."""
    mod, cfg = head_config(method, params)
    return mod.server_init(d, n_classes, cfg, seed) if hasattr(mod, "server_init") else None


def head_client_update(method: str, params: dict | None, X, y, n_classes: int, seed: int, k: int,
                       r: int, init) -> dict:
    """Client k's message of round r (exactly what :func:`fedalign.heads.run_method` computes)."""
    mod, cfg = head_config(method, params)
    return client_message(mod, method, X, y, n_classes, cfg, seed, k, r, init)


def head_message_keys(method: str) -> tuple:
    """The keys a client message of this head may carry."""
    return message_keys(get_method(method).load())


def head_server_aggregate(method: str, params: dict | None, messages: list, n_classes: int,
                          seed: int, r: int, rounds: int):
    """(head, next broadcast or None) after round r."""
    mod, cfg = head_config(method, params)
    head = mod.server_aggregate(messages, n_classes, cfg, seed)
    nxt = mod.next_init(head, r + 1) if r + 1 < rounds and hasattr(mod, "next_init") else None
    return head, nxt


# --------------------------------------------------------------------------------------------
# DeFed-GMM-DaDiL: peers drawn by the client, atoms relayed
# --------------------------------------------------------------------------------------------


def draw_peers(state, candidates, strategy: str) -> list:
    """The peers the client's next round will draw, without moving its generator.

    The round itself (``communicate`` in :mod:`fedalign.dadil.gossip`) draws
    ``N_PEERS[strategy]`` of the candidates (other clients, sorted by id) with the state's
    generator; this draws the same from a copy of it.
    """
    if strategy not in STRATEGIES:
        raise FedalignError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    pool = sorted(c for c in set(candidates) if c != state.client)
    rng = rng_from_array(rng_to_array(state.rng))
    return list(choose_peers(rng, pool, N_PEERS[strategy]))


def relay_round(state_path, atoms_path, strategy: str, local_steps: int, client: str,
                gmm_path, candidates, forwarded: dict):
    """One gossip round from the atoms a relay forwarded (files as ``dadil-round`` writes them).

    Parameters
    ----------
    candidates : ids of the clients that published the previous round's atoms (the pool the
        file pipeline's ``round_XXX/*.atoms.npz`` would hold)
    forwarded : {peer id: :class:`PublishedAtoms`} — the peers this client named

    Returns
    -------
    (state, record) of :func:`fedalign.dadil.round_files`.
    """
    st = load_state(state_path)
    pool = []
    for c in sorted(set(candidates) - {client}):
        if c in forwarded:
            pool.append(forwarded[c])
        else:  # never drawn (the same generator draws the same peers); shape and round only
            pool.append(PublishedAtoms(st.means, st.variances, st.label_logits, st.round, c))
    named = sorted(forwarded)
    st, rec = round_files(state_path, [], atoms_path, strategy, local_steps, client=client,
                          gmm_path=gmm_path, peers=pool)
    if sorted(rec["peers"]) != named:  # the draw did not match the names: a protocol bug
        raise RuntimeError(f"{client}: the round drew peers {rec['peers']}, the relay forwarded "
                           f"{named}")
    return st, rec


"""Many DeFed-GMM-DaDiL clients in one process: the same files as the CLI path.

:func:`simulate` runs N clients × R synchronous rounds through the file-level round API of
:mod:`fedalign.dadil.gossip` (what ``fedalign dadil-round`` calls), keeping the GMMs and the
peers' atoms in memory between rounds; :func:`federation_paths` is the folder layout a
simulated or Makefile-driven federation uses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fedalign import defaults
from fedalign.dadil.gossip import dedupe, gossip_round, init_files, publish, round_files
from fedalign.dadil.state import save_atoms
from fedalign.files import (atomic_outputs, make_output_folder, move_in, sha256_file,
                            staging_folder)
from fedalign.gmm import load_gmm


def federation_paths(out_dir, client: str, t: int) -> tuple[Path, Path]:
    """Layout of a simulated (or Makefile-driven) federation: state and round-t atoms paths."""
    out_dir = Path(out_dir)
    return (out_dir / "state" / f"{client}.state.npz",
            out_dir / f"round_{t:03d}" / f"{client}.atoms.npz")


def simulate(gmm_paths: dict, out_dir, rounds: int, strategy: str = "aggregation",
             local_steps: int = defaults.LOCAL_STEPS, *, progress=None, callback=None, keep_history: bool = True,
             in_memory: bool = False, **init_options) -> dict:
    """Run N clients × R synchronous rounds in one process, writing the CLI's files.

    Round t of every client reads the round t−1 atoms of all other clients
    (``out_dir/round_{t-1:03d}/*.atoms.npz``). The files written are byte-identical to
    ``fedalign dadil-round --init`` followed by R ``fedalign dadil-round`` calls with the same
    arguments and paths (and thread counts: the CLI uses :func:`fedalign.threads.limit_threads`,
    default 1); GMMs and peer atoms are just kept in memory between rounds.

    With ``in_memory`` the states stay in memory too: every round is
    :func:`~fedalign.dadil.gossip.gossip_round` on them, and the files are written once, after
    the last round (the states and that round's atoms; with ``keep_history`` every round's
    atoms as well). Those files are byte-identical to the CLI's (tested); what is skipped is
    reading, checking and rewriting every state every round, about a quarter of a sweep's time
    on Office-Caltech10 features (d = 1280).

    Parameters
    ----------
    gmm_paths : {client id: GMM file}
    out_dir : federation folder (``state/`` and ``round_XXX/`` are created)
    init_options : :func:`~fedalign.dadil.state.init_client`'s options (n_atoms, seed, preset,
        shared_init, …)
    progress : optional callable(k) advanced once per client-round
    callback : optional callable(t, {client: ClientState}) after every round
    keep_history : keep every ``round_XXX`` folder (False: only the last one, for sweeps)

    Returns
    -------
    {client: ClientState} after the last round (``.history`` lists the per-round records).

    All files appear in ``out_dir`` together when the run has finished, or none (an error, a
    signal): the run writes into a staging folder next to ``out_dir``
    (:func:`fedalign.files.staging_folder`), whose files are then moved in as one transaction
    (joining an enclosing one, e.g. the ``dadil-simulate`` command's), states first.
    """
    out_dir = Path(out_dir)
    with atomic_outputs():  # joins the caller's transaction, if one is open
        make_output_folder(out_dir)  # (and its missing parents: removed again on failure)
        stage = staging_folder(out_dir)
        try:
            with atomic_outputs(join=False):  # the rounds' own commits land in the stage
                states = _simulate(gmm_paths, stage, rounds, strategy, local_steps, progress,
                                   callback, keep_history, in_memory, init_options)
            move_in(stage, out_dir, first=lambda rel: rel.parts[0] == "state")
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return states


def _simulate(gmm_paths, out_dir: Path, rounds, strategy, local_steps, progress, callback,
              keep_history, in_memory, init_options) -> dict:
    """The rounds of :func:`simulate`, written into ``out_dir`` (its staging folder)."""
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
    rounds = int(rounds)
    for t in range(1, rounds + 1):
        (out_dir / f"round_{t:03d}").mkdir(exist_ok=True)
        new_pub = {}
        for c in gmm_paths:
            sp, ap = federation_paths(out_dir, c, t)
            peers = [published[o] for o in gmm_paths if o != c]
            if in_memory:
                states[c], new_pub[c], _ = gossip_round(states[c], gmms[c], dedupe(peers),
                                                        strategy, local_steps)
                if t == rounds:
                    publish(sp, states[c], ap)
                elif keep_history:
                    save_atoms(ap, new_pub[c])
            else:
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


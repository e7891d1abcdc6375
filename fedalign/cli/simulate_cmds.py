"""``dadil-simulate``: a whole DeFed-GMM-DaDiL gossip federation in one process.

The library is :func:`fedalign.dadil.simulation.simulate` (``in_memory``): its files are
byte-identical to ``dadil-round --init`` followed by R ``dadil-round`` calls per client (tested),
in one process instead of N × (R + 1), each of which spends most of its time importing numpy,
SciPy and POT. This module names the clients, checks the options (those of
``dadil-round --init``, declared and checked in :mod:`fedalign.cli.dadil_cmds`), and writes
the federation folder as one transaction (the library stages the run next to the output and
moves its files in together, or not at all) and removes an earlier federation's files that
the run did not write (``--force``).
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import List, Optional

import typer

from fedalign import defaults
from fedalign.cli.app import command
from fedalign.cli.console import err, progress_bar
from fedalign.cli.dadil_cmds import STRATEGY_CHOICES, init_option
from fedalign.cli.options import choice_option, output_option, threads_option

#: The round folders of a federation (``round_000``, … as
#: :func:`fedalign.dadil.simulation.federation_paths` names them).
ROUND_FOLDER = re.compile(r"round_\d{3,}")


def parse_clients(specs) -> dict:
    """{client id: GMM path} of ``CLIENT=PATH`` or bare ``PATH`` arguments (the id of a bare
    path is its file name up to the first ``.``: ``ink.gmm.npz`` → ``ink``). Refused: an id
    given twice, fewer than 2 clients, a GMM that is not a file."""
    from fedalign.dadil.state import check_client_id
    from fedalign.errors import FedalignError

    clients: dict = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq:
            name, path = Path(spec).name.split(".")[0], spec
        if not path:
            raise FedalignError(f"{spec!r}: no GMM file after '='")
        check_client_id(name)
        if name in clients:
            raise FedalignError(f"client {name} given twice ({clients[name]}, {path}): "
                                "name the clients CLIENT=PATH")
        clients[name] = Path(path)
    if len(clients) < 2:
        raise FedalignError(f"a federation needs at least 2 clients, got {len(clients)}")
    for p in clients.values():
        if not p.is_file():
            raise FedalignError(f"no such file: {p}" if not p.exists() else f"not a file: {p}")
    return clients


def federation_files(folder: Path) -> Optional[list]:
    """The state and atoms files of the federation in ``folder`` (``state/*.state.npz``,
    ``round_XXX/*.atoms.npz``), or None when it holds no ``state/`` or ``round_XXX/`` folder."""
    if not folder.is_dir():
        return None
    rounds = [p for p in folder.iterdir() if p.is_dir() and ROUND_FOLDER.fullmatch(p.name)]
    if not rounds and not (folder / "state").exists():
        return None
    files = sorted((folder / "state").glob("*.state.npz"))
    return files + sorted(f for r in rounds for f in r.glob("*.atoms.npz"))


def _prune(output: Path, stale: list) -> None:
    """Remove an earlier federation's files this run did not write, and round folders left
    empty (after the commit; a file that cannot be removed stays)."""
    for p in stale:
        with contextlib.suppress(OSError):
            p.unlink()
    for folder in {p.parent for p in stale} - {output / "state"}:
        with contextlib.suppress(OSError):
            folder.rmdir()
    err.print(f"dadil-simulate: removed {len(stale)} files of the earlier federation in {output}")


@command("dadil-simulate", folders=("output",),
         epilog="Example: fedalign dadil-simulate ink=ink.gmm.npz neon=neon.gmm.npz "
                "blocky=blocky.gmm.npz -o fed/aggregation --rounds 4 --strategy aggregation "
                "--local-steps 5 --n-components 20\n\n"
                "Then: fedalign consensus aggregation=fed/aggregation -o consensus.json")
def dadil_simulate_cmd(
    gmms: List[str] = typer.Argument(..., metavar="GMM", help="[CLIENT=]PATH: a client's GMM (from fit-gmm), one per client; without CLIENT= the id is the file name up to its first '.' (ink.gmm.npz → ink)."),
    output: Path = output_option("Federation folder (created): state/<client>.state.npz and round_XXX/<client>.atoms.npz for rounds 0…R."),
    rounds: int = typer.Option(..., "--rounds", min=1, help="Synchronous rounds R (round t of every client reads the round t−1 atoms of all the others)."),
    strategy: str = choice_option("aggregation", "--strategy", STRATEGY_CHOICES, "replacement, aggregation or none."),
    local_steps: int = typer.Option(defaults.LOCAL_STEPS, "--local-steps", "-E", min=0, help="Local optimisation steps on each client's own loss per round."),
    n_atoms: int = init_option("n_atoms"),
    n_components: Optional[int] = init_option("n_components"),
    n_classes: Optional[int] = init_option("n_classes"),
    preset: str = init_option("preset"),
    optimizer: Optional[str] = init_option("optimizer"),
    lr: Optional[float] = init_option("lr"),
    alpha_rule: Optional[str] = init_option("alpha_rule"),
    lr_alpha: Optional[float] = init_option("lr_alpha"),
    lr_decay: Optional[float] = init_option("lr_decay"),
    var_floor_rel: Optional[float] = init_option("var_floor_rel"),
    min_var: Optional[float] = init_option("min_var"),
    shared_init: bool = init_option("shared_init"),
    seed: int = init_option("seed"),
    force: bool = typer.Option(False, "--force", help="Write into a folder that already holds a federation (state/, round_XXX/): its files are replaced, and those this run does not write (other clients, later rounds) removed once the new ones are in place."),
    threads: int = threads_option(),
):
    """A whole DeFed-GMM-DaDiL gossip federation in one process: N clients × R rounds.

    Writes OUTPUT/state/<client>.state.npz and OUTPUT/round_XXX/<client>.atoms.npz for rounds
    0…R: byte for byte the files of dadil-round --init followed by R synchronous dadil-round
    calls per client with the same options (round t of every client reads the round t−1 atoms
    of all the others), the layout consensus and dadil-evaluate read — in one process instead
    of N × (R + 1). The options are those of dadil-round. All files appear together when the
    run has finished, or none; a folder that already holds a federation needs --force.
    """
    from fedalign.dadil.gossip import describe_round
    from fedalign.dadil.simulation import federation_paths, simulate
    from fedalign.errors import FedalignError
    from fedalign.files import after_commit, check_outputs, make_output_folder
    from fedalign.threads import limit_threads

    clients = parse_clients(gmms)
    old = federation_files(output)
    if old is not None and not force:
        raise FedalignError(f"{output} already holds a federation (state/ or round_XXX/): "
                            "use --force to replace it")
    written = ([federation_paths(output, c, 0)[0] for c in clients]
               + [federation_paths(output, c, t)[1] for t in range(rounds + 1) for c in clients])
    check_outputs(list(clients.values()), written)
    limit_threads(threads)
    t0 = time.perf_counter()
    make_output_folder(output)
    with progress_bar(len(clients) * rounds, "dadil-simulate", unit="client-rounds") as bar:
        states = simulate(  # staged, then moved into the command's transaction
            clients, output, rounds, strategy, local_steps, progress=bar,
            keep_history=True, in_memory=True, n_atoms=n_atoms, seed=seed,
            n_components=n_components, n_classes=n_classes, preset=preset,
            shared_init=shared_init, optimizer=optimizer, lr=lr, alpha_rule=alpha_rule,
            lr_alpha=lr_alpha, var_floor_rel=var_floor_rel, min_var=min_var, lr_decay=lr_decay)
    kept = set(written)
    stale = [p for p in old or [] if p not in kept]
    if stale:
        after_commit(lambda: _prune(output, stale))
    for st in states.values():
        err.print(f"dadil-simulate: {describe_round(st, st.history[-1])}")
    A, K, d, C = next(iter(states.values())).shape
    err.print(f"dadil-simulate: {len(states)} clients (A={A} K={K} d={d} C={C}, preset {preset}) "
              f"× {rounds} rounds of {strategy}, E={local_steps} "
              f"({time.perf_counter() - t0:.1f}s) → {output}")

"""``dadil-round``, ``consensus`` and ``dadil-evaluate``: DeFed-GMM-DaDiL without a server.

The library is :mod:`fedalign.dadil`: rounds :func:`fedalign.dadil.gossip.init_files` /
:func:`~fedalign.dadil.gossip.round_files`, consensus :mod:`fedalign.dadil.consensus`, the
evaluation :func:`fedalign.dadil.evaluation.evaluate_target_files` and its report
:func:`~fedalign.dadil.evaluation.target_report` (also behind ``fedalign evaluate --method
dadil``); this module checks and names its own options, and prints. A fresh client's
options (:data:`INIT_OPTIONS`; the parser checks their words, :data:`INIT_CHOICES`) are shared
with ``dadil-simulate`` (:mod:`fedalign.cli.simulate_cmds`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from fedalign import defaults
from fedalign.cli.app import command
from fedalign.cli.console import err, out, progress_bar
from fedalign.cli.options import (choice_option, json_option, output_option, seeds_option,
                                  threads_option)
from fedalign.cli.runtime import guard_outputs


def _threads(n: int) -> None:
    """Torch and BLAS threads (:func:`fedalign.threads.limit_threads`): the matrices of one
    round are small, and on a loaded machine one thread is ~10× faster than several."""
    from fedalign.threads import limit_threads

    limit_threads(n)


#: The DaDiL presets (:data:`fedalign.dadil.optim.PRESETS`), whose values the help quotes.
_FED, _REF = defaults.DADIL_PRESETS["fedalign"], defaults.DADIL_PRESETS["reference"]

#: The options of a fresh client, shared by ``dadil-round --init`` and ``dadil-simulate``
#: (:mod:`fedalign.cli.simulate_cmds`): {parameter: (default, flag, help)}.
INIT_OPTIONS = {
    "n_atoms": (defaults.N_ATOMS, "--n-atoms", "Number of atoms A."),
    "n_components": (None, "--n-components", "Components per atom K (default: the GMM's K)."),
    "n_classes": (None, "--n-classes", "Classes C for an unlabeled GMM without class names."),
    "preset": ("fedalign", "--preset", "fedalign (scale-free gradient steps, α by projected "
               f"Newton, floor {100 * _FED['var_floor_rel']:g} % of the data variance) or "
               f"reference (GMM-DaDiL code: Adam lr {_REF['lr']:g}, α projected, min_var "
               f"{_REF['min_var']:g})."),
    "optimizer": (None, "--optimizer", "gd or adam (default: the preset's)."),
    "lr": (None, "--lr", "Step size (gd: fraction of the residual per step; adam: absolute); "
           f"default: the preset's (fedalign {_FED['optimizer']} {_FED['lr']:g}, reference "
           f"{_REF['optimizer']} {_REF['lr']:g})."),
    "alpha_rule": (None, "--alpha-rule", "newton, projected or eg (default: the preset's)."),
    "lr_alpha": (None, "--lr-alpha", "Step of the α rule (default: the preset's: fedalign "
                 f"{_FED['lr_alpha']:g}, reference {_REF['lr_alpha']:g})."),
    "lr_decay": (None, "--lr-decay", "The atoms' step in round t is lr / (1 + lr_decay·(t − 1)) "
                 f"(default: the preset's: fedalign {_FED['lr_decay']:g}, reference "
                 f"{_REF['lr_decay']:g})."),
    "var_floor_rel": (None, "--var-floor-rel", "Variance floor as a fraction of the client's "
                      f"per-dimension data variance (fedalign preset: {_FED['var_floor_rel']:g})."),
    "min_var": (None, "--min-var", f"Absolute variance floor instead (reference preset: "
                f"{_REF['min_var']:g})."),
    "shared_init": (False, "--shared-init", "Every client starts from the same N(0, I) atoms drawn from --seed alone (the earlier behaviour; M_ij(0) = 0)."),
    "seed": (0, "--seed", "Federation seed; each client's initial atoms and peer choices depend on it and on the client id."),
}

#: The words of the choice options, checked by the parser (:func:`choice_option`): a tuple or
#: the library's constant, ``"module:NAME"``.
INIT_CHOICES = {"preset": "fedalign.defaults:DADIL_PRESETS",
                "optimizer": "fedalign.dadil.optim:OPTIMIZERS",
                "alpha_rule": "fedalign.dadil.optim:ALPHA_RULES"}

#: The words of ``--strategy`` (dadil-round, dadil-simulate).
STRATEGY_CHOICES = "fedalign.dadil.gossip:STRATEGIES"

#: The ranges the parser checks (typer's ``min``/``max``). The open ones (``--lr``,
#: ``--lr-alpha``, the variance floors: > 0) are the library's to check.
INIT_RANGES = {"n_atoms": dict(min=1), "n_components": dict(min=1), "n_classes": dict(min=1),
               "lr_decay": dict(min=0), "seed": dict(min=0, max=defaults.MAX_SEED)}


def init_option(name: str, prefix: str = ""):
    """The typer option of :data:`INIT_OPTIONS` ``name`` (with its :data:`INIT_RANGES`); a
    ``prefix`` (``"--init: "``) is put before its help, whose first letter is then lower-case."""
    default, flag, text = INIT_OPTIONS[name]
    if prefix:
        text = prefix + text[:1].lower() + text[1:]
    if name in INIT_CHOICES:
        return choice_option(default, flag, INIT_CHOICES[name], text)
    return typer.Option(default, flag, help=text, **INIT_RANGES.get(name, {}))



@command("dadil-round",
         epilog="Example: fedalign dadil-round --init --client amazon --gmm amazon.gmm.npz "
                "--state amazon.state.npz -o r000/amazon.atoms.npz\n\n"
                "Then per round: fedalign dadil-round --state amazon.state.npz --strategy aggregation "
                "--local-steps 10 -o r001/amazon.atoms.npz r000/*.atoms.npz")
def dadil_round_cmd(
    peers: Optional[List[Path]] = typer.Argument(None, help="Candidate peers' atoms files (.npz); the client's own is ignored."),
    state: Path = typer.Option(..., "--state", help="The client's private state file (read and updated in place; written by --init)."),
    output: Path = output_option("Atoms file to publish (.npz)."),
    peer: Optional[List[Path]] = typer.Option(None, "--peer", help="A peer's atoms file (repeatable; same as the positional files)."),
    init: bool = typer.Option(False, "--init", help="Start a fresh client: its own seeded atoms (fedalign preset: around its own data's per-dimension mean and spread; reference: N(0, I)), uniform labels, α uniform."),
    client: Optional[str] = typer.Option(None, "--client", help="Client id (required with --init; otherwise checked against the state)."),
    gmm: Optional[Path] = typer.Option(None, "--gmm", help="The client's GMM (from fit-gmm; required with --init, default: the one recorded in the state)."),
    strategy: str = choice_option("aggregation", "--strategy", STRATEGY_CHOICES, "replacement, aggregation or none."),
    local_steps: int = typer.Option(defaults.LOCAL_STEPS, "--local-steps", "-E", min=0, help="Local optimisation steps on the client's own loss per round."),
    n_atoms: int = init_option("n_atoms", "--init: "),
    n_components: Optional[int] = init_option("n_components", "--init: "),
    n_classes: Optional[int] = init_option("n_classes", "--init: "),
    preset: str = init_option("preset", "--init: "),
    optimizer: Optional[str] = init_option("optimizer", "--init: "),
    lr: Optional[float] = init_option("lr", "--init: "),
    alpha_rule: Optional[str] = init_option("alpha_rule", "--init: "),
    lr_alpha: Optional[float] = init_option("lr_alpha", "--init: "),
    lr_decay: Optional[float] = init_option("lr_decay", "--init: "),
    var_floor_rel: Optional[float] = init_option("var_floor_rel", "--init: "),
    min_var: Optional[float] = init_option("min_var", "--init: "),
    shared_init: bool = init_option("shared_init", "--init: "),
    seed: int = init_option("seed", "--init: "),
    force: bool = typer.Option(False, "--force", help="--init: overwrite an existing state."),
    threads: int = threads_option(),
):
    """One DeFed-GMM-DaDiL gossip round for one client (or --init).

    Reads the client's state and GMM and the peers' atoms; draws peers with the client's own
    seeded generator; communicates (replacement: adopt one peer's atoms; aggregation: each atom
    becomes the equal-weight labeled Wasserstein barycenter of its own and two peers' versions,
    components matched by OT; none); runs E local steps on SMW2² (labeled source) or MW2²
    (unlabeled target), the optimiser restarted; then publishes the atoms (means, variances, label logits, round,
    producer — never α, the GMM or samples) and updates the private state. Any bad input
    leaves every file untouched (an atoms file a killed run lost is republished only with a
    successful round).
    """
    from fedalign.dadil.gossip import describe_round, init_files, round_files
    from fedalign.errors import FedalignError

    paths = list(peers or []) + list(peer or [])
    # the state is updated in place (atomically): it is the one input that is also an output
    guard_outputs(paths + [gmm, state], [output, state], allow=[state])
    _threads(threads)
    t0 = time.perf_counter()
    if init:
        if client is None or gmm is None:
            raise FedalignError("--init needs --client and --gmm")
        st = init_files(client, gmm, state, output, force=force, n_atoms=n_atoms, seed=seed,
                        n_components=n_components, n_classes=n_classes, preset=preset,
                        shared_init=shared_init, optimizer=optimizer, lr=lr,
                        alpha_rule=alpha_rule, lr_alpha=lr_alpha, var_floor_rel=var_floor_rel,
                        min_var=min_var, lr_decay=lr_decay)
        A, K, d, C = st.shape
        err.print(f"dadil-round: client {client} initialised ({st.settings['role']}, A={A} K={K} "
                  f"d={d} C={C}, preset {preset}) → {state}, {output}")
        return
    st, rec = round_files(state, paths, output, strategy, local_steps, client=client, gmm_path=gmm)
    if rec.get("republished"):
        err.print(f"dadil-round: republished {rec['republished']} (round {st.round - 1}), which "
                  "an interrupted run had not written")
    err.print(f"dadil-round: {describe_round(st, rec)} ({time.perf_counter() - t0:.2f}s) → {output}")


@command("consensus", outputs=("output", "plot"),
         epilog="Example: fedalign consensus replacement=fedA/ aggregation=fedB/ -o consensus.json "
                "--plot consensus.png")
def consensus_cmd(
    runs: List[str] = typer.Argument(..., help="[NAME=]PATH: a folder searched for *.atoms.npz (one federation), or an atoms file; repeat for several runs."),
    output: Optional[Path] = output_option("Report (.json) with M_ij(t).", required=False),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG of the consensus curves."),
    n_weights: int = typer.Option(10, "--n-weights", "-L", min=1, help="Common weight vectors: the A vertices, then Dirichlet(1) draws."),
    seed: int = typer.Option(0, min=0, max=defaults.MAX_SEED, help="Seed of the Dirichlet weight vectors."),
    every: int = typer.Option(1, min=1, help="Analyse every N-th round (and the last)."),
    threads: int = threads_option(),
):
    """Consensus curves M_ij(t) = max_l W2(B(α_l; P⁽ⁱ⁾(t)), B(α_l; P⁽ʲ⁾(t))) of gossip federations.

    M_ij(t) is how far apart the dictionaries of clients i and j are after round t: both
    dictionaries are mixed with the same barycentric weights α_l (the A vertices — the atoms
    themselves — and Dirichlet draws), and M_ij(t) is the largest Wasserstein distance W2
    between the two resulting barycenters. It is 0 exactly when the two dictionaries generate
    the same measures for every tested α.

    Reading the curve: a FALLING M(t) means the clients' dictionaries are converging to a
    common one (consensus, as in the paper's Figure 2: clients start from their own atoms and
    gossip pulls them together); a flat or RISING M(t) means they drift apart (e.g. local steps
    pull each client towards its own data faster than communication mixes them, or all
    clients started from one shared dictionary: then M(0) = 0 and the curve can only rise).

    Rounds and clients come from the atoms files themselves (round, producer). Prints the mean
    and max over client pairs per round; --plot draws them against integer round ticks.
    """
    from rich.table import Table

    from fedalign.dadil.consensus import consensus_history, plot_consensus
    from fedalign.errors import FedalignError
    from fedalign.files import check_distinct, write_report

    _threads(threads)
    specs = []
    for r in runs:
        name, eq, path = r.partition("=")
        specs.append((name, path) if eq else (Path(r).name or r, r))
    # one run given twice (any spelling) would be analysed twice, or merged under one name
    check_distinct([Path(p) for _, p in specs], "run")
    named = {}
    for name, path in specs:
        if name in named:
            raise FedalignError(f"the run name {name!r} is given twice ({named[name]}, {path}): "
                                "give each run its own NAME=PATH")
        named[name] = Path(path)
    runs_files = [f for p in named.values() for f in (sorted(p.rglob("*")) if p.is_dir() else [p])]
    guard_outputs(list(named.values()) + runs_files, [output, plot])
    t0 = time.perf_counter()
    hists = {}
    for name, path in named.items():
        with progress_bar(None, f"consensus {name}", unit="rounds") as bar:
            hists[name] = consensus_history([path], n_weights, seed, every, progress=bar)
    table = Table(title=f"consensus M_ij(t) (max over L={n_weights} weight vectors), mean / max over pairs")
    table.add_column("round", justify="right")
    for name in hists:
        table.add_column(f"{name} mean", justify="right")
        table.add_column(f"{name} max", justify="right")
    rounds = sorted({int(t) for h in hists.values() for t in h["rounds"]})
    for t in rounds:
        cells = []
        for h in hists.values():
            idx = [i for i, r in enumerate(h["rounds"]) if int(r) == t]
            cells += [f"{h['mean'][idx[0]]:.4g}", f"{h['max'][idx[0]]:.4g}"] if idx else ["—", "—"]
        table.add_row(str(t), *cells)
    out.print(table)
    if output is not None:
        write_report(output, dict(
            producer="fedalign consensus", n_weights=n_weights, seed=seed,
            runs={n: dict(path=str(named[n]), clients=h["clients"], rounds=h["rounds"].tolist(),
                          mean=h["mean"].tolist(), max=h["max"].tolist(), M=h["M"].tolist(),
                          weights=h["W"].tolist())
                  for n, h in hists.items()}))
    if plot is not None:
        plot_consensus(hists, plot)
    err.print(f"consensus: {len(hists)} runs, {len(rounds)} rounds "
              f"({time.perf_counter() - t0:.1f}s)"
              + "".join(f" → {p}" for p in (output, plot) if p is not None))


@command("dadil-evaluate", outputs=("json_out",),
         epilog="Example: fedalign dadil-evaluate --test webcam.test.h5 --source amazon.h5 --source dslr.h5 "
                "--gmm amazon.gmm.npz --gmm dslr.gmm.npz --target-gmm webcam.gmm.npz "
                "--oracle-gmm webcam.labeled.gmm.npz "
                "--state aggregation=fed/state/webcam.state.npz --seeds 0-2\n\n"
                "With the shallow DA peers: fedalign dadil-evaluate --test webcam.test.h5 "
                "--source amazon.h5 --source dslr.h5 --target-adapt webcam.adapt.h5 --peers "
                "--json webcam.peers.json")
def dadil_evaluate_cmd(
    test: Path = typer.Option(..., "--test", help="The target's held-out test split (.h5), never used for adaptation."),
    state: Optional[List[str]] = typer.Option(None, "--state", help="[NAME=]STATE: the target client's DeFed state after the rounds (repeatable)."),
    source: Optional[List[Path]] = typer.Option(None, "--source", help="Labeled source features (.h5), one file per source domain, for the source-only baseline (C chosen by leave-one-source-domain-out CV)."),
    gmm: Optional[List[Path]] = typer.Option(None, "--gmm", help="Labeled source GMMs for the centralized GMM-DaDiL baseline."),
    target_gmm: Optional[Path] = typer.Option(None, "--target-gmm", help="The target's unlabeled GMM (centralized baseline)."),
    oracle_gmm: Optional[Path] = typer.Option(None, "--oracle-gmm", help="The target's GMM fitted WITH its adaptation-split labels: the oracle ceiling."),
    central_iters: int = typer.Option(100, min=1, help="Steps of centralized GMM-DaDiL."),
    n_atoms: int = typer.Option(defaults.N_ATOMS, "--n-atoms", min=1, help="Atoms of centralized GMM-DaDiL."),
    classifier: Optional[List[str]] = typer.Option(None, "--classifier", help="Heads of the GMM-based rows: linear (head on GMM samples), map, lda (the target's --target-adapt rows pseudo-labeled by the GMM, an LDA of their and the sources' class statistics, refined by classification EM with --cem-iter N), auto (lda or linear, chosen per target by leave-one-source-domain-out on the sources; needs --target-adapt and --head-gmm), comma-separated or repeated (default: linear,map; lda with --target-adapt; auto with --target-adapt and --head-gmm)."),
    n_per_class: int = typer.Option(500, min=1, help="Samples per class for the linear head."),
    cem_iter: int = typer.Option(defaults.CEM_ITER, "--cem-iter", min=0, help="Relabelings of the lda head's pseudo-labels by classification EM (the LDA relabels the target's rows until they stop changing, at most this many times); 0 (default): the one-pass head, pseudo-labels of the GMM's MAP rule only. The refinement won on the tuning set and lost on Amazon review (examples/dadil/RESULTS.md)."),
    target_adapt: Optional[Path] = typer.Option(None, "--target-adapt", help="The target's adaptation rows (.h5), seen unlabeled: the lda head of every GMM-based row pseudo-labels them (added to the default heads), and --peers adapt to them; labels in it, where present, train only the peers' ceiling row."),
    head_source: Optional[List[Path]] = typer.Option(None, "--head-source", help="Labeled source features of the lda head, in the coordinates the dictionary was learned in (e.g. mapped onto the target's Gaussian with align --tau 1); default: the --source files."),
    head_gmm: Optional[List[Path]] = typer.Option(None, "--head-gmm", help="The labeled GMM of every --head-source (or --source), in the same order: the auto head's rule refits it, with its own fit options, on half of that source's rows (fit-gmm output of the federation's sources); adds auto to the default heads."),
    peers: bool = typer.Option(False, "--peers", help="Add the shallow DA peer rows (fedalign.peers): skada's CORAL, SubspaceAlignment and LinearOTMapping (reg 1), SLOT-Align as DA at τ=1 and the default τ, SLOT toward the target's Gaussian, and the ceiling (when --target-adapt has labels); each a standardised logistic regression with source-only's C. Needs --source, --target-adapt and skada (pip install 'fedalign[da]')."),
    seeds_opt: List[str] = seeds_option(),
    json_out: Optional[Path] = json_option(),
    threads: int = threads_option(),
):
    """Target accuracy of DeFed-GMM-DaDiL next to honest baselines, one row per (method, head).

    Rows: source-only (standardised logistic regression on the --source features, C chosen by
    leave-one-source-domain-out cross-validation on the sources, never on the target), the
    oracle (--oracle-gmm, the target GMM fitted with labels: a ceiling), centralized GMM-DaDiL
    (dictionary learned from --gmm + --target-gmm in one process; the seed seeds the atoms),
    and one row per --state (the target client's B(α_T; atoms)). Every GMM-based row is scored
    with each --classifier head. A state or GMM whose d or C differs from the test file's is
    refused, and so is a test file without labeled rows. --peers adds the shallow DA methods
    (fedalign.peers) on --target-adapt; a peer that fails on this target is shown as
    "failed: reason" and the other rows go on.
    """
    from rich.table import Table

    from fedalign.cli.options import parse_seeds
    from fedalign.dadil.classifiers import METHOD_LABELS, SOURCE_ONLY, parse_classifiers
    from fedalign.dadil.evaluation import evaluate_target_files, target_report
    from fedalign.errors import FedalignError
    from fedalign.files import write_report
    from fedalign.peers import PEER_HEAD, PEER_LABELS

    _threads(threads)
    heads = parse_classifiers(classifier or (
        [("linear,map,lda,auto" if head_gmm else "linear,map,lda")] if target_adapt else None))
    seeds = parse_seeds(seeds_opt)
    states = {}
    for spec in state or []:
        name, eq, path = spec.partition("=")
        name, path = (name, path) if eq else ("DeFed " + Path(spec).stem, spec)
        if name in states or name in METHOD_LABELS:
            raise FedalignError(f"--state: row name {name!r} used twice (give NAME=STATE)")
        states[name] = Path(path)
    inputs = [test, *states.values(), *(source or []), *(gmm or []), *(head_source or []),
              *(head_gmm or []),
              *[q for q in (target_gmm, oracle_gmm, target_adapt) if q is not None]]
    guard_outputs(inputs, [json_out])
    if not (states or source or gmm or target_gmm or oracle_gmm):
        raise FedalignError("nothing to evaluate: give --state, --source, --gmm/--target-gmm "
                            "and/or --oracle-gmm")
    peer_rows = _peer_rows(peers, source, target_adapt, test)
    units = len(seeds) * (len(states) + bool(source) + bool(gmm or target_gmm) + bool(oracle_gmm))
    units += len(peer_rows)
    t0 = time.perf_counter()
    with progress_bar(units, "dadil-evaluate", unit="runs") as bar:
        res = evaluate_target_files(
            test, states=states, sources=list(source or []), source_gmms=list(gmm or []),
            target_gmm=target_gmm, oracle_gmm=oracle_gmm, seeds=seeds, classifiers=heads,
            target_adapt=target_adapt, head_sources=list(head_source or []),
            head_gmms=list(head_gmm or []), n_per_class=n_per_class, cem_iter=cem_iter,
            dictionary_kwargs=dict(n_atoms=n_atoms, n_iter=central_iters), progress=bar)
        if peer_rows:
            from fedalign.peers import add_peer_rows, evaluate_peers_files

            add_peer_rows(res, evaluate_peers_files(
                test, list(source), target_adapt, C=res.records[SOURCE_ONLY]["C"], seeds=seeds,
                rows=peer_rows, progress=bar))
    dom = res.domain
    table = Table(title=f"target {dom}: accuracy (%), mean ± std over {len(seeds)} seed(s), "
                        f"{res.n_test} test rows")
    table.add_column("method")
    table.add_column("head")
    table.add_column(dom, justify="right", style="bold")
    summary = res.summary()
    labels = dict(METHOD_LABELS, **(PEER_LABELS if peer_rows else {}))
    for m, h, _ in res.rows():
        ms = summary[m][h]
        table.add_row(labels.get(m, m), h, f"{100 * ms['mean']:.1f} ± {100 * ms['std']:.1f}")
    for m, rec in res.records.items():   # failed peer rows: in the records, not the accuracy
        if m not in res.accuracy and "failed" in rec:
            table.add_row(labels.get(m, m), PEER_HEAD, f"failed: {rec['failed']}")
    out.print(table)
    cv = res.records.get(SOURCE_ONLY)
    if cv is not None and "C" in cv:
        err.print(f"source-only: C={cv['C']:.3g} chosen by {cv['cv']} cross-validation on the "
                  f"sources ({len(cv['Cs'])} values {min(cv['Cs']):.0e}…{max(cv['Cs']):.0e})")
    if json_out is not None:
        write_report(json_out, target_report(res, test, states, heads))
    err.print(f"dadil-evaluate: {len(res.accuracy)} methods × {len(seeds)} seeds "
              f"({time.perf_counter() - t0:.1f}s)" + (f" → {json_out}" if json_out else ""))


def _peer_rows(peers: bool, source, target_adapt, test) -> tuple:
    """The peer rows of ``dadil-evaluate --peers`` (none without it), checked before any work:
    --peers needs --source and --target-adapt (a file other than --test), and skada."""
    from fedalign.errors import FedalignError

    if target_adapt is not None and Path(target_adapt).resolve() == Path(test).resolve():
        raise FedalignError("--target-adapt and --test are the same file: the test rows must "
                            "stay out of the adaptation")
    if not peers:
        return ()
    if not source or target_adapt is None:
        raise FedalignError("--peers needs --source (the labeled source features) and "
                            "--target-adapt (the target's adaptation rows)")
    from fedalign.peers import PEER_ROWS, check_rows

    return check_rows(PEER_ROWS)

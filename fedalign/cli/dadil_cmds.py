"""``dadil-round``, ``consensus`` and ``dadil-evaluate``: DeFed-GMM-DaDiL without a server.

Also provides :func:`evaluate_dadil`, the evaluator ``fedalign evaluate --method dadil``
delegates to (see :data:`fedalign.evaluate.EXTERNAL_METHODS`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from fedalign.cli.app import command, err, out, progress_bar


def _threads(n: int) -> None:
    """Torch and BLAS threads (:func:`fedalign.gossip.limit_threads`): the matrices of one
    round are small, and on a loaded machine one thread is ~10× faster than several."""
    from fedalign.gossip import limit_threads

    limit_threads(n)


@command("dadil-round",
         epilog="Example: fedalign dadil-round --init --client amazon --gmm amazon.gmm.npz "
                "--state amazon.state.npz -o r000/amazon.atoms.npz\n\n"
                "Then per round: fedalign dadil-round --state amazon.state.npz --strategy aggregation "
                "--local-steps 10 -o r001/amazon.atoms.npz r000/*.atoms.npz")
def dadil_round_cmd(
    peers: Optional[List[Path]] = typer.Argument(None, help="Candidate peers' atoms files (.npz); the client's own is ignored."),
    state: Path = typer.Option(..., "--state", help="The client's private state file (read and updated in place; written by --init)."),
    output: Path = typer.Option(..., "-o", "--output", help="Atoms file to publish (.npz)."),
    peer: Optional[List[Path]] = typer.Option(None, "--peer", help="A peer's atoms file (repeatable; same as the positional files)."),
    init: bool = typer.Option(False, "--init", help="Start a fresh client: seeded atoms (means ~ N(0, I), variances 1, uniform labels), α uniform."),
    client: Optional[str] = typer.Option(None, "--client", help="Client id (required with --init; otherwise checked against the state)."),
    gmm: Optional[Path] = typer.Option(None, "--gmm", help="The client's GMM (from fit-gmm; required with --init, default: the one recorded in the state)."),
    strategy: str = typer.Option("aggregation", help="replacement, aggregation or none."),
    local_steps: int = typer.Option(10, "--local-steps", "-E", help="Adam steps on the client's own loss per round."),
    n_atoms: int = typer.Option(3, "--n-atoms", help="--init: number of atoms A."),
    n_components: Optional[int] = typer.Option(None, "--n-components", help="--init: components per atom K (default: the GMM's K)."),
    n_classes: Optional[int] = typer.Option(None, "--n-classes", help="--init: classes C for an unlabeled GMM without class names."),
    lr: float = typer.Option(0.1, help="--init: Adam learning rate."),
    min_var: float = typer.Option(1e-6, "--min-var", help="--init: variance floor."),
    seed: int = typer.Option(0, help="--init: federation seed: the initial atoms depend on it only (same for all clients); peer choices also on the client id."),
    force: bool = typer.Option(False, "--force", help="--init: overwrite an existing state."),
    threads: int = typer.Option(1, help="Torch and BLAS threads (1 is fastest for these small matrices on a busy machine)."),
):
    """One DeFed-GMM-DaDiL gossip round for one client (or --init).

    Reads the client's state and GMM and the peers' atoms; draws peers with the client's own
    seeded generator; communicates (replacement: adopt one peer's atoms; aggregation: each atom
    becomes the equal-weight labeled Wasserstein barycenter of its own and two peers' versions,
    components matched by OT; none); runs E Adam steps on SMW2² (labeled source) or MW2²
    (unlabeled target); then publishes the atoms (means, variances, label logits, round,
    producer — never α, the GMM or samples) and updates the private state. Any bad input
    leaves the state untouched.
    """
    from fedalign.errors import FedalignError
    from fedalign.gossip import STRATEGIES, init_files, round_files

    _threads(threads)
    t0 = time.perf_counter()
    if init:
        if client is None or gmm is None:
            raise FedalignError("--init needs --client and --gmm")
        st = init_files(client, gmm, state, output, n_atoms, seed, n_components, n_classes, lr,
                        min_var, force)
        A, K, d, C = st.shape
        err.print(f"dadil-round: client {client} initialised ({st.settings['role']}, A={A} K={K} "
                  f"d={d} C={C}) → {state}, {output}")
        return
    if strategy not in STRATEGIES:
        raise FedalignError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    paths = list(peers or []) + list(peer or [])
    st, rec = round_files(state, paths, output, strategy, local_steps, client=client, gmm_path=gmm)
    loss = f"loss {rec['losses'][0]:.4g} → {rec['losses'][-1]:.4g}" if rec["losses"] else "no local steps"
    err.print(f"dadil-round: {st.client} round {rec['round']} {strategy} "
              f"(peers: {', '.join(rec['peers']) or '—'}), {loss} "
              f"({time.perf_counter() - t0:.2f}s) → {output}")


@command("consensus",
         epilog="Example: fedalign consensus replacement=fedA/ aggregation=fedB/ -o consensus.json "
                "--plot consensus.png")
def consensus_cmd(
    runs: List[str] = typer.Argument(..., help="[NAME=]PATH: a folder searched for *.atoms.npz (one federation), or an atoms file; repeat for several runs."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Report (.json) with M_ij(t)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG of the consensus curves."),
    n_weights: int = typer.Option(10, "--n-weights", "-L", help="Common weight vectors: the A vertices, then Dirichlet(1) draws."),
    seed: int = typer.Option(0, help="Seed of the Dirichlet weight vectors."),
    every: int = typer.Option(1, help="Analyse every N-th round (and the last)."),
    threads: int = typer.Option(1, help="Torch and BLAS threads."),
):
    """Consensus curves M_ij(t) = max_l W2(B(α_l; P⁽ⁱ⁾(t)), B(α_l; P⁽ʲ⁾(t))) of gossip federations.

    Rounds and clients come from the atoms files themselves (round, producer). Prints the mean
    and max over client pairs per round.
    """
    from rich.table import Table

    from fedalign.consensus import consensus_history, plot_consensus
    from fedalign.files import write_report

    _threads(threads)
    named = {}
    for r in runs:
        name, eq, path = r.partition("=")
        name, path = (name, path) if eq else (Path(r).name or r, r)
        named[name] = Path(path)
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


def _state_for_domain(states: dict, domain: str, n_tests: int):
    if domain in states:
        return states[domain]
    if len(states) == 1 and n_tests == 1:
        return next(iter(states.values()))
    from fedalign.errors import FedalignError

    raise FedalignError(f"no DaDiL state of client {domain!r} among the inputs "
                        f"({', '.join(sorted(states)) or 'none'})")


def evaluate_dadil(inputs, tests, class_names, seeds, params):
    """``fedalign evaluate --method dadil``: score target clients' DeFed-GMM-DaDiL classifiers.

    Parameters
    ----------
    inputs : state files (``--input``); a test domain uses the state of the client with its
        name (or the only state when there is one state and one test domain)
    tests : list of :class:`fedalign.evaluate.TestDomain`
    class_names, seeds : as in ``evaluate``; the seed is the sampling seed of the head
    params : ``dadil.classifier=linear|map``, ``dadil.n_per_class=N``

    Returns
    -------
    :class:`fedalign.evaluate.MethodResult`
    """
    from fedalign.errors import FedalignError
    from fedalign.evaluate import MethodResult
    from fedalign.gossip import CLASSIFIERS, accuracy, load_state, target_classifier

    params = dict(params or {})
    unknown = set(params) - {"classifier", "n_per_class", "threads"}
    if unknown:
        raise FedalignError(f"unknown dadil option {sorted(unknown)[0]!r} "
                            "(classifier, n_per_class, threads)")
    clf = str(params.get("classifier", "linear"))
    if clf not in CLASSIFIERS:
        raise FedalignError(f"dadil.classifier must be one of {', '.join(CLASSIFIERS)}, got {clf!r}")
    try:
        npc = int(params.get("n_per_class", 500))
        _threads(int(params.get("threads", 1)))
    except ValueError:
        raise FedalignError("dadil.n_per_class and dadil.threads must be integers") from None
    if not inputs:
        raise FedalignError("--method dadil needs the target client's state file(s) as --input")
    states = {}
    for p in inputs:
        st = load_state(p)
        states[st.client] = st
    per_seed = []
    for seed in seeds:
        acc = {}
        for t in tests:
            st = _state_for_domain(states, t.domain, len(tests))
            A, K, d, C = st.shape
            if t.X.shape[1] != d:
                raise FedalignError(f"{t.path}: d={t.X.shape[1]}, the state of {st.client} has d={d}")
            if C != len(class_names):
                raise FedalignError(f"{t.path}: {len(class_names)} classes, the state of "
                                    f"{st.client} has C={C}")
            acc[t.domain] = accuracy(target_classifier(st, clf, npc, int(seed)), t.X, t.y)
        per_seed.append(acc)
    return MethodResult("dadil", [int(s) for s in seeds], per_seed,
                        dict(classifier=clf, n_per_class=npc))


@command("dadil-evaluate",
         epilog="Example: fedalign dadil-evaluate --test webcam.test.h5 --source amazon.h5 --source dslr.h5 "
                "--gmm amazon.gmm.npz --gmm dslr.gmm.npz --target-gmm webcam.gmm.npz "
                "--state aggregation=fed/state/webcam.state.npz --seeds 0-2")
def dadil_evaluate_cmd(
    test: Path = typer.Option(..., "--test", help="The target's held-out test split (.h5), never used for adaptation."),
    state: Optional[List[str]] = typer.Option(None, "--state", help="[NAME=]STATE: the target client's DeFed state after the rounds (repeatable)."),
    source: Optional[List[Path]] = typer.Option(None, "--source", help="Labeled source features (.h5) for the source-only baseline (pooled)."),
    gmm: Optional[List[Path]] = typer.Option(None, "--gmm", help="Labeled source GMMs for the centralized GMM-DaDiL baseline."),
    target_gmm: Optional[Path] = typer.Option(None, "--target-gmm", help="The target's unlabeled GMM (centralized baseline)."),
    central_iters: int = typer.Option(100, help="Adam steps of centralized GMM-DaDiL."),
    n_atoms: int = typer.Option(3, "--n-atoms", help="Atoms of centralized GMM-DaDiL."),
    classifier: str = typer.Option("linear", help="linear (head on barycenter samples) or map."),
    n_per_class: int = typer.Option(500, help="Samples per class for the linear head."),
    seeds_opt: List[str] = typer.Option(["0"], "--seeds", help="Seeds: 0,1,2 or 0-2."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report (JSON)."),
    threads: int = typer.Option(1, help="Torch and BLAS threads."),
):
    """Target accuracy of DeFed-GMM-DaDiL next to source-only and centralized GMM-DaDiL.

    Rows: source-only (logistic regression on the pooled --source features), centralized
    GMM-DaDiL (dictionary learned from --gmm + --target-gmm in one process; the seed seeds the
    atoms), and one row per --state (the target client's B(α_T; atoms) → classifier).
    """
    import numpy as np
    from rich.table import Table

    from fedalign.errors import FedalignError
    from fedalign.evaluate import mean_std, parse_seeds
    from fedalign.files import read_features, write_report
    from fedalign.gmm import load_gmm
    from fedalign.gossip import (CLASSIFIERS, accuracy, centralized_classifier, load_state,
                                 source_only_classifier, target_classifier)

    _threads(threads)
    if classifier not in CLASSIFIERS:
        raise FedalignError(f"--classifier must be one of {', '.join(CLASSIFIERS)}, got {classifier!r}")
    seeds = parse_seeds(seeds_opt)
    Xt, yt, tinfo = read_features(test)
    d = Xt.shape[1]
    rows: dict = {}
    t0 = time.perf_counter()
    if source:
        Xs, ys = [], []
        for p in source:
            X, y, _ = read_features(p)
            if X.shape[1] != d:
                raise FedalignError(f"{p}: d={X.shape[1]}, the test file has d={d}")
            Xs.append(X[y >= 0])
            ys.append(y[y >= 0])
        Xs, ys = np.concatenate(Xs), np.concatenate(ys)
        rows["source-only"] = [accuracy(source_only_classifier(Xs, ys, s), Xt, yt) for s in seeds]
    if gmm:
        if target_gmm is None:
            raise FedalignError("the centralized baseline needs --target-gmm")
        gs = [load_gmm(p) for p in gmm] + [load_gmm(target_gmm)]
        for p, g in zip(list(gmm) + [target_gmm], gs):
            if g.d != d:
                raise FedalignError(f"{p}: d={g.d}, the test file has d={d}")
        accs = []
        for s in seeds:
            pred, _ = centralized_classifier(gs, len(gs) - 1, n_atoms, central_iters, seed=s,
                                             classifier=classifier, n_per_class=n_per_class)
            accs.append(accuracy(pred, Xt, yt))
        rows["centralized GMM-DaDiL"] = accs
    for spec in state or []:
        name, eq, path = spec.partition("=")
        name, path = (name, path) if eq else ("DeFed " + Path(spec).stem, spec)
        st = load_state(path)
        if st.shape[2] != d:
            raise FedalignError(f"{path}: d={st.shape[2]}, the test file has d={d}")
        rows[name] = [accuracy(target_classifier(st, classifier, n_per_class, s), Xt, yt)
                      for s in seeds]
    if not rows:
        raise FedalignError("nothing to evaluate: give --state, --source and/or --gmm/--target-gmm")
    domain = str(tinfo["provenance"].get("domain") or test.name.split(".")[0])
    table = Table(title=f"target {domain}: accuracy (%), mean ± std over {len(seeds)} seed(s)")
    table.add_column("method")
    table.add_column(domain, justify="right", style="bold")
    summary = {}
    for name, accs in rows.items():
        summary[name] = mean_std(accs)
        table.add_row(name, f"{100 * summary[name]['mean']:.1f} ± {100 * summary[name]['std']:.1f}")
    out.print(table)
    if json_out is not None:
        write_report(json_out, dict(producer="fedalign dadil-evaluate", test=str(test),
                                    domain=domain, seeds=seeds, classifier=classifier,
                                    per_seed=rows, summary=summary))
    err.print(f"dadil-evaluate: {len(rows)} methods × {len(seeds)} seeds "
              f"({time.perf_counter() - t0:.1f}s)" + (f" → {json_out}" if json_out else ""))

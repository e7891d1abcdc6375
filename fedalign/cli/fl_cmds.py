"""``partition`` and ``evaluate``: the one-shot federated learning protocol around SLOT-Align."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from fedalign import defaults

from fedalign.cli.app import command
from fedalign.cli.console import err, fold_notes, out, progress_bar
from fedalign.cli.options import json_option, output_option, seeds_option
from typer.core import TyperCommand

#: Options of ``evaluate`` that take every value up to the next option, so shell globs work:
#: ``--train clients/*.train.h5 --test clients/*.test.h5 --seeds 0 1 2``.
GREEDY_OPTIONS = ("--train", "--test", "--seeds", "--input", "--param", "--map")


def expand_greedy(args: list, names=GREEDY_OPTIONS) -> list:
    """Rewrite ``--opt a b c`` as ``--opt a --opt b --opt c`` for the options in ``names``."""
    out_args, current, fresh = [], None, False
    for a in args:
        if a == "--":
            current = None
        elif a.startswith("-") and not _is_number(a):
            current, fresh = (a if a in names else None), True
        elif current is not None:
            if not fresh:
                out_args.append(current)
            fresh = False
        out_args.append(a)
    return out_args


def _is_number(a: str) -> bool:
    try:
        float(a)
        return True
    except ValueError:
        return False


class GreedyCommand(TyperCommand):
    """A command whose :data:`GREEDY_OPTIONS` accept several values after one flag."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, expand_greedy(list(args)))


@command("partition", folders=("output",),
         epilog="Example: fedalign partition amazon.h5 caltech10.h5 dslr.h5 webcam.h5 -o clients/ "
                "--alpha 0.1 --seed 0")
def partition_cmd(
    domains: List[Path] = typer.Argument(..., help="One labeled features file (.h5) per domain; the domain name is the file stem."),
    output: Path = output_option("Output folder."),
    alpha: str = typer.Option("0.1", help="Dirichlet concentration of the label shift, or 'none' (domain shift only)."),
    seed: int = typer.Option(0, min=0, max=defaults.MAX_SEED, help="Random seed (the split and the draw are deterministic)."),
    test_fraction: float = typer.Option(0.3, min=0.0, help="Stratified per-domain test fraction, in (0, 1): every domain keeps test rows."),
    clients_per_domain: int = typer.Option(1, min=1, help="Clients per domain (M)."),
    drop: Optional[List[str]] = typer.Option(
        None, "--drop-classes",
        help="FRACTION (each client drops that share of classes at random) or [CLIENT:]LIST of class names/indices. Repeatable."),
    max_redraws: int = typer.Option(0, min=0, help="Redraw the Dirichlet fractions up to N times while a client is empty (default: an empty client is an error)."),
    min_client_size: int = typer.Option(1, min=1, help="A client with fewer rows counts as empty (SLOT-Align's stats need at least 2)."),
    exclude_small_clients: bool = typer.Option(False, "--exclude-small-clients", help="A client left with fewer than --min-client-size rows takes no part (no train file; recorded in every file's provenance) instead of being an error."),
):
    """Split domains into clients: stratified test split per domain, then Dirichlet label shift.

    For each class c, fractions p ~ Dir(α·1_K) over all K clients; client k keeps
    ⌊p[k, c] · n_{D,c}⌋ of its own domain's class-c train pool. Writes
    OUT/<domain>.c<k>.train.h5 per client and OUT/<domain>.test.h5 per domain (domain, client
    and parameters in each file's provenance) and prints the counts table.
    """
    from rich.table import Table

    from fedalign.cli.options import parse_alpha
    from fedalign.partition import counts_table, load_domains, make_partition, write_partition

    a = parse_alpha(alpha)
    doms = load_domains(domains)
    part = make_partition(doms, a, seed, test_fraction, clients_per_domain, drop, max_redraws,
                          min_client_size, exclude_small_clients)
    names, train, dnames, test = counts_table(doms, part)
    paths = write_partition(doms, part, output)
    classes = doms[0].class_names or [str(c) for c in range(train.shape[1])]
    table = Table(title=f"partition α={alpha} seed={seed}: rows per class (columns: class index)")
    table.add_column("file", no_wrap=True)
    for i in range(len(classes)):
        table.add_column(str(i), justify="right")
    table.add_column("total", justify="right", style="bold")
    for n, row in zip(names, train):
        table.add_row(f"{n}.train", *map(str, row), str(row.sum()))
    for n, row in zip(dnames, test):
        table.add_row(f"{n}.test", *map(str, row), str(row.sum()), style="dim")
    out.print(table)
    out.print("classes: " + ", ".join(f"{i}={c}" for i, c in enumerate(classes)), soft_wrap=True)
    if part.redraws:
        err.print(f"partition: {part.redraws} Dirichlet redraws (empty clients)")
    if part.excluded:
        err.print("partition: take no part (fewer than "
                  f"{min_client_size} rows): " + ", ".join(f"{n} ({r} rows)" for n, r in
                                                            part.participation()["excluded"].items()))
    total = len(names) + len(part.excluded)
    err.print(f"partition: {len(names)} of {total} clients take part, {len(dnames)} test domains → "
              f"{len(paths)} files in {output}")


@command("evaluate", cls=GreedyCommand, outputs=("json_out",),
         epilog="Example: fedalign evaluate --method ofedavg --method fedcgs --train clients/*.train.h5 "
                "--test clients/*.test.h5 --seeds 0 1 2 --json report.json")
def evaluate_cmd(
    method: List[str] = typer.Option(..., "--method", "-m", help="ofedavg, fedcgs, fedpft, fedpft-k1, fed3r, centralized (repeatable); dadil if installed."),
    train: Optional[List[Path]] = typer.Option(None, "--train", help="Client train files (.h5), one per client."),
    test: List[Path] = typer.Option(..., "--test", help="Per-domain test files (.h5), aligned like their clients."),
    seeds_opt: List[str] = seeds_option("Seeds: 0 1 2, 0,1,2 or a range 0-4."),
    params: Optional[List[str]] = typer.Option(None, "--param", help="Method option METHOD.KEY=VALUE, e.g. fedpft.epochs=10 (repeatable)."),
    inputs: Optional[List[Path]] = typer.Option(None, "--input", help="Extra inputs of external methods (e.g. DaDiL state files)."),
    maps: Optional[List[Path]] = typer.Option(None, "--map", help="Every client's map (align --save-map) for O-FedAvg's transport layer (ofedavg.tau_schedule=cosine, e.g. ofedavg.variant=reference): the --train files are then the unaligned ones, the --test files mapped at τ_max."),
    json_out: Optional[Path] = json_option("Write the report (JSON)."),
):
    """Train every method's global head from the clients' messages and score it per test domain.

    Protocol: each test domain must have a client of the same domain (from the files'
    provenance); with SLOT-Align a domain's test file is mapped by that domain's client map at
    the same τ (align --map) — or, with several clients per domain, by the domain map (align
    --stats of each of its clients) — which evaluate checks: a test file mapped with a map of
    another domain's client is refused. Variants: --param HEAD.variant=reference|fedalign.
    Prints per-domain accuracy and the macro mean, mean ± std over seeds.
    """
    from fedalign.cli.options import parse_params, parse_seeds
    from fedalign.errors import FedalignError
    from fedalign.evaluate import (EXTERNAL_METHODS, build_report, check_params, check_seeds,
                                   evaluate_external, evaluate_method, load_inputs,
                                   privacy_lines)
    from fedalign.protocol import load_client_maps
    from fedalign.files import check_distinct, write_report
    from fedalign.heads import get_method

    by_method = parse_params(params)
    seeds = check_seeds(parse_seeds(seeds_opt))
    internal = [m for m in method if m not in EXTERNAL_METHODS]
    for m in internal:
        get_method(m).config(by_method.get(m))  # validate names and options before any work
    by_method = check_params(by_method, method)
    if internal and not train:
        raise FedalignError(f"methods {', '.join(internal)} need client --train files")
    check_distinct(train or [], "--train file")
    check_distinct(test or [], "--test file")
    client_maps = load_client_maps(maps) if maps else None
    clients, tests, class_names = load_inputs(train, test, client_maps)
    t0 = time.perf_counter()
    results = []
    with progress_bar(len(internal) * len(seeds), "evaluate", unit="runs") as bar:
        for m in method:
            if m in EXTERNAL_METHODS:
                results.append(evaluate_external(m, inputs or [], tests, class_names, seeds,
                                                 by_method.get(m, {})))
            else:
                results.append(evaluate_method(m, clients, tests, len(class_names), seeds, by_method.get(m), bar,
                                               maps=client_maps))
    out.print(result_table(results, [t.domain for t in tests], seeds))
    for r in results:
        for line in fold_notes(r.method, r.notes) + privacy_lines(r):
            err.print(line, markup=False)
        losses = [d["train_loss"] for d in getattr(r, "diagnostics", []) if d and "train_loss" in d]
        if losses:
            err.print(f"{r.method}: final training loss {sum(losses) / len(losses):.4g} "
                      "(sample-weighted over clients, mean over seeds)", markup=False)
    if json_out is not None:
        write_report(json_out, build_report(results, clients, tests, class_names, seeds))
    err.print(f"evaluate: {len(method)} methods × {len(seeds)} seeds on {len(clients)} clients, "
              f"{len(tests)} test domains ({time.perf_counter() - t0:.1f}s)"
              + (f" → {json_out}" if json_out else ""))


def result_table(results, domains, seeds):
    """Rich table: methods × (domains, macro), accuracy in % as mean ± std over seeds."""
    from rich.table import Table

    title = f"accuracy (%), mean ± std over {len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    table = Table(title=title)
    table.add_column("method")
    for d in domains:
        table.add_column(d, justify="right")
    table.add_column("macro", justify="right", style="bold")
    for r in results:
        s = r.summary()
        cells = [_pm(s[d]) if d in s else "—" for d in domains] + [_pm(s["macro"])]
        table.add_row(r.method, *cells)
    return table


def _pm(ms: dict) -> str:
    return f"{100 * ms['mean']:.1f} ± {100 * ms['std']:.1f}"

"""Evaluate one-shot federated heads on client train files and per-domain test files.

Protocol
--------
- Every ``--train`` file is one client (``partition`` output ``<domain>.c<k>.train.h5``, or
  its aligned version); its domain comes from the file's provenance (``domain``).
- Every ``--test`` file is one domain's test split (``<domain>.test.h5``). Each test domain
  must have at least one client of the same domain: with SLOT-Align, the domain's test
  features are mapped by that domain's client map (built from the client's *training*
  statistics) at the same τ — exactly what the reference implementation does::

      fedalign align --tau T c.train.h5 ref.npz -o c.train.al.h5 --save-map c.map.npz
      fedalign align --tau T --map c.map.npz dom.test.h5 -o dom.test.al.h5

  ``evaluate`` checks this from the files' provenance: a test domain whose client files were
  aligned must be aligned with the same τ and the same reference, and vice versa; and the
  map that moved a test file of domain D must belong to one of D's clients (built from the
  same statistics its training file was aligned with) or be D's domain map — anything else
  is refused (:mod:`fedalign.protocol`).
- **Several clients per domain** (M > 1): a domain's test split is mapped by the *domain
  map*, the OT map of the domain's pooled Gaussian (its participating clients' statistics
  pooled exactly, :func:`fedalign.align.domain_map`) at the same τ; each client's training
  file is mapped by its own client map. With M = 1 the domain map is the client map::

      fedalign align --tau T dom.test.h5 ref.npz --stats dom.c0.stats.npz --stats dom.c1.stats.npz \
          -o dom.test.al.h5

- **Clients that take no part** (``partition --exclude-small-clients``): a test domain none of
  whose clients took part has no map; it is scored on its unaligned features (a domain the
  federation never saw) and a note says so. The report records how many clients took part.
- **O-FedAvg's transport layer** (``ofedavg.tau_schedule=cosine``): the clients train on their
  *unaligned* train files through their maps (``--map``, one per client, matched by the client
  recorded in the map), and the test files are mapped at τ_max (``ofedavg.tau_max``, by default
  the τ the test files were mapped with).
- For every method and seed, the clients compute their messages, the server builds one global
  head (:func:`fedalign.heads.run_method`), and the head is scored on every test domain.
  Reported: per-domain accuracy, their macro mean, and over the seeds mean ± std (population
  std, ddof = 0).

- **Privacy** (:mod:`fedalign.dp`): when a head sends DP messages (``fedcgs.dp_epsilon``,
  ``fed3r.dp_epsilon``) or the clients' statistics were DP releases (recorded in the train
  files' ``align`` step), the method's result lists every client's privacy over one run — one
  method and one seed: each is its own federation — its statistics release composed with its
  head message by Gaussian DP, and whether the head message is covered (not when its rows
  were mapped with the client's exact statistics: :mod:`fedalign.dp.accounting`).

Methods with inputs other than feature files (e.g. ``dadil``) are delegated to a library
evaluator (:data:`EXTERNAL_METHODS`) that returns the same :class:`MethodResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.defaults import check_seed
from fedalign.errors import FedalignError
from fedalign.results import MethodResult, mean_std  # noqa: F401 (importable from here too)
from fedalign.results import json_safe as _json_safe
from fedalign.protocol import (Alignment, alignment_of, check_protocol, match_maps,  # noqa: F401
                               no_participant)


def _evaluate_dadil(**kwargs):
    """Method ``dadil``: :func:`fedalign.dadil.evaluation.evaluate_dadil` (imported when used)."""
    from fedalign.dadil.evaluation import evaluate_dadil

    return evaluate_dadil(**kwargs)


#: Methods with inputs other than client feature files: name → library function, called as
#: ``fn(inputs=[paths], tests=[TestDomain], class_names=[...], seeds=[...], params={...})``,
#: returning a :class:`MethodResult`.
EXTERNAL_METHODS = {"dadil": _evaluate_dadil}


@dataclass
class ClientData:
    """A client's private training data. X (n, d) float32, y (n,) int64."""

    path: Path
    name: str
    domain: str
    X: np.ndarray
    y: np.ndarray
    alignment: Alignment | None
    provenance: dict = field(default_factory=dict)


@dataclass
class TestDomain:
    """A domain's test split. X (n, d) float32, y (n,) int64.

    ``no_participant``: the partition (provenance) says none of this domain's clients took part.
    """

    path: Path
    domain: str
    X: np.ndarray
    y: np.ndarray
    alignment: Alignment | None
    no_participant: bool = False


def _domain_of(path: Path, provenance: dict) -> str:
    return str(provenance.get("domain") or path.name.split(".")[0])


def load_inputs(train_paths, test_paths, maps=None):
    """Read clients and test domains; check dimension, class sets and the alignment protocol.

    ``maps``: optional {client name: :class:`fedalign.align.AffineMap`} (a transport layer's
    client maps, :func:`load_client_maps`); the train files must then be unaligned.

    Returns
    -------
    clients : list of :class:`ClientData`
    tests : list of :class:`TestDomain`
    class_names : list of str
    """
    from fedalign.files import read_features

    if not test_paths:
        raise FedalignError("give at least one --test file")
    clients, tests, ref = [], [], None

    def check(path, X, y, info):
        nonlocal ref
        names = list(info["class_names"])
        if ref is None:
            ref = (path, X.shape[1], names)
        elif X.shape[1] != ref[1]:
            raise FedalignError(f"dimension mismatch: {ref[0]} has d={ref[1]}, {path} has d={X.shape[1]}")
        elif names != ref[2]:
            raise FedalignError(f"class sets differ: {ref[0]} and {path} have different class names")

    for p in map(Path, train_paths or []):
        X, y, info = read_features(p)
        check(p, X, y, info)
        keep = y >= 0
        if not np.any(keep):
            raise FedalignError(f"{p}: client has no labeled training rows (empty client)")
        prov = info["provenance"]
        name = str(prov.get("client") or p.name.split(".train")[0])
        clients.append(ClientData(p, name, _domain_of(p, prov), X[keep], y[keep], alignment_of(prov), prov))
    for p in map(Path, test_paths):
        X, y, info = read_features(p)
        check(p, X, y, info)
        if not np.any(y >= 0):
            raise FedalignError(f"{p}: test file has no labeled rows")
        prov = info["provenance"]
        dom = _domain_of(p, prov)
        tests.append(TestDomain(p, dom, X, y, alignment_of(prov), no_participant(dom, prov)))
    seen = [t.domain for t in tests]
    dup = sorted({d for d in seen if seen.count(d) > 1})
    if dup:
        raise FedalignError(f"more than one test file for domain {dup[0]}")
    C = len(ref[2]) or int(max([c.y.max() for c in clients] + [t.y.max() for t in tests])) + 1
    for obj in clients + tests:
        if obj.y.max() >= C:
            raise FedalignError(f"{obj.path}: label {int(obj.y.max())} out of range for {C} classes")
    class_names = ref[2] or [str(c) for c in range(C)]
    if maps is not None:
        match_maps(maps, clients)
        for name, amap in maps.items():
            if amap.A.shape[0] != ref[1]:
                raise FedalignError(f"dimension mismatch: the map of client {name!r} has "
                                    f"d={amap.A.shape[0]}, the features d={ref[1]}")
    if clients:
        check_protocol(clients, tests, maps)
    return clients, tests, class_names


def evaluate_method(method: str, clients, tests, n_classes: int, seeds, params: dict | None = None,
                    progress=None, maps: dict | None = None) -> MethodResult:
    """Run one registered head for every seed and score it on every test domain.

    ``maps`` ({client name: AffineMap}) feeds a head's transport layer
    (``ofedavg.tau_schedule=cosine``); its τ_max defaults to the test files' τ.
    """
    from fedalign.dp import config_record
    from fedalign.heads import get_method, run_method

    m = get_method(method)
    params = dict(params or {})
    cfg = m.config(params)
    transports = None
    if getattr(cfg, "tau_schedule", "fixed") == "cosine":
        transports, params = _transport_setup(m, cfg, params, clients, tests, maps)
        cfg = m.config(params)
    elif maps is not None:
        raise FedalignError(f"--map is for a transport layer (ofedavg.tau_schedule=cosine); {method} "
                            "trains on aligned train files")
    per_seed, notes, diagnostics, head_dp = [], [], [], None
    notes += [f"test domain {t.domain!r}: none of its clients took part, so no map: scored unaligned"
              for t in tests if t.no_participant and t.domain not in {c.domain for c in clients}]
    data = [(c.X, c.y) for c in clients]
    for seed in seeds:
        head, _ = run_method(m, data, n_classes, seed=int(seed), transports=transports, config=cfg)
        per_seed.append({t.domain: head.accuracy(t.X, t.y) for t in tests})
        notes.extend(head.notes)
        diagnostics.append(_json_safe(head.info))
        head_dp = head.info.get("dp", head_dp)
        if progress is not None:
            progress(1)
    return MethodResult(method, [int(s) for s in seeds], per_seed, config_record(cfg),
                        sorted(set(notes)), diagnostics, privacy_of(clients, head_dp))


def privacy_of(clients, head_dp: dict | None) -> list:
    """Each client's privacy over one run (one seed: the seeds are repetitions of the
    experiment, not releases of one deployment): its statistics release, found in its train
    file's provenance, composed with its head message (:func:`fedalign.dp.client_privacy`).
    Empty when nothing is a DP release (no head message and no statistics)."""
    from fedalign.dp import client_privacy

    def stats_dp(c):
        steps = [h for h in c.provenance.get("history", []) if h.get("step") == "align"]
        return bool(steps and steps[-1].get("dp"))

    if head_dp is None and not any(stats_dp(c) for c in clients):
        return []
    out = []
    for k, c in enumerate(clients):
        rec = None if head_dp is None else dict(head_dp["record"],
                                                clipped_fraction=head_dp["clipped_fraction"][k])
        out.append(_json_safe(client_privacy(c.name, c.provenance, rec, head_dp is not None)))
    return out


def privacy_lines(result: MethodResult) -> list:
    """One line per method on its clients' privacy (what ``evaluate`` prints)."""
    if not result.privacy:
        return []
    totals = [e["total"] for e in result.privacy]
    private = [t for t in totals if t.get("private")]
    uncovered = [e["client"] for e in result.privacy if not e["head_message_covered"]]
    if len(private) == len(totals):
        worst = max(t["epsilon"] for t in private)
        line = (f"{result.method}: privacy per client and run: ε ≤ {worst:.4g} at δ = "
                f"{max(t['delta'] for t in private):g} (everything each client sent, composed)")
    else:
        why = next(t["reason"] for t in totals if not t.get("private"))
        line = (f"{result.method}: privacy: no composed guarantee for {len(totals) - len(private)} "
                f"of {len(totals)} clients ({why})")
    if uncovered and len(private) == len(totals):
        line += f"; head message not covered for {', '.join(uncovered)}"
    return [line]


def _transport_setup(m, cfg, params, clients, tests, maps):
    """Transports and τ_max for ``tau_schedule=cosine``: unaligned tests need none (τ_max = 0,
    the schedule is all zeros); aligned tests need the clients' maps and set τ_max."""
    taus = {t.alignment.tau for t in tests if t.alignment is not None}
    if not taus:
        if maps is None and all(c.alignment is None for c in clients):
            return None, {**params, "tau_max": 0.0}
    if maps is None:
        raise FedalignError(f"{m.name}.tau_schedule=cosine trains through each client's map on its "
                            f"unaligned features: give the unaligned --train files and every client's "
                            f"--map, or use --param {m.name}.tau_schedule=fixed on aligned train files")
    if len(taus) != 1:
        raise FedalignError(f"{m.name}: the test files must be mapped at one τ (τ_max), found "
                            f"{', '.join(f'{t:g}' for t in sorted(taus)) or 'none aligned'}")
    tau = taus.pop()
    if cfg.tau_max >= 0 and not np.isclose(cfg.tau_max, tau):
        raise FedalignError(f"{m.name}.tau_max={cfg.tau_max:g} but the test files are mapped at τ={tau:g}; "
                            "the head is evaluated at τ_max")
    transports = [(maps[c.name].A, maps[c.name].b) for c in clients]
    return transports, {**params, "tau_max": float(tau)}


def evaluate_external(method: str, inputs, tests, class_names, seeds, params) -> MethodResult:
    """Delegate a method with its own inputs (see :data:`EXTERNAL_METHODS`)."""
    fn = EXTERNAL_METHODS.get(method)
    if fn is None:
        raise FedalignError(f"unknown method {method!r} (external methods: "
                            f"{', '.join(sorted(EXTERNAL_METHODS))})")
    return fn(inputs=list(inputs), tests=tests, class_names=class_names, seeds=list(seeds), params=params)


def check_seeds(seeds) -> list:
    """Seeds as the library takes them: integers in [0, :data:`fedalign.defaults.MAX_SEED`],
    each checked by :func:`fedalign.defaults.check_seed` (a list, tuple or range) → sorted
    unique ints. Front ends turn their text into integers first (the CLI's ``--seeds 0-4``:
    ``fedalign.cli.options.parse_seeds``)."""
    out = [check_seed(s, "seeds: each seed", param="seeds")
           for s in (seeds if seeds is not None else [])]
    if not out:
        raise FedalignError("seeds: give at least one seed")
    return sorted(set(out))


def check_params(params, methods) -> dict:
    """Method options as the library takes them: {method: {key: value}} for requested
    ``methods`` only (a copy). Front ends turn their text into this dict first (the CLI's
    ``--param METHOD.KEY=VALUE``: ``fedalign.cli.options.parse_params``)."""
    out = {}
    for method, opts in dict(params or {}).items():
        if not isinstance(opts, dict):
            raise FedalignError(f"params[{method!r}] must be a dict of options, got {opts!r}")
        out[str(method)] = dict(opts)
    unknown = set(out) - set(methods)
    if unknown:
        raise FedalignError(f"params for a method not requested: {sorted(unknown)[0]}",
                            param="params")
    return out


def build_report(results, clients, tests, class_names, seeds) -> dict:
    """The JSON report (deterministic: no timestamps)."""
    from fedalign.files import sha256_file

    first = clients[0].alignment if clients else None
    if first is None:  # a transport layer: unaligned clients, tests mapped at τ_max
        first = next((t.alignment for t in tests if t.alignment is not None), None)
    prov = clients[0].provenance if clients else {}
    participation = None
    if "participating" in prov:
        participation = dict(taking_part=len(clients), clients_total=int(prov.get("clients_total", len(clients))),
                             excluded=dict(prov.get("excluded") or {}))
    return dict(
        producer="fedalign evaluate",
        participation=participation,
        protocol=("one global head per method and seed from the clients' messages; accuracy per "
                  "test domain, macro mean over domains; mean ± std (ddof=0) over seeds; with "
                  "alignment each domain's test file is mapped by its client's map at the same τ"),
        class_names=list(class_names),
        seeds=[int(s) for s in seeds],
        domains=[t.domain for t in tests],
        alignment=None if first is None else dict(tau=first.tau, reference_sha256=first.reference_sha256),
        clients=[dict(path=str(c.path), name=c.name, domain=c.domain, n=int(len(c.y)),
                      sha256=sha256_file(c.path)) for c in clients],
        tests=[dict(path=str(t.path), domain=t.domain, n=int(np.sum(t.y >= 0)),
                    sha256=sha256_file(t.path)) for t in tests],
        methods={r.method: r.to_json() for r in results},
    )

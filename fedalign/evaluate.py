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
  aligned must be aligned with the same τ and the same reference, and vice versa.
- For every method and seed, the clients compute their messages, the server builds one global
  head (:func:`fedalign.heads.run_method`), and the head is scored on every test domain.
  Reported: per-domain accuracy, their macro mean, and over the seeds mean ± std (population
  std, ddof = 0).

Methods with inputs other than feature files (e.g. ``dadil``) are delegated to a library
evaluator (:data:`EXTERNAL_METHODS`) that returns the same :class:`MethodResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError


def _evaluate_dadil(**kwargs):
    """``--method dadil``: :func:`fedalign.dadil_eval.evaluate_dadil` (imported when used)."""
    from fedalign.dadil_eval import evaluate_dadil

    return evaluate_dadil(**kwargs)


#: Methods with inputs other than client feature files: name → library function, called as
#: ``fn(inputs=[paths], tests=[TestDomain], class_names=[...], seeds=[...], params={...})``,
#: returning a :class:`MethodResult`.
EXTERNAL_METHODS = {"dadil": _evaluate_dadil}


@dataclass
class Alignment:
    """The last ``align`` step recorded in a file's provenance (None: not aligned)."""

    tau: float
    reference_sha256: str | None

    def describe(self) -> str:
        ref = (self.reference_sha256 or "?")[:12]
        return f"τ={self.tau:g}, reference {ref}"


@dataclass
class ClientData:
    """A client's private training data. X (n, d) float32, y (n,) int64."""

    path: Path
    name: str
    domain: str
    X: np.ndarray
    y: np.ndarray
    alignment: Alignment | None


@dataclass
class TestDomain:
    """A domain's test split. X (n, d) float32, y (n,) int64."""

    path: Path
    domain: str
    X: np.ndarray
    y: np.ndarray
    alignment: Alignment | None


@dataclass
class MethodResult:
    """Accuracies of one method: ``per_seed[i][domain]`` for ``seeds[i]``."""

    method: str
    seeds: list
    per_seed: list
    params: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def macro(self) -> list:
        """Macro mean over domains, one value per seed."""
        return [float(np.mean(list(acc.values()))) for acc in self.per_seed]

    def summary(self) -> dict:
        """mean ± std (ddof = 0) over seeds, per domain and for the macro mean."""
        domains = list(self.per_seed[0])
        out = {dom: mean_std([a[dom] for a in self.per_seed]) for dom in domains}
        out["macro"] = mean_std(self.macro())
        return out

    def to_json(self) -> dict:
        return dict(seeds=list(self.seeds), per_seed=self.per_seed, macro_per_seed=self.macro(),
                    summary=self.summary(), params=self.params, notes=self.notes)


def mean_std(values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std())}


def alignment_of(provenance: dict) -> Alignment | None:
    """The last ``align`` step of a file's provenance history, if any."""
    steps = [h for h in provenance.get("history", []) if h.get("step") == "align"]
    if not steps:
        return None
    return Alignment(float(steps[-1].get("tau")), steps[-1].get("reference_sha256"))


def _domain_of(path: Path, provenance: dict) -> str:
    return str(provenance.get("domain") or path.name.split(".")[0])


def load_inputs(train_paths, test_paths):
    """Read clients and test domains; check dimension, class sets and the alignment protocol.

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
        clients.append(ClientData(p, name, _domain_of(p, prov), X[keep], y[keep], alignment_of(prov)))
    for p in map(Path, test_paths):
        X, y, info = read_features(p)
        check(p, X, y, info)
        if not np.any(y >= 0):
            raise FedalignError(f"{p}: test file has no labeled rows")
        prov = info["provenance"]
        tests.append(TestDomain(p, _domain_of(p, prov), X, y, alignment_of(prov)))
    seen = [t.domain for t in tests]
    dup = sorted({d for d in seen if seen.count(d) > 1})
    if dup:
        raise FedalignError(f"more than one test file for domain {dup[0]}")
    C = len(ref[2]) or int(max([c.y.max() for c in clients] + [t.y.max() for t in tests])) + 1
    for obj in clients + tests:
        if obj.y.max() >= C:
            raise FedalignError(f"{obj.path}: label {int(obj.y.max())} out of range for {C} classes")
    class_names = ref[2] or [str(c) for c in range(C)]
    if clients:
        check_protocol(clients, tests)
    return clients, tests, class_names


def check_protocol(clients, tests) -> Alignment | None:
    """Every test domain has a client of its domain, aligned the same way (τ, reference)."""
    first = clients[0].alignment
    for c in clients[1:]:
        if (c.alignment is None) != (first is None) or (
            first is not None and (c.alignment.tau, c.alignment.reference_sha256)
            != (first.tau, first.reference_sha256)
        ):
            raise FedalignError(
                f"clients aligned differently: {clients[0].path} ({_desc(first)}) and "
                f"{c.path} ({_desc(c.alignment)})"
            )
    domains = {c.domain for c in clients}
    for t in tests:
        if t.domain not in domains:
            raise FedalignError(
                f"test domain {t.domain!r} ({t.path}) has no matching client "
                f"(client domains: {', '.join(sorted(domains))}), so no client map for it"
            )
        a = t.alignment
        same = (a is None and first is None) or (
            a is not None and first is not None and np.isclose(a.tau, first.tau)
            and a.reference_sha256 == first.reference_sha256
        )
        if not same:
            raise FedalignError(
                f"test domain {t.domain!r} ({t.path}, {_desc(a)}) is not mapped like its clients "
                f"({_desc(first)}); map it with its client's map: fedalign align --map <client map> "
                f"--tau <same τ>"
            )
    return first


def _desc(a: Alignment | None) -> str:
    return "not aligned" if a is None else "aligned " + a.describe()


def evaluate_method(method: str, clients, tests, n_classes: int, seeds, params: dict | None = None,
                    progress=None) -> MethodResult:
    """Run one registered head for every seed and score it on every test domain."""
    from fedalign.heads import get_method, run_method

    m = get_method(method)
    cfg = m.config(params)
    per_seed, notes = [], []
    data = [(c.X, c.y) for c in clients]
    for seed in seeds:
        head, _ = run_method(m, data, n_classes, seed=int(seed), params=params)
        per_seed.append({t.domain: head.accuracy(t.X, t.y) for t in tests})
        notes.extend(_method_notes(m))
        if progress is not None:
            progress(1)
    import dataclasses

    return MethodResult(method, [int(s) for s in seeds], per_seed, dataclasses.asdict(cfg),
                        sorted(set(notes)))


def _method_notes(m) -> list:
    if m.module != "fedpft":
        return []
    from fedalign.heads import fedpft

    return [f"client {k} class {c}: a single sample, no GMM fitted (count sent)"
            for k, c, _ in fedpft.LAST_REPORT.get("unfitted", [])]


def evaluate_external(method: str, inputs, tests, class_names, seeds, params) -> MethodResult:
    """Delegate a method with its own inputs (see :data:`EXTERNAL_METHODS`)."""
    fn = EXTERNAL_METHODS.get(method)
    if fn is None:
        raise FedalignError(f"unknown method {method!r} (external methods: "
                            f"{', '.join(sorted(EXTERNAL_METHODS))})")
    return fn(inputs=list(inputs), tests=tests, class_names=class_names, seeds=list(seeds), params=params)


def parse_params(values) -> dict:
    """``METHOD.KEY=VALUE`` strings → {method: {key: value}}."""
    out: dict = {}
    for v in values or []:
        key, eq, value = str(v).partition("=")
        method, dot, opt = key.strip().partition(".")
        if not eq or not dot or not opt:
            raise FedalignError(f"--param must look like METHOD.KEY=VALUE, got {v!r}")
        out.setdefault(method, {})[opt] = value.strip()
    return out


def parse_seeds(values) -> list:
    """``["0,1,2"]``, ``["0-4"]`` or ``["0", "1"]`` → sorted unique ints."""
    seeds = []
    for v in values or []:
        for tok in filter(None, (t.strip() for t in str(v).split(","))):
            try:
                if "-" in tok[1:]:
                    lo, hi = tok.split("-", 1) if tok[0] != "-" else (tok, tok)
                    seeds.extend(range(int(lo), int(hi) + 1))
                else:
                    seeds.append(int(tok))
            except ValueError:
                raise FedalignError(f"--seeds: expected integers like 0,1,2 or 0-4, got {tok!r}") from None
    if not seeds:
        raise FedalignError("--seeds: give at least one seed")
    return sorted(set(seeds))


def build_report(results, clients, tests, class_names, seeds) -> dict:
    """The JSON report (deterministic: no timestamps)."""
    from fedalign.files import sha256_file

    first = clients[0].alignment if clients else None
    return dict(
        producer="fedalign evaluate",
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

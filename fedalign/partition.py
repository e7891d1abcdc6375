"""Split per-domain feature files into federated clients (domain shift + Dirichlet label shift).

The protocol of the SLOT-Align reference code, generalised to several clients per domain:

1. **Test split.** Per domain, a stratified test split: for every class c, ``round(f · n_c)``
   randomly chosen rows go to the domain's test file (``f = test_fraction``); the rest is the
   domain's train pool P_{D,c}.
2. **Label shift.** K = D·M clients in all (M = ``clients_per_domain``). For each class c draw
   fractions ``p_{·,c} ~ Dir(α · 1_K)`` over *all* K clients. Client k of domain D keeps
   ``⌊p_{k,c} · |P_{D,c}|⌋`` of the class-c pool of its own domain; the M clients of a domain take
   disjoint consecutive slices of one random permutation of the pool (Σ_k p_{k,c} ≤ 1, so the
   slices fit). With M = 1 this is exactly the reference protocol. ``alpha=None`` gives domain
   shift only: each domain's pool is split evenly among its M clients (M = 1: all of it).
3. **Missing classes** (``drop``): classes removed from chosen clients' train data.

A *small* client (fewer than ``min_client_size`` rows, default 1: an empty one) is handled in
one of two ways:

- ``exclude_small=False`` (default): an error (:class:`~fedalign.errors.FedalignError`)
  unless ``max_redraws`` allows redrawing the Dirichlet fractions (the NIID-Bench practice,
  which uses a minimum of 10); the number of redraws used is recorded.
- ``exclude_small=True`` (the reproductions, with ``min_client_size=2``, the statistics'
  minimum, and no redraws — the SLOT-Align reference never redraws): the client *takes no
  part* in the federation, as in a real one. It gets no train file; ``Partition.excluded``
  and every written file's provenance (``participating``, ``excluded``: name → rows) record
  it. A domain left with no participating client keeps its test file; ``evaluate`` scores it
  unaligned (no client, so no map) and says so. At least one client must take part.

Everything is deterministic given ``seed``.

Output naming (:func:`write_partition`): ``<out>/<domain>.c<k>.train.h5`` for client k of a
domain and ``<out>/<domain>.test.h5`` for the domain's test split. Every file's provenance
records ``domain``, ``client``, ``split`` and the partition parameters, so ``evaluate`` matches
test domains to clients without guessing from names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError, spell


@dataclass
class Domain:
    """One domain's labeled features. X (n, d) float32, y (n,) int64, ids (n,) str."""

    name: str
    X: np.ndarray
    y: np.ndarray
    ids: np.ndarray
    class_names: list
    source: str = ""
    source_sha256: str = ""


@dataclass
class Partition:
    """Row indices into each domain: ``clients[name] = (domain, idx)``, ``tests[domain] = idx``.

    ``fractions`` is the (K, C) Dirichlet draw actually used (None for ``alpha=None``),
    ``dropped[name]`` the classes removed from a client, ``redraws`` how many Dirichlet draws
    were rejected because a client came out empty, ``excluded[name] = (domain, idx)`` the
    clients that take no part (``exclude_small``); ``clients`` holds the participants only.
    """

    clients: dict
    tests: dict
    fractions: np.ndarray | None
    dropped: dict = field(default_factory=dict)
    redraws: int = 0
    params: dict = field(default_factory=dict)
    excluded: dict = field(default_factory=dict)

    @property
    def client_names(self) -> list:
        return list(self.clients)

    def participation(self) -> dict:
        """``{"participating": [names], "excluded": {name: rows}, "clients_total": K}``."""
        return dict(participating=list(self.clients),
                    excluded={n: int(len(idx)) for n, (_, idx) in self.excluded.items()},
                    clients_total=len(self.clients) + len(self.excluded))


def client_name(domain: str, k: int) -> str:
    """Name of client k of a domain (also the file stem: ``<domain>.c<k>``)."""
    return f"{domain}.c{k}"


def load_domains(paths) -> list[Domain]:
    """Read domain feature files; check equal dimension and class sets and unique names.

    The domain name is the file stem (``amazon.h5`` → ``amazon``) unless the file's provenance
    names a ``domain``.
    """
    from fedalign.files import read_features, sha256_file

    if not paths:
        raise FedalignError("partition needs at least one domain features file")
    domains = []
    for p in paths:
        X, y, info = read_features(p)
        name = str(info["provenance"].get("domain") or Path(p).name.split(".")[0])
        if len(X) == 0:
            raise FedalignError(f"{p}: domain file has no rows")
        if np.any(y < 0):
            raise FedalignError(f"{p}: partition needs labeled rows; {int(np.sum(y < 0))} rows are unlabeled")
        domains.append(Domain(name, X, y, info["ids"], list(info["class_names"]), str(p), sha256_file(p)))
    check_compatible(domains)
    return domains


def check_compatible(domains) -> int:
    """Same dimension, same class names, unique domain names; return the number of classes C."""
    first = domains[0]
    names = [d.name for d in domains]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise FedalignError(f"domain names must be unique, got {', '.join(dup)} more than once")
    for d in domains[1:]:
        if d.X.shape[1] != first.X.shape[1]:
            raise FedalignError(
                f"dimension mismatch: {first.source} has d={first.X.shape[1]}, {d.source} has d={d.X.shape[1]}"
            )
        if d.class_names != first.class_names:
            raise FedalignError(f"class sets differ: {first.source} and {d.source} have different class names")
    C = len(first.class_names) or int(max(d.y.max() for d in domains)) + 1
    for d in domains:
        if d.y.max() >= C:
            raise FedalignError(f"{d.source}: label {int(d.y.max())} out of range for {C} classes")
    return C


def stratified_split(y: np.ndarray, test_fraction: float, rng: np.random.Generator):
    """Per class, ``round(test_fraction · n_c)`` random rows to test. Returns (train_idx, test_idx)."""
    train, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = int(round(test_fraction * len(idx)))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def parse_drop(values, class_names: list, clients: list, rng: np.random.Generator) -> dict:
    """Classes to remove per client, from the ``drop`` values of :func:`make_partition`.

    Each value is either a FRACTION in (0, 1) — every client drops ``round(f · C)`` classes
    chosen at random — or ``[CLIENT:]LIST``, a comma list of class names or indices removed
    from that client (from every client when CLIENT is omitted).
    """
    C = len(class_names)
    drop = {c: set() for c in clients}
    for v in values or []:
        v = str(v).strip()
        try:
            f = float(v)
        except ValueError:
            f = None
        if f is not None and "," not in v and 0 < f < 1:
            m = int(round(f * C))
            for c in clients:
                drop[c].update(int(i) for i in rng.choice(C, size=m, replace=False))
            continue
        target, _, lst = v.rpartition(":")
        if target and target not in drop:
            raise FedalignError(f"drop: unknown client {target!r} (clients: {', '.join(clients)})",
                                param="drop")
        classes = set()
        for tok in filter(None, (t.strip() for t in lst.split(","))):
            if tok in class_names:
                classes.add(class_names.index(tok))
            elif tok.isdigit() and int(tok) < C:
                classes.add(int(tok))
            else:
                raise FedalignError(f"drop: unknown class {tok!r}", param="drop")
        if not classes:
            raise FedalignError(f"drop: no class named in {v!r}", param="drop")
        for c in [target] if target else clients:
            drop[c].update(classes)
    return {c: sorted(s) for c, s in drop.items()}


def make_partition(domains, alpha: float | None = 0.1, seed: int = 0, test_fraction: float = 0.3,
                   clients_per_domain: int = 1, drop=None, max_redraws: int = 0,
                   min_client_size: int = 1, exclude_small: bool = False) -> Partition:
    """Compute the client and test row indices (see the module docstring for the protocol).

    Parameters
    ----------
    domains : list of :class:`Domain` (checked compatible)
    alpha : Dirichlet concentration, or None for domain shift only
    drop : list of values, each a FRACTION or ``[CLIENT:]LIST`` (see :func:`parse_drop`)
    max_redraws : redraw the Dirichlet fractions up to this many times while a client is empty
    min_client_size : a client with fewer rows counts as empty (SLOT-Align's statistics need 2)
    exclude_small : after the redraws, a client still below ``min_client_size`` takes no part
        (recorded in ``Partition.excluded``) instead of being an error
    """
    if not 0.0 <= test_fraction < 1.0:
        raise FedalignError(f"test_fraction must be in [0, 1), got {test_fraction}",
                            param="test_fraction")
    if min_client_size < 1:
        raise FedalignError(f"min_client_size must be at least 1, got {min_client_size}",
                            param="min_client_size")
    if clients_per_domain < 1:
        raise FedalignError(f"clients_per_domain must be at least 1, got {clients_per_domain}",
                            param="clients_per_domain")
    C = check_compatible(domains)
    class_names = domains[0].class_names or [str(c) for c in range(C)]
    M = clients_per_domain
    names = [client_name(d.name, m) for d in domains for m in range(M)]
    K = len(names)
    rng = np.random.default_rng(seed)
    tests, pools = {}, {}
    for d in domains:
        tr, te = stratified_split(d.y, test_fraction, rng)
        if len(te) == 0:  # the domain's test file would hold no rows
            raise FedalignError(
                f"{spell('test_fraction', f'{test_fraction:g}')} leaves the test split of domain "
                f"{d.name} empty (round(fraction · class rows) is 0 for each of its classes, "
                f"{len(d.y)} rows): give a larger {spell('test_fraction')}, in (0, 1)")
        tests[d.name] = te
        # class-c train pool of the domain, in a random order (the clients' slices)
        pools[d.name] = [rng.permutation(tr[d.y[tr] == c]) for c in range(C)]
    dropped = parse_drop(drop, class_names, names, rng)

    redraws = 0
    while True:
        P = None if alpha is None else rng.dirichlet(np.full(K, alpha), size=C).T  # (K, C)
        if P is not None and not np.allclose(P.sum(axis=0), 1.0):  # α = 1e308: all zeros
            raise FedalignError(f"{spell('alpha', f'{alpha:g}')} is too extreme for numpy's "
                                "Dirichlet sampler (its fractions do not sum to 1): give at "
                                "most 1e150, or none (domain shift only)")
        clients = _assign(domains, pools, P, M, C)
        for name in names:
            dom, idx = clients[name]
            if dropped[name]:
                y = next(d for d in domains if d.name == dom).y
                clients[name] = (dom, idx[~np.isin(y[idx], dropped[name])])
        empty = [n for n in names if len(clients[n][1]) < min_client_size]
        if not empty:
            break
        if (redraws >= max_redraws or alpha is None) and exclude_small and len(empty) < len(names):
            break
        if redraws >= max_redraws or alpha is None:
            size = "is empty" if min_client_size == 1 else f"has fewer than {min_client_size} rows"
            raise FedalignError(
                f"client {empty[0]} {size} (alpha={alpha}, seed={seed}"
                + (f", after {redraws} redraws" if redraws else "")
                + f"); use a larger {spell('alpha')}, another {spell('seed')} or a larger "
                f"{spell('max_redraws')}"
            )
        redraws += 1
    excluded = {n: clients.pop(n) for n in empty}
    params = dict(alpha=alpha, seed=seed, test_fraction=test_fraction, clients_per_domain=M,
                  drop_classes=list(drop or []), max_redraws=max_redraws,
                  min_client_size=min_client_size, exclude_small=bool(exclude_small))
    return Partition(clients, tests, P, dropped, redraws, params, excluded)


def _assign(domains, pools, P, M, C) -> dict:
    clients = {}
    for di, d in enumerate(domains):
        parts = [[] for _ in range(M)]
        for c in range(C):
            pool = pools[d.name][c]
            start = 0
            for m in range(M):
                k = di * M + m
                take = len(pool) // M if P is None else int(np.floor(P[k, c] * len(pool)))
                if P is None and m == M - 1:
                    take = len(pool) - start
                parts[m].append(pool[start : start + take])
                start += take
        for m in range(M):
            clients[client_name(d.name, m)] = (d.name, np.sort(np.concatenate(parts[m])))
    return clients


def counts_table(domains, part: Partition) -> tuple[list, np.ndarray, list, np.ndarray]:
    """Per-class counts: (client names, (K, C) train counts, domain names, (D, C) test counts)."""
    by = {d.name: d for d in domains}
    C = check_compatible(domains)
    cn = list(part.clients)
    train = np.array([np.bincount(by[dom].y[idx], minlength=C) for dom, idx in part.clients.values()])
    dn = list(part.tests)
    test = np.array([np.bincount(by[n].y[idx], minlength=C) for n, idx in part.tests.items()])
    return cn, train, dn, test


def write_partition(domains, part: Partition, out_dir) -> list[Path]:
    """Write ``<domain>.c<k>.train.h5`` per client and ``<domain>.test.h5`` per domain.

    All files are written under temporary names and renamed only once every file is complete
    (:func:`fedalign.files.atomic_outputs`), so a failure leaves no partial output (and no
    folder it created); no output may be one of the domains' source files.
    """
    from fedalign.files import atomic_outputs, check_outputs, make_output_folder, write_features

    out_dir = Path(out_dir)
    by = {d.name: d for d in domains}
    common = dict(producer="fedalign partition", domains=[d.name for d in domains],
                  clients=[client_name(d.name, m) for d in domains
                           for m in range(int(part.params.get("clients_per_domain", 1)))],
                  client_domains={n: dom for n, (dom, _) in {**part.clients, **part.excluded}.items()},
                  redraws=part.redraws,
                  **part.participation(), **part.params)
    jobs = []
    for name, (dom, idx) in part.clients.items():
        prov = dict(common, domain=dom, client=name, split="train", dropped_classes=part.dropped[name],
                    source=by[dom].source, source_sha256=by[dom].source_sha256)
        jobs.append((out_dir / f"{name}.train.h5", dom, idx, prov))
    for dom, idx in part.tests.items():
        prov = dict(common, domain=dom, client=None, split="test",
                    source=by[dom].source, source_sha256=by[dom].source_sha256)
        jobs.append((out_dir / f"{dom}.test.h5", dom, idx, prov))
    check_outputs([d.source for d in domains if d.source], [j[0] for j in jobs])
    with atomic_outputs():
        make_output_folder(out_dir)
        for path, dom, idx, prov in jobs:
            d = by[dom]
            write_features(path, d.X[idx], d.y[idx], d.ids[idx], d.class_names, prov)
    return [j[0] for j in jobs]

"""The test-time map check of SLOT-Align: whose map moved a file, read from its provenance.

Every ``align`` step records the map's owner (:func:`fedalign.align.map_provenance`): a client
map's client and domain, or a domain map's domain and contributing clients, and the digest of
the statistics the map was built from. :func:`check_protocol` (used by ``evaluate``) checks
that

- the clients were aligned alike (same τ, same reference), each with its own map;
- every test domain has a client of its domain, or none of its clients took part (the
  partition says so) and its test file is unaligned;
- every aligned test file of domain D was moved by a map of one of D's clients, built from
  the statistics that client's training file was aligned with, or by D's domain map
  (:func:`check_test_map`); anything else is refused with one error line.

With a transport layer (O-FedAvg's τ schedule) the clients' train files are unaligned and
their maps (``--map``) stand in for their alignment records (:func:`load_client_maps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError


@dataclass
class Alignment:
    """The last ``align`` step recorded in a file's provenance (None: not aligned).

    ``scope`` ("client" or "domain"; None when the map did not record its owner), ``client``,
    ``domain``, ``clients`` (a domain map's contributing clients) and the statistics' digests
    say whose map moved the file (:func:`fedalign.align.map_provenance`).
    """

    tau: float
    reference_sha256: str | None
    scope: str | None = None
    client: str | None = None
    domain: str | None = None
    clients: list = field(default_factory=list)
    stats_sha256: str | None = None
    client_stats_sha256: list = field(default_factory=list)

    def owner(self) -> str:
        if self.scope == "client":
            return f"the map of client {self.client!r} (domain {self.domain!r})"
        if self.scope == "domain":
            return f"the domain map of {self.domain!r} (clients {', '.join(self.clients)})"
        return "a map that does not record whose it is"

    def describe(self) -> str:
        ref = (self.reference_sha256 or "?")[:12]
        if np.isnan(self.tau):
            return f"client maps of reference {ref}"
        return f"τ={self.tau:g}, reference {ref}"


def alignment_of(provenance: dict) -> Alignment | None:
    """The last ``align`` step of a file's provenance history, if any."""
    steps = [h for h in provenance.get("history", []) if h.get("step") == "align"]
    if not steps:
        return None
    s = steps[-1]
    return Alignment(float(s.get("tau")), s.get("reference_sha256"), s.get("map_scope"),
                     s.get("map_client"), s.get("map_domain"), list(s.get("map_clients") or []),
                     s.get("stats_sha256"), list(s.get("client_stats_sha256") or []))


def alignment_of_map(amap) -> Alignment:
    """The owner record of a client map (``--map`` for a transport layer), τ unknown."""
    m = amap.meta
    return Alignment(float("nan"), m.get("reference_sha256"), m.get("scope"), m.get("client"),
                     m.get("domain"), list(m.get("clients") or []), m.get("stats_sha256"),
                     list(m.get("client_stats_sha256") or []))


def no_participant(domain: str, provenance: dict) -> bool:
    """Whether the partition recorded that none of ``domain``'s clients took part."""
    doms = provenance.get("client_domains") or {}
    mine = [n for n, d in doms.items() if d == domain]
    return bool(mine) and not set(mine) & set(provenance.get("participating") or [])


def load_client_maps(paths) -> dict:
    """Client maps (``--map``) for a transport layer: {client name: AffineMap}, keyed by the
    client each map records (matched to the train files by :func:`load_inputs`)."""
    from fedalign.align import load_map

    maps = {}
    for p in map(Path, paths or []):
        amap = load_map(p)
        who = amap.meta.get("client")
        if amap.meta.get("scope") != "client" or who is None:
            raise FedalignError(f"{p}: not a client map that records its client (use the --save-map "
                                "output of `fedalign align` on the client's training file)")
        if who in maps:
            raise FedalignError(f"{p}: a second map for client {who!r}")
        maps[who] = amap
    return maps


def match_maps(maps: dict, clients) -> None:
    names = [c.name for c in clients]
    missing = [n for n in names if n not in maps]
    if missing:
        raise FedalignError(f"no --map for client {missing[0]!r} (maps given for: "
                            f"{', '.join(sorted(maps)) or 'none'})")
    extra = sorted(set(maps) - set(names))
    if extra:
        raise FedalignError(f"--map for client {extra[0]!r}, which is not among the --train clients")


def check_protocol(clients, tests, maps=None) -> Alignment | None:
    """Every test domain has a client of its domain, aligned the same way (τ, reference), and
    every aligned test file of domain D was moved by a map of one of D's clients or by D's
    domain map (see the module docstring)."""
    if maps is not None:
        own = _owners_from_maps(clients, maps)
        first = Alignment(float("nan"), next(iter(own.values())).reference_sha256)
    else:
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
        own = {c.name: c.alignment for c in clients}
        for c in clients:
            a = c.alignment
            if a is not None and not ((a.scope == "client" and a.client == c.name)
                                      or (a.scope == "domain" and a.domain == c.domain)):
                raise FedalignError(f"client file {c.path} ({c.name!r}) was aligned with {a.owner()}, "
                                    "not its own; align it with its own statistics")
    domains = {c.domain for c in clients}
    for t in tests:
        if t.domain not in domains:
            if t.no_participant and t.alignment is None:
                continue  # scored unaligned; evaluate_method notes it
            raise FedalignError(
                f"test domain {t.domain!r} ({t.path}) has no matching client "
                f"(client domains: {', '.join(sorted(domains))}), so no client map for it"
            )
        a = t.alignment
        if maps is not None:
            same = a is not None and a.reference_sha256 == first.reference_sha256
        else:
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
        if a is not None:
            check_test_map(t, a, [c for c in clients if c.domain == t.domain], own)
    return first


def _owners_from_maps(clients, maps) -> dict:
    for c in clients:
        if c.alignment is not None:
            raise FedalignError(f"with --map (a transport layer) the client train files must be unaligned; "
                                f"{c.path} is {_desc(c.alignment)}")
    own = {name: alignment_of_map(m) for name, m in maps.items()}
    refs = {a.reference_sha256 for a in own.values()}
    if len(refs) != 1:
        raise FedalignError("the client maps were built against different references")
    for c in clients:
        if own[c.name].domain not in (None, c.domain):
            raise FedalignError(f"the map of client {c.name!r} records domain {own[c.name].domain!r}, "
                                f"its train file {c.path} domain {c.domain!r}")
    return own


def check_test_map(t, a: Alignment, domain_clients, own: dict) -> None:
    """Refuse a test file of domain D mapped with a map that is neither one of D's clients'
    (built from the statistics that client's training file was aligned with) nor D's."""
    D = t.domain
    names = sorted(c.name for c in domain_clients)
    fix = (f"map it with the map of one of {D!r}'s clients ({', '.join(names)}: align --map) or "
           f"with {D!r}'s domain map (align --stats of each of its clients)")
    if a.scope == "client":
        if a.client not in names:
            raise FedalignError(f"test file {t.path} of domain {D!r} was mapped with {a.owner()}, "
                                f"which is not one of {D!r}'s clients; {fix}")
        mine = own.get(a.client)
        if mine is not None and mine.stats_sha256 and a.stats_sha256 and mine.stats_sha256 != a.stats_sha256:
            raise FedalignError(f"test file {t.path} of domain {D!r} was mapped with a map of client "
                                f"{a.client!r} built from other statistics than that client's training "
                                f"file was aligned with; {fix}")
    elif a.scope == "domain":
        if a.domain != D:
            raise FedalignError(f"test file {t.path} of domain {D!r} was mapped with {a.owner()}; {fix}")
        for cl, dig in zip(a.clients, a.client_stats_sha256):
            mine = own.get(cl)
            if cl in names and mine is not None and mine.stats_sha256 and dig != mine.stats_sha256:
                raise FedalignError(f"test file {t.path} of domain {D!r} was mapped with a domain map "
                                    f"pooling other statistics of client {cl!r} than its training file "
                                    f"was aligned with; {fix}")
    else:
        raise FedalignError(f"test file {t.path} of domain {D!r} was mapped with {a.owner()} (made "
                            f"before fedalign recorded map owners); rebuild the maps with fedalign align")


def _desc(a: Alignment | None) -> str:
    return "not aligned" if a is None else "aligned " + a.describe()

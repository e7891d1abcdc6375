"""SLOT-Align: server barycenter reference and client-side Gaussian OT maps on feature files.

Protocol (one shot):

1. each client k sends (n_k, μ_k, Σ_k) — :mod:`fedalign.stats`;
2. the server returns the Bures–Wasserstein barycenter N(μ_b, Σ_b) — :func:`make_reference`;
3. client k builds its map A_k, b_k from its *training* statistics (:func:`client_map`) and
   moves every feature along the W2 geodesic, T_τ(z) = (1−τ) z + τ (A_k z + b_k)
   (:func:`align_file`). The same map is applied to that domain's test features.

Provenance. A map records whose it is: ``scope="client"`` with the ``client`` and its
``domain`` (:func:`client_map`), or ``scope="domain"`` with the ``domain`` and its
contributing ``clients`` (:func:`domain_map`, several clients per domain), and the digest of
the statistics it was built from (:func:`stats_digest`; for a domain map also each client's).
:func:`map_provenance` copies this into the ``align`` step of every aligned file's history, so
``evaluate`` can refuse a test file of domain D mapped with a map that belongs neither to one
of D's clients nor to D. When the statistics or the reference's inputs are DP releases, the
map and the aligned files also carry their records (``dp``, :mod:`fedalign.dp.accounting`),
from which ``evaluate`` composes each client's privacy loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedalign import defaults
from fedalign.backend import get_backend
from fedalign.errors import FedalignError, short_array
from fedalign.gaussian import gaussian_barycenter, interpolate_map, ot_maps

#: Default geodesic time (the SLOT-Align reference implementation's fixed-mode default).
DEFAULT_TAU = defaults.TAU


@dataclass
class Reference:
    """The server's reference Gaussian (barycenter) and how it was obtained."""

    mean: np.ndarray
    covariance: np.ndarray
    weights: np.ndarray
    n: np.ndarray
    meta: dict

    @property
    def d(self) -> int:
        return self.mean.shape[0]


@dataclass
class AffineMap:
    """A client's Gaussian OT map z ↦ A z + b (τ = 1) towards a reference."""

    A: np.ndarray
    b: np.ndarray
    meta: dict


def make_reference(stats_list, weights: str = "samples", tol: float = 1e-10,
                   max_iter: int = 100, progress=None, backend="numpy",
                   device="cpu") -> Reference:
    """Bures–Wasserstein barycenter of client stats.

    Parameters
    ----------
    stats_list : list of :class:`fedalign.stats.GaussianStats`
    weights : "samples" (w_k = n_k / N) or "uniform"
    progress : optional callable(iteration, rel_change, residual) after every fixed-point
        iteration
    backend, device : where the fixed point runs (:func:`fedalign.backend.get_backend`); a
        torch run records ``compute`` (backend, device) in the reference's metadata
    """
    bk = get_backend(backend, device)
    if not stats_list:
        raise FedalignError("barycenter needs at least one stats file")
    d = stats_list[0].d
    for st in stats_list:
        if st.d != d:
            raise FedalignError(f"dimension mismatch between stats files: d={d} and d={st.d}")
    n = np.array([st.n for st in stats_list], dtype=np.int64)
    if weights == "samples":
        w = n / n.sum()
    elif weights == "uniform":
        w = np.full(len(n), 1.0 / len(n))
    else:
        raise FedalignError(f"weights must be 'samples' or 'uniform', got {weights!r}")
    bc = gaussian_barycenter([s.mean for s in stats_list], [s.covariance for s in stats_list],
                             w, tol=tol, max_iter=max_iter, progress=progress, backend=bk,
                             merge_identical=True)
    meta = dict(convergence=bc.record(), weighting=weights, tol=tol, max_iter=max_iter)
    if bk.record():
        meta["compute"] = bk.record()
    return Reference(bc.mean, bc.covariance, bc.weights, n, meta)


#: ``barycenter --storage auto`` holds the clients' covariances factored
#: (:func:`compact_covariance`) when K dense d × d float64 matrices would take more than this.
COMPACT_ABOVE_BYTES = 1 << 30


@dataclass
class ClientStats:
    """One client's statistics as the server holds them: the Gaussian proxy (covariance
    possibly factored, no moment sums), the file's metadata, the statistics' digest
    (:func:`stats_digest`) and the file's sha256."""

    stats: object
    meta: dict
    digest: str
    sha256: str


def compact_covariance(st):
    """A client's covariance as c I + W Wᵀ (:class:`fedalign.linalg.ScaledIdentityPlusLowRank`,
    c = s·tr Σ/d for Ledoit–Wolf shrinkage s) when that is exact with rank ≤ d/2 (a client
    with n < d/2 rows); else the dense matrix."""
    from fedalign.linalg import factor_scaled_identity

    C = st.covariance
    d = C.shape[0]
    f = factor_scaled_identity(C, st.shrinkage * float(np.trace(C)) / d, d // 2)
    return C if f is None else f


def _factored_spd(st, path):
    """:func:`compact_covariance`, with the proof that the covariance is symmetric positive
    definite (``read_npz``'s check, skipped): C = c I + W Wᵀ + E with ‖E‖_F verified tiny,
    so λ_min(C) ≥ c − ‖E‖_F, which must exceed check_spd's d·eps·tr C; otherwise (dense, or
    c too small) the full check runs."""
    from fedalign.files import check_spd

    C = st.covariance
    f = compact_covariance(st)
    if f is not C:
        tr = float(np.trace(C))
        if f.c - f.error > C.shape[0] * np.finfo(np.float64).eps * tr > 0:
            return f
    st.covariance = check_spd(C, f"{path}: 'covariance'")
    return st.covariance if f is C else f


def load_client_stats(paths, storage: str = "auto", progress=None) -> list:
    """Read K clients' stats files for the server, in memory that grows as the statistics
    must: O(K·d·r) for clients of rank r < d/2 instead of O(K·d²).

    The files are checked first, cheaply: no file twice (:func:`fedalign.files.check_distinct`),
    then every header (kind, format_version, d) before any array is read
    (:func:`check_stats_headers`: the first offender is the error). Then each
    file is read once: digest, sha256, and its covariance kept factored or dense by
    ``storage`` ("auto": factored when K·d²·8 > :data:`COMPACT_ABOVE_BYTES`; "factored";
    "dense"); the moment sums are dropped.

    Returns
    -------
    list of :class:`ClientStats`
    """
    from fedalign.files import check_distinct, sha256_file
    from fedalign.stats import load_stats

    if storage not in ("auto", "factored", "dense"):
        raise FedalignError(f"storage must be auto, factored or dense, got {storage!r}")
    paths = list(paths)
    if not paths:
        raise FedalignError("barycenter needs at least one stats file")
    check_distinct(paths, "stats file")
    d = check_stats_headers(paths)
    factored = storage == "factored" or (storage == "auto"
                                         and len(paths) * d * d * 8 > COMPACT_ABOVE_BYTES)
    out = []
    for p in paths:
        st = load_stats(p, check_spd=not factored)
        digest, sha = stats_digest(st), sha256_file(p)
        if factored:
            st.covariance = _factored_spd(st, p)
        st.moments = None
        out.append(ClientStats(st, st.meta, digest, sha))
        if progress is not None:
            progress(1)
    return out


def check_stats_headers(paths) -> int:
    """The common dimension d of many stats files, from their headers only
    (:func:`fedalign.files.npz_header`: no array is read): the first file of another kind,
    an unsupported format_version or another d is the error, and the files after it are not
    opened. Returns d."""
    from fedalign.files import npz_header

    d0, first = None, None
    for p in paths:
        shapes = npz_header(p, "stats")["shapes"]
        shp = shapes.get("mean")
        if shp is None or len(shp) != 1:
            raise FedalignError(f"{p}: missing array 'mean' (d,) for a stats file")
        if d0 is None:
            d0, first = int(shp[0]), p
        elif int(shp[0]) != d0:
            raise FedalignError(f"{p}: dimension mismatch: statistics of d={int(shp[0])}, but "
                                f"{first} has d={d0} (every client's statistics must have one "
                                "dimension)")
    if d0 is None:
        raise FedalignError("no stats files given")
    return d0


def save_reference(path, ref: Reference, extra_meta: dict | None = None):
    from fedalign.files import write_npz

    meta = dict(ref.meta, **(extra_meta or {}))
    return write_npz(path, "reference", dict(mean=ref.mean, covariance=ref.covariance,
                                             weights=ref.weights, n=ref.n), meta)


def load_reference(path) -> Reference:
    """Read and validate a ``reference`` file: besides its schema, the clients' weights w_k
    are ≥ 0 and sum to 1 and their row counts n_k are ≥ 1 (as every writer makes them)."""
    from fedalign.files import read_npz, sha256_file

    a, meta = read_npz(path, "reference")
    w, n = a["weights"], a["n"]
    if np.any(w < 0) or not np.isclose(w.sum(), 1.0, rtol=1e-6):
        raise FedalignError(f"{path}: reference 'weights' (the clients' w_k) must be ≥ 0 and "
                            f"sum to 1, got {short_array(w)} (sum {float(w.sum()):.6g})")
    if np.any(n < 1):
        raise FedalignError(f"{path}: reference 'n' (the clients' row counts) must be ≥ 1, "
                            f"got {short_array(n)}")
    meta = dict(meta, sha256=sha256_file(path))
    return Reference(a["mean"].astype(float), a["covariance"].astype(float),
                     a["weights"].astype(float), a["n"], meta)


def stats_digest(stats) -> str:
    """sha256 of a Gaussian proxy: n (int64), mean (d,) and covariance (d, d) as float64 bytes.

    The same statistics give the same digest whether they were read from a stats file or
    computed in memory.
    """
    import hashlib

    h = hashlib.sha256()
    h.update(np.int64(stats.n).tobytes())
    h.update(np.ascontiguousarray(stats.mean, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(stats.covariance, dtype=np.float64).tobytes())
    return h.hexdigest()


def client_map(stats, ref: Reference, client: str | None = None, domain: str | None = None,
               backend="numpy", device="cpu") -> AffineMap:
    """OT map from a client's Gaussian proxy to the reference (τ = 1), owned by ``client``
    (``backend``, ``device``: where its eigendecompositions run)."""
    return client_maps([stats], ref, [client], [domain], backend, device)[0]


def client_maps(stats_list, ref: Reference, clients=None, domains=None, backend="numpy",
                device="cpu") -> list:
    """:func:`client_map` of every client onto one reference, the reference's root computed
    once (:func:`fedalign.gaussian.ot_maps`; the same maps, bit for bit)."""
    K = len(stats_list)
    clients = list(clients) if clients is not None else [None] * K
    domains = list(domains) if domains is not None else [None] * K
    for st in stats_list:
        if st.d != ref.d:
            raise FedalignError(f"dimension mismatch: client d={st.d}, reference d={ref.d}")
    return maps_onto(stats_list, ref, [dict(scope="client", client=c, domain=dm)
                                       for c, dm in zip(clients, domains)], backend, device)


def maps_onto(stats_list, ref: Reference, owners, backend="numpy", device="cpu") -> list:
    """The one builder of maps: the OT map (τ = 1) of every Gaussian proxy of ``stats_list``
    onto ``ref`` (:func:`fedalign.gaussian.ot_maps`: Σ_b^{1/2} once, then one
    eigendecomposition per proxy), each with the metadata of its ``owners`` entry
    (:func:`map_meta`). :func:`client_maps`, :func:`domain_map` and
    :class:`fedalign.federation.Federation` build their maps here.

    Returns
    -------
    list of :class:`AffineMap` — A (d, d), b (d,), meta
    """
    maps = ot_maps([(st.mean, st.covariance) for st in stats_list], ref.mean, ref.covariance,
                   backend, device)
    return [AffineMap(A, b, map_meta(st, ref, owner))
            for (A, b), st, owner in zip(maps, stats_list, owners)]


def map_meta(stats, ref: Reference, owner: dict) -> dict:
    """The metadata of the map of ``stats`` onto ``ref`` (what :func:`map_provenance` and
    :mod:`fedalign.protocol` read): the reference's sha256, n, the owner — ``scope="client"``
    with its ``client`` and ``domain``, or ``scope="domain"`` with its ``domain``, contributing
    ``clients`` and their ``client_stats_sha256`` —, the statistics' digest
    (:func:`stats_digest`) and, when the statistics or the reference's inputs are DP
    releases, their records (``dp``)."""
    domain = owner["scope"] == "domain"
    meta = dict(reference_sha256=ref.meta.get("sha256"), n=int(stats.n), scope=owner["scope"],
                client=owner.get("client"), domain=owner.get("domain"))
    if domain:
        meta["clients"] = list(owner["clients"])
    meta["stats_sha256"] = stats_digest(stats)
    if domain:
        meta["client_stats_sha256"] = list(owner["client_stats_sha256"])
    return _with_dp(meta, stats, ref)


def _with_dp(meta: dict, stats, ref: Reference) -> dict:
    """``meta`` plus ``dp`` (:func:`fedalign.dp.map_record`) when the statistics or the
    reference's inputs are DP releases; unchanged otherwise."""
    if stats.dp is None and not ref.meta.get("dp_inputs"):
        return meta
    from fedalign.dp import map_record

    return dict(meta, dp=map_record(stats.dp, ref.meta))


def domain_map(stats_list, ref: Reference, domain: str, clients, backend="numpy",
               device="cpu") -> AffineMap:
    """OT map of a domain's pooled Gaussian (its clients' statistics pooled exactly,
    :func:`fedalign.pooling.pool_stats`) to the reference (τ = 1).

    The rule for a domain with several clients: its test split is mapped by this map. With one
    client the pooled Gaussian is that client's, so the map equals :func:`client_map`'s.
    """
    from fedalign.pooling import pool_stats

    clients = [str(c) for c in clients]
    if len(clients) != len(stats_list):
        raise FedalignError(f"{len(stats_list)} statistics for {len(clients)} clients")
    pooled = pool_stats(stats_list) if len(stats_list) > 1 else stats_list[0]
    if pooled.d != ref.d:
        raise FedalignError(f"dimension mismatch: domain d={pooled.d}, reference d={ref.d}")
    owner = dict(scope="domain", domain=str(domain), clients=clients,
                 client_stats_sha256=[stats_digest(s) for s in stats_list])
    return maps_onto([pooled], ref, [owner], backend, device)[0]


def map_provenance(amap: AffineMap, reference_sha256: str | None = None) -> dict:
    """The owner record an aligned file's ``align`` step carries (see the module docstring)."""
    m = amap.meta
    out = dict(reference_sha256=reference_sha256 or m.get("reference_sha256"),
               map_scope=m.get("scope"), map_client=m.get("client"), map_domain=m.get("domain"),
               stats_sha256=m.get("stats_sha256"))
    if m.get("scope") == "domain":
        out.update(map_clients=list(m.get("clients", [])),
                   client_stats_sha256=list(m.get("client_stats_sha256", [])))
    if m.get("dp") is not None:
        out["dp"] = m["dp"]  # DP records carried forward (fedalign.dp.accounting)
    return out


def save_map(path, amap: AffineMap):
    from fedalign.files import write_npz

    return write_npz(path, "map", dict(A=amap.A, b=amap.b), amap.meta)


def load_map(path) -> AffineMap:
    from fedalign.files import read_npz

    a, meta = read_npz(path, "map")
    return AffineMap(a["A"].astype(float), a["b"].astype(float), meta)


def apply_map(X: np.ndarray, amap: AffineMap, tau: float) -> np.ndarray:
    """T_τ applied to rows of X (n, d); float32 out. Library form of :func:`align_file`."""
    At, bt = interpolate_map(amap.A, amap.b, tau)
    X = np.asarray(X, dtype=np.float32)
    return (X @ At.T.astype(np.float32)) + bt.astype(np.float32)


def align_file(src, out, amap: AffineMap, tau: float = DEFAULT_TAU, chunk_rows: int = defaults.CHUNK_ROWS,
               provenance: dict | None = None, progress=None, backend="numpy",
               device="cpu") -> Path:
    """Stream a features file through T_τ into ``out`` (atomic); labels, ids, names kept.

    The product is float32 (z ↦ z Aᵀ_τ + b_τ), with numpy BLAS or, with ``backend="torch"``,
    on ``device`` (pinned, non-blocking copies); a torch run records ``compute`` (backend,
    device) in the file's ``align`` step.
    """
    from fedalign.files import FeatureWriter, atomic_output, open_features

    At, bt = interpolate_map(amap.A, amap.b, tau)    # the one check of τ ∈ [0, 1]
    tau = float(tau)
    bk = get_backend(backend, device)
    if bk.record():
        provenance = dict(provenance or {}, compute=bk.record())
    At32, bt32 = np.ascontiguousarray(At.T, dtype=np.float32), bt.astype(np.float32)
    with open_features(src) as ff:
        if ff.d != amap.A.shape[0]:
            raise FedalignError(f"dimension mismatch: {src} has d={ff.d}, map has d={amap.A.shape[0]}")
        prov = dict(ff.provenance)
        prov["history"] = list(prov.get("history", [])) + [dict(provenance or {}, step="align", tau=tau)]
        ids = ff.ids
        with atomic_output(out, suffix=".tmp.h5") as tmp:
            with FeatureWriter(tmp, ff.d, ff.class_names, prov, chunk_rows=min(chunk_rows, 4096),
                               expected_rows=ff.n) as w:
                _pipeline(ff.iter_chunks(chunk_rows, with_labels=True), At32, bt32, w, ids,
                          progress, bk=bk)
    return Path(out)


def _pipeline(chunks, At32, bt32, writer, ids, progress, workers: int = 2, bk=None):
    """Map chunks in worker threads while HDF5 reads/writes proceed in this one.

    Each worker runs its matrix product with one BLAS thread (products release the GIL), so
    the products of consecutive chunks and the I/O share the cores without BLAS threads
    waiting on each other. With a torch backend the same float32 product runs on its device.
    """
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    bk = get_backend(bk)
    At32, bt32 = bk.asarray(At32, np.float32), bk.asarray(bt32, np.float32)  # (numpy: as they are)

    def affine(X):  # X float32 (iter_chunks)
        with bk.guard(f"align of a {X.shape[0]} × {X.shape[1]} block",
                      8 * X.size + 4 * At32.shape[0] * At32.shape[1]):
            Z = bk.asarray(X, np.float32) @ At32
            Z += bt32
            return bk.to_numpy(Z)

    pending = deque()
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        for start, X, y in chunks:
            pending.append((start, pool.submit(affine, X), y))
            if len(pending) > workers:
                _flush(pending.popleft(), writer, ids, progress)
        while pending:
            _flush(pending.popleft(), writer, ids, progress)


def _flush(pending, writer, ids, progress):
    start, fut, y = pending
    Z = fut.result()
    writer.append(Z, y, ids[start : start + len(Z)])
    if progress is not None:
        progress(len(Z))

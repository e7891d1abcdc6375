"""Every file kind fedalign reads or writes: definition, version, writer, validating reader.

One home for every file kind. Each file carries a ``kind`` and a ``format_version``; readers
reject wrong kinds, wrong versions, missing arrays, shape mismatches and NaN/Inf with a
:class:`~fedalign.errors.FedalignError` (one readable line, exit code 2 in the CLI).

File kinds
----------
========== ====== =====================================================================
kind       format what it holds (and what may leave a client)
========== ====== =====================================================================
features   .h5    ``features`` (n, d) float32, ``labels`` (n,) int64 (-1 = unlabeled),
                  ``ids`` (n,) str; attrs ``class_names``, ``provenance``. Private.
stats      .npz   n, mean (d,), Ledoit–Wolf covariance (d, d), shrinkage, raw moment sums
                  around a shift; optional class counts / sums. Aggregates only, shareable.
reference  .npz   Bures–Wasserstein barycenter: mean (d,), covariance (d, d), weights,
                  convergence record. Sent by the server to every client.
map        .npz   a client's affine OT map to the reference: A (d, d), b (d,). Private.
gmm        .npz   diagonal GMM: weights (K,), means (K, d), variances (K, d),
                  optional labels (K, C). Private to its client.
atoms      .npz   a client's dictionary atoms after a gossip round: means (A, K, d),
                  variances (A, K, d), label logits (A, K, C), round; meta: producer
                  (client id). Nothing else (no α, no GMM, no sample). Published to peers.
state      .npz   a DaDiL client's private state (atoms, barycentric weights, Adam
                  moments, PCG64 RNG state, round; meta: client id, GMM path + sha256,
                  settings). Never published.
report     .json  evaluation results (accuracy tables).
========== ====== =====================================================================

All writers go through :func:`atomic_output`: the file is written under a temporary name in
the same folder and renamed at the end, so a failure never leaves a partial output file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from fedalign.errors import FedalignError

# --------------------------------------------------------------------------------------------
# Schemas. Shapes use symbolic dimension names; every symbol must take one value in a file.
# An array spec is (shape, dtype kind) with dtype kind "f" (float), "i" (integer), "U" (str).
# Optional arrays are listed in ``optional``; a symbol of an absent optional array is unbound.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """Definition of one ``.npz`` file kind."""

    kind: str
    version: int
    required: dict
    optional: dict = field(default_factory=dict)


SCHEMAS: dict[str, Schema] = {}


def _schema(kind, version, required, optional=None):
    SCHEMAS[kind] = Schema(kind, version, required, optional or {})


_schema(
    "stats",
    1,
    required={
        "n": ((), "i"),
        "mean": (("d",), "f"),
        "covariance": (("d", "d"), "f"),
        "shrinkage": ((), "f"),
        "shift": (("d",), "f"),
        "sum_y": (("d",), "f"),
        "sum_yy": (("d", "d"), "f"),
        "sum_sqnorm_y": (("d",), "f"),
        "sum_sqnorm2": ((), "f"),
    },
    optional={
        "class_counts": (("C",), "i"),
        "class_sums": (("C", "d"), "f"),
        "class_names": (("C",), "U"),
    },
)
_schema(
    "reference",
    1,
    required={
        "mean": (("d",), "f"),
        "covariance": (("d", "d"), "f"),
        "weights": (("K",), "f"),
        "n": (("K",), "i"),
    },
)
_schema(
    "map",
    1,
    required={
        "A": (("d", "d"), "f"),
        "b": (("d",), "f"),
    },
)
_schema(
    "gmm",
    1,
    required={
        "weights": (("K",), "f"),
        "means": (("K", "d"), "f"),
        "variances": (("K", "d"), "f"),
    },
    optional={
        "labels": (("K", "C"), "f"),
        "class_names": (("C",), "U"),
    },
)
_schema(
    "atoms",
    1,
    required={
        "means": (("A", "K", "d"), "f"),
        "variances": (("A", "K", "d"), "f"),
        "label_logits": (("A", "K", "C"), "f"),
        "round": ((), "i"),
    },
)
_schema(
    "state",
    1,
    required={
        "means": (("A", "K", "d"), "f"),
        "variances": (("A", "K", "d"), "f"),
        "label_logits": (("A", "K", "C"), "f"),
        "alpha": (("A",), "f"),
        "round": ((), "i"),
        "rng_state": (("six",), "i"),
    },
    optional={
        "adam_step": ((), "i"),
        "adam_means_exp_avg": (("A", "K", "d"), "f"),
        "adam_means_exp_avg_sq": (("A", "K", "d"), "f"),
        "adam_variances_exp_avg": (("A", "K", "d"), "f"),
        "adam_variances_exp_avg_sq": (("A", "K", "d"), "f"),
        "adam_label_logits_exp_avg": (("A", "K", "C"), "f"),
        "adam_label_logits_exp_avg_sq": (("A", "K", "C"), "f"),
        "adam_alpha_exp_avg": (("A",), "f"),
        "adam_alpha_exp_avg_sq": (("A",), "f"),
    },
)

FEATURES_KIND = "features"
FEATURES_VERSION = 1
REPORT_KIND = "report"
REPORT_VERSION = 1

_META_KEY = "__meta__"
_KIND_KEY = "__kind__"
_VERSION_KEY = "__format_version__"


# --------------------------------------------------------------------------------------------
# Atomic output and hashing
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it to ``path`` on success.

    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FedalignError(f"output folder does not exist: {folder}")
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=(suffix if suffix is not None else ".tmp" + path.suffix),
        dir=folder,
    )
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def sha256_file(path: str | os.PathLike, block: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def _require_file(path) -> Path:
    path = Path(path)
    if not path.exists():
        raise FedalignError(f"no such file: {path}")
    if not path.is_file():
        raise FedalignError(f"not a file: {path}")
    return path


# --------------------------------------------------------------------------------------------
# .npz kinds
# --------------------------------------------------------------------------------------------


def write_npz(path, kind: str, arrays: dict, meta: dict | None = None) -> Path:
    """Validate ``arrays`` against the schema of ``kind`` and write them atomically.

    ``meta`` is any JSON-serialisable dict (provenance, convergence record, parameters);
    it is stored as a JSON string, never pickled.
    """
    schema = _get_schema(kind)
    arrays = {k: np.asarray(v) for k, v in arrays.items() if v is not None}
    _validate_arrays(arrays, schema, source=f"{kind} being written to {path}")
    payload = dict(arrays)
    payload[_KIND_KEY] = np.array(kind)
    payload[_VERSION_KEY] = np.array(schema.version)
    payload[_META_KEY] = np.array(json.dumps(meta or {}, sort_keys=True))
    path = Path(path)
    with atomic_output(path, suffix=".tmp.npz") as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **payload)
    return path


def read_npz(path, kind: str) -> tuple[dict, dict]:
    """Read and validate a ``.npz`` file of the given kind.

    Returns
    -------
    arrays : dict of str -> ndarray
    meta : dict
    """
    schema = _get_schema(kind)
    path = _require_file(path)
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic.startswith(b"\x89HDF"):
        raise FedalignError(f"{path}: is an HDF5 file (features?), expected a {kind} .npz file")
    if not magic.startswith(b"PK"):
        raise FedalignError(f"{path}: not a readable .npz file, expected a {kind} file")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise FedalignError(f"{path}: refuses to load an .npz that needs pickle") from None
        raise FedalignError(f"{path}: not a readable .npz file ({e})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise FedalignError(f"{path}: not a readable .npz file ({e})") from None
    if _KIND_KEY not in data:
        raise FedalignError(f"{path}: not a fedalign file (no 'kind'); expected a {kind} file")
    found = str(data.pop(_KIND_KEY))
    if found != kind:
        raise FedalignError(f"{path}: is a {found} file, expected a {kind} file")
    version = int(data.pop(_VERSION_KEY, -1))
    if version != schema.version:
        raise FedalignError(
            f"{path}: {kind} format_version {version} is not supported (expected {schema.version})"
        )
    meta = json.loads(str(data.pop(_META_KEY, "{}")))
    _validate_arrays(data, schema, source=str(path))
    return data, meta


def _get_schema(kind: str) -> Schema:
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise ValueError(f"unknown file kind {kind!r}") from None


def _validate_arrays(arrays: dict, schema: Schema, source: str) -> dict:
    """Check presence, dtype kind, symbolic shapes and finiteness; return the symbol sizes."""
    sizes: dict[str, int] = {}
    for name, (shape, dkind) in list(schema.required.items()) + list(schema.optional.items()):
        if name not in arrays:
            if name in schema.required:
                raise FedalignError(f"{source}: missing array '{name}' for a {schema.kind} file")
            continue
        a = arrays[name]
        if dkind == "f" and a.dtype.kind not in "fiu":
            raise FedalignError(f"{source}: array '{name}' must be numeric, got {a.dtype}")
        if dkind == "i" and a.dtype.kind not in "iu":
            raise FedalignError(f"{source}: array '{name}' must be integer, got {a.dtype}")
        if dkind == "U" and a.dtype.kind not in "US":
            raise FedalignError(f"{source}: array '{name}' must hold strings, got {a.dtype}")
        if a.ndim != len(shape):
            raise FedalignError(
                f"{source}: array '{name}' has shape {a.shape}, expected {len(shape)} dimensions"
            )
        for sym, n in zip(shape, a.shape):
            if sizes.setdefault(sym, n) != n:
                raise FedalignError(
                    f"{source}: shape mismatch: '{name}' has {sym}={n}, elsewhere {sym}={sizes[sym]}"
                )
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise FedalignError(f"{source}: array '{name}' contains NaN or Inf")
    return sizes


# --------------------------------------------------------------------------------------------
# Features (.h5)
# --------------------------------------------------------------------------------------------

DEFAULT_CHUNK_ROWS = 8192


class FeatureFile:
    """Read-only view of a features ``.h5`` file, validated on open.

    Rows are read in chunks (:meth:`iter_chunks`) so memory does not grow with n; every chunk
    is checked for NaN/Inf as it is read.

    Attributes
    ----------
    path : Path
    n, d : int
    class_names : list of str
    provenance : dict
    """

    def __init__(self, path):
        import h5py

        self.path = _require_file(path)
        try:
            self._h5 = h5py.File(self.path, "r")
        except OSError as e:
            raise FedalignError(f"{self.path}: not a readable HDF5 file ({_short(e)})") from None
        try:
            self._validate()
        except BaseException:
            self._h5.close()
            raise

    def _validate(self):
        h5, p = self._h5, self.path
        kind = _attr_str(h5.attrs.get("kind"))
        if kind != FEATURES_KIND:
            raise FedalignError(
                f"{p}: is {'a ' + kind + ' file' if kind else 'not a fedalign file'}, "
                "expected a features file"
            )
        version = int(h5.attrs.get("format_version", -1))
        if version != FEATURES_VERSION:
            raise FedalignError(
                f"{p}: features format_version {version} is not supported "
                f"(expected {FEATURES_VERSION})"
            )
        for name in ("features", "labels", "ids"):
            if name not in h5:
                raise FedalignError(f"{p}: missing dataset '{name}'")
        f = h5["features"]
        if f.ndim != 2:
            raise FedalignError(f"{p}: 'features' must be 2-D, got shape {f.shape}")
        self.n, self.d = (int(s) for s in f.shape)
        if h5["labels"].shape != (self.n,) or h5["ids"].shape != (self.n,):
            raise FedalignError(
                f"{p}: shape mismatch: features {f.shape}, labels {h5['labels'].shape}, "
                f"ids {h5['ids'].shape}"
            )
        self.class_names = list(json.loads(_attr_str(h5.attrs.get("class_names")) or "[]"))
        self.provenance = json.loads(_attr_str(h5.attrs.get("provenance")) or "{}")

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._h5.close()

    # -- data ----------------------------------------------------------------------------------
    @property
    def labels(self) -> np.ndarray:
        """(n,) int64 labels, -1 for unlabeled rows."""
        return np.asarray(self._h5["labels"][...], dtype=np.int64)

    @property
    def ids(self) -> np.ndarray:
        """(n,) str row identifiers (relative paths for extracted images)."""
        return np.asarray(self._h5["ids"].asstr()[...], dtype=str)

    @property
    def skipped(self) -> list:
        """Inputs skipped at extraction (``--skip-bad``)."""
        return list(json.loads(_attr_str(self._h5.attrs.get("skipped")) or "[]"))

    def iter_chunks(self, chunk_rows: int = DEFAULT_CHUNK_ROWS, with_labels: bool = False):
        """Yield ``(start, X)`` or ``(start, X, y)`` blocks; X is float32 (rows, d)."""
        f = self._h5["features"]
        lab = self._h5["labels"]
        for start in range(0, self.n, chunk_rows):
            stop = min(self.n, start + chunk_rows)
            X = np.asarray(f[start:stop])
            if not np.all(np.isfinite(X)):
                bad = start + int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
                raise FedalignError(f"{self.path}: features contain NaN or Inf (row {bad})")
            if with_labels:
                yield start, X, np.asarray(lab[start:stop], dtype=np.int64)
            else:
                yield start, X

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """All rows at once: ``(X (n, d) float32, y (n,) int64)``; NaN/Inf rejected."""
        X = np.empty((self.n, self.d), dtype=np.float32)
        for start, block in self.iter_chunks():
            X[start : start + len(block)] = block
        return X, self.labels


def open_features(path) -> FeatureFile:
    """Open and validate a features file (use as a context manager)."""
    return FeatureFile(path)


def read_features(path) -> tuple[np.ndarray, np.ndarray, dict]:
    """Load a whole features file: ``(X (n, d) float32, y (n,) int64, info)``.

    ``info`` has ``ids``, ``class_names`` and ``provenance``.
    """
    with FeatureFile(path) as ff:
        X, y = ff.read()
        info = {"ids": ff.ids, "class_names": ff.class_names, "provenance": ff.provenance}
    return X, y, info


class FeatureWriter:
    """Streaming writer of a features file into an (already temporary) path.

    Use through :func:`write_features` or, for streaming producers, inside
    :func:`atomic_output`::

        with atomic_output(out) as tmp, FeatureWriter(tmp, d, class_names, provenance) as w:
            for X, y, ids in blocks:
                w.append(X, y, ids)
    """

    def __init__(self, path, d: int, class_names=(), provenance: dict | None = None,
                 chunk_rows: int = 1024, expected_rows: int | None = None):
        import h5py

        self.path = Path(path)
        self.d = int(d)
        self._h5 = h5py.File(self.path, "w")
        self._h5.attrs["kind"] = FEATURES_KIND
        self._h5.attrs["format_version"] = FEATURES_VERSION
        self._h5.attrs["class_names"] = json.dumps(list(class_names))
        self._h5.attrs["provenance"] = json.dumps(provenance or {}, sort_keys=True)
        rows = max(1, min(chunk_rows, expected_rows or chunk_rows))
        self._f = self._h5.create_dataset(
            "features", shape=(0, self.d), maxshape=(None, self.d), dtype=np.float32,
            chunks=(rows, self.d),
        )
        self._y = self._h5.create_dataset(
            "labels", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(max(rows, 1024),)
        )
        self._ids = self._h5.create_dataset(
            "ids", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype(), chunks=(max(rows, 1024),)
        )
        self.n = 0

    def append(self, X, labels, ids) -> None:
        """Append a block: X (m, d) finite floats, labels (m,) ints, ids (m,) strings."""
        X = np.asarray(X, dtype=np.float32)
        m = X.shape[0]
        if X.ndim != 2 or X.shape[1] != self.d:
            raise FedalignError(f"feature block has shape {X.shape}, expected (m, {self.d})")
        if not np.all(np.isfinite(X)):
            raise FedalignError("refusing to write NaN or Inf features")
        labels = np.asarray(labels, dtype=np.int64)
        ids = [str(i) for i in ids]
        if labels.shape != (m,) or len(ids) != m:
            raise FedalignError("features, labels and ids must have the same number of rows")
        for ds in (self._f, self._y, self._ids):
            ds.resize(self.n + m, axis=0)
        self._f[self.n :] = X
        self._y[self.n :] = labels
        self._ids[self.n :] = ids
        self.n += m

    def set_attr(self, name: str, value) -> None:
        """Store a JSON-serialisable attribute (e.g. ``skipped``)."""
        self._h5.attrs[name] = json.dumps(value, sort_keys=True)

    def close(self):
        self._h5.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_features(path, X, labels, ids, class_names=(), provenance: dict | None = None) -> Path:
    """Write a whole features file atomically. X (n, d), labels (n,), ids (n,)."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise FedalignError(f"features must be 2-D, got shape {X.shape}")
    with atomic_output(path, suffix=".tmp.h5") as tmp:
        with FeatureWriter(tmp, X.shape[1], class_names, provenance, expected_rows=len(X)) as w:
            w.append(X, labels, ids)
    return Path(path)


# --------------------------------------------------------------------------------------------
# Reports (.json)
# --------------------------------------------------------------------------------------------


def write_report(path, report: dict) -> Path:
    """Write an evaluation report (JSON) atomically with kind and format_version."""
    payload = {"kind": REPORT_KIND, "format_version": REPORT_VERSION, **report}
    with atomic_output(path, suffix=".tmp.json") as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return Path(path)


def read_report(path) -> dict:
    """Read and validate a report file."""
    path = _require_file(path)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FedalignError(f"{path}: not a readable JSON report ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise FedalignError(f"{path}: not a fedalign report file")
    if data.get("format_version") != REPORT_VERSION:
        raise FedalignError(f"{path}: report format_version {data.get('format_version')} not supported")
    return data


# --------------------------------------------------------------------------------------------


def _attr_str(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode()
    return str(v)


def _short(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__

"""Features files (``.h5``): the validating reader (:class:`FeatureFile`, :func:`open_features`,
:func:`read_features`) and the writers (:class:`FeatureWriter`, :func:`write_features`).

``features`` (n, d) float32, ``labels`` (n,) int64 (-1 = unlabeled), ``ids`` (n,) str; attrs
``kind``, ``format_version``, ``class_names``, ``provenance``. Files written by other tools are
read in their natural h5py forms (class names as an array of strings or bytes, integer ids,
int32 labels, float64 features) or refused with one line naming the attribute and the expected
form: ``docs/features-format.md``. Labels must lie in [-1, C) when class names are given.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedalign import defaults
from fedalign.errors import FedalignError
from fedalign.files.outputs import FORMAT_NAMES, _require_file, _short, file_format, with_article
from fedalign.files.transactions import atomic_output

#: Most classes a features file may name: a label beyond it is a mistake (an id, a code, a
#: wrapped integer), not a class index (ImageNet-21k has 21,841 classes); its names list
#: alone would take minutes and gigabytes.
MAX_CLASSES = 100_000

FEATURES_KIND = "features"
FEATURES_VERSION = 1

DEFAULT_CHUNK_ROWS = defaults.CHUNK_ROWS


def _not_hdf5(path, e: OSError) -> str:
    """Why h5py could not open ``path``: the format it holds where its first bytes say (an
    .npz of some kind, a .npy, text, nothing; h5py only says "file signature not found")."""
    found = file_format(path)
    if found not in ("npz", "npy", "text", "empty"):
        return f"not a readable HDF5 file ({_short(e)})"
    from fedalign.files.npz import npz_kind

    kind = npz_kind(path) if found == "npz" else None
    what = f"an .npz file ({with_article(kind)} file)" if kind else FORMAT_NAMES[found]
    hint = "" if found == "empty" or kind else ": convert it with fedalign import"
    return f"is {what}, expected an HDF5 features file (.h5){hint}"


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
            raise FedalignError(f"{self.path}: {_not_hdf5(self.path, e)}") from None
        try:
            self._validate()
        except BaseException:
            self._h5.close()
            raise

    def _validate(self):
        import h5py

        h5, p = self._h5, self.path
        kind = _attr_str(h5.attrs.get("kind"))
        if kind is None:
            raise FedalignError(
                f"{p}: not a fedalign features file: attribute 'kind' is missing (expected "
                f"attrs kind='features', format_version={FEATURES_VERSION}; see "
                "docs/features-format.md)")
        if kind != FEATURES_KIND:
            raise FedalignError(f"{p}: is {with_article(kind)} file, expected a features file")
        try:
            version = int(np.asarray(h5.attrs.get("format_version", -1)).item())
        except (TypeError, ValueError):
            raise FedalignError(f"{p}: attribute 'format_version' must be the integer "
                                f"{FEATURES_VERSION}, got {h5.attrs.get('format_version')!r}") from None
        if version != FEATURES_VERSION:
            raise FedalignError(
                f"{p}: features format_version {version} is not supported "
                f"(expected {FEATURES_VERSION})"
            )
        forms = {"features": "(n, d) floats", "labels": "(n,) integers, -1 = unlabeled",
                 "ids": "(n,) strings or integers"}
        for name, form in forms.items():
            if name not in h5:
                raise FedalignError(f"{p}: missing dataset '{name}' ({form})")
            if not isinstance(h5[name], h5py.Dataset):
                raise FedalignError(f"{p}: '{name}' must be a dataset of {form}, not a group")
        f = h5["features"]
        if f.ndim != 2:
            raise FedalignError(f"{p}: 'features' must be 2-D (n, d), got shape {f.shape}")
        if f.dtype.kind not in "fiu":
            raise FedalignError(f"{p}: 'features' must hold numbers (float32 or float64), got {f.dtype}")
        self.n, self.d = (int(s) for s in f.shape)
        if self.d == 0:
            raise FedalignError(f"{p}: 'features' has no columns (shape {f.shape}): d must be ≥ 1")
        lab, ids = h5["labels"], h5["ids"]
        if lab.shape != (self.n,) or ids.shape != (self.n,):
            raise FedalignError(
                f"{p}: shape mismatch: features {f.shape}, labels {lab.shape}, "
                f"ids {ids.shape} (expected labels and ids of shape ({self.n},))"
            )
        if lab.dtype.kind not in "iu":
            raise FedalignError(f"{p}: 'labels' must be integers (-1 = unlabeled), got {lab.dtype}")
        if ids.dtype.kind not in "iuSO" and not h5py.check_string_dtype(ids.dtype):
            raise FedalignError(f"{p}: 'ids' must be strings or integers, got {ids.dtype}")
        self.class_names = _class_names_attr(h5.attrs.get("class_names"), p)
        self.provenance = _json_attr(h5.attrs.get("provenance"), "provenance", dict, p)
        y = self._label_cache()
        if y.size and y.min() < -1:
            raise FedalignError(f"{p}: label {int(y.min())} is invalid (labels are ≥ 0, -1 = unlabeled)")
        C = len(self.class_names)
        if C and y.size and y.max() >= C:
            raise FedalignError(f"{p}: label {int(y.max())} is out of range for the {C} class names "
                                f"(labels must be in [0, {C}) or -1)")

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._h5.close()

    # -- data ----------------------------------------------------------------------------------
    def _read(self, name, sel=slice(None)):
        try:
            return self._h5[name][sel]
        except (OSError, RuntimeError, KeyError) as e:
            raise FedalignError(f"{self.path}: cannot read '{name}' ({_short(e)})") from None

    @property
    def labels(self) -> np.ndarray:
        """(n,) int64 labels, -1 for unlabeled rows."""
        return self._label_cache().copy()

    def _label_cache(self) -> np.ndarray:
        if getattr(self, "_labels", None) is None:
            self._labels = np.asarray(self._read("labels"), dtype=np.int64)
        return self._labels

    @property
    def ids(self) -> np.ndarray:
        """(n,) str row identifiers (relative paths for extracted images)."""
        ds = self._h5["ids"]
        if ds.dtype.kind in "iu":
            return np.asarray(self._read("ids")).astype(str)
        try:
            return np.asarray(ds.asstr()[...], dtype=str)
        except (OSError, RuntimeError, TypeError, ValueError, UnicodeDecodeError) as e:
            raise FedalignError(f"{self.path}: cannot read 'ids' as strings ({_short(e)})") from None

    @property
    def skipped(self) -> list:
        """Inputs skipped at extraction (``--skip-bad``)."""
        return _json_attr(self._h5.attrs.get("skipped"), "skipped", list, self.path)

    def iter_chunks(self, chunk_rows: int = DEFAULT_CHUNK_ROWS, with_labels: bool = False):
        """Yield ``(start, X)`` or ``(start, X, y)`` blocks; X is float32 (rows, d).

        ``chunk_rows`` must be ≥ 1. Every block is checked for NaN/Inf (and for values a
        float64 file holds beyond the float32 range).
        """
        from fedalign import interrupt

        if isinstance(chunk_rows, bool) or int(chunk_rows) < 1:
            raise FedalignError(f"chunk_rows must be ≥ 1, got {chunk_rows}")
        chunk_rows = int(chunk_rows)
        lab = self._label_cache()
        for start in range(0, self.n, chunk_rows):
            interrupt.check()
            stop = min(self.n, start + chunk_rows)
            raw = np.asarray(self._read("features", slice(start, stop)))
            if not np.all(np.isfinite(raw)):
                bad = start + int(np.flatnonzero(~np.isfinite(raw).all(axis=1))[0])
                raise FedalignError(f"{self.path}: features contain NaN or Inf (row {bad})")
            with np.errstate(over="ignore"):
                X = raw.astype(np.float32, copy=False)
            if X is not raw and not np.all(np.isfinite(X)):
                bad = start + int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
                raise FedalignError(f"{self.path}: features beyond the float32 range (row {bad})")
            if with_labels:
                yield start, X, lab[start:stop]
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
        from fedalign import interrupt

        interrupt.check()
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
# Attributes, in the forms fedalign writes and those other tools do
# --------------------------------------------------------------------------------------------


def _attr_str(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, np.ndarray) and v.size == 1:
        v = v.reshape(()).item()
    if isinstance(v, (bytes, np.bytes_)):
        return bytes(v).decode("utf-8", errors="replace")
    return str(v)


def _class_names_attr(v, path) -> list:
    """``class_names``: a JSON list of strings (what fedalign writes), or an array of strings
    or bytes (what ``h5.attrs["class_names"] = ["cat", "dog"]`` stores)."""
    if v is None:
        return []
    if isinstance(v, np.ndarray) and v.ndim == 1:
        if v.size == 0:
            return []
        if v.dtype.kind not in "USO":
            raise FedalignError(f"{path}: attribute 'class_names' must hold strings, got {v.dtype}")
        names = [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in v]
    else:
        text = _attr_str(v)
        try:
            names = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            names = None
        if not isinstance(names, list) or not all(isinstance(x, (str, int)) for x in names):
            raise FedalignError(
                f"{path}: attribute 'class_names' must be an array of strings or a JSON list of "
                f"strings, got {text[:60]!r}")
        names = [str(x) for x in names]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise FedalignError(f"{path}: attribute 'class_names' lists {dup[0]!r} more than once")
    return names


def _json_attr(v, name: str, typ, path):
    """A JSON attribute (``provenance``: an object; ``skipped``: a list); absent → empty."""
    if v is None:
        return typ()
    text = _attr_str(v)
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        value = None
    if not isinstance(value, typ):
        raise FedalignError(f"{path}: attribute '{name}' must be a JSON "
                            f"{'object' if typ is dict else 'list'}, got {text[:60]!r}")
    return value

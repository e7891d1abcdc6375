"""Your own features in: ``.npz``, ``.npy`` pairs, MATLAB ``.mat``, CSV and plain HDF5 → a
fedalign features file (``fedalign import SRC -o features.h5``).

Features computed elsewhere arrive in a handful of shapes:

========  ====================================================================================
format    what is read
========  ====================================================================================
``npz``   arrays ``features`` and ``labels`` (what the SLOT-Align reference code writes; also
          ``fts``/``X`` and ``y``), optional ``ids`` and ``class_names``; ``allow_pickle=False``
``npy``   one (n, d) array; labels from ``labels_file`` or the sibling file whose name has
          ``labels`` for ``features`` (``amazon_features.npy`` → ``amazon_labels.npy``) or ``y``
          for ``X``
``mat``   MATLAB files: ``fts`` and ``labels`` (the classic DA benchmarks: Office-Caltech SURF,
          Amazon review), read with :func:`scipy.io.loadmat`; v7.3 files (HDF5 inside) with
          h5py, transposed back to MATLAB's (n, d); sparse matrices are densified
``csv``   one row per sample (``.csv``, ``.tsv``, ``.txt``); a header row names the columns; the
          label column is ``label``/``labels``/``y``/``class`` (or ``labels_key``, a name or
          index, e.g. ``-1`` for the last), ids ``id``/``ids``; every other column is a feature
``h5``    a plain HDF5 file: datasets ``features`` and ``labels`` (or ``features_key``, a
          group/path), optional ``ids``; class names from a ``class_names`` attribute or dataset
========  ====================================================================================

The format comes from the suffix, or ``fmt``. Labels become class indices:

- integer labels (also integral floats) are indices counted from ``label_base`` (default 0;
  1 for MATLAB's 1…C labels such as Office-Caltech SURF); −1 after the shift is unlabeled;
- ``label_values="sorted"``: the distinct values, sorted, become 0…K−1 (±1 labels, sparse
  codes); string labels always are names: the class-name list's order, or sorted;
- class names from ``class_names`` (a list, a file with one name per line, or ``a,b,c``), the
  data (a ``class_names``/``classes`` array or attribute), string labels, or the label values.

Everything is validated before anything is written (one error line naming the file, the key
and the fix): 2-D numeric features with n ≥ 1 and d ≥ 1, no NaN/Inf (nor values beyond
float32), one label per row, labels in range, distinct class names. The output is written by
:func:`fedalign.files.write_features` (atomic, kind ``features``) with the source, its SHA-256,
the keys used and the label mapping in its provenance.
"""

from __future__ import annotations

import csv
import io
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError, spell
from fedalign.files import MAX_CLASSES

FORMATS = ("npz", "npy", "mat", "csv", "h5")
SUFFIXES = {".npz": "npz", ".npy": "npy", ".mat": "mat", ".csv": "csv", ".tsv": "csv",
            ".txt": "csv", ".h5": "h5", ".hdf5": "h5", ".hdf": "h5", ".he5": "h5"}
#: Keys tried, in order, when none is given.
FEATURE_KEYS = ("features", "fts", "feats", "X", "x", "data")
LABEL_KEYS = ("labels", "label", "y", "Y", "targets", "target", "class")
ID_KEYS = ("ids", "id")
CLASS_NAME_KEYS = ("class_names", "classes", "categories")
LABEL_VALUES = ("index", "sorted")


@dataclass
class Source:
    """What a reader found: features, raw labels (None: none found), ids, class names."""

    X: np.ndarray
    labels: np.ndarray | None = None
    ids: list | None = None
    class_names: list | None = None
    keys: dict = field(default_factory=dict)
    detail: str = ""


@dataclass
class ImportResult:
    """Outcome of :func:`import_features`."""

    output: Path
    n: int
    d: int
    class_names: list
    n_labeled: int
    format: str
    keys: dict
    notes: list


# --------------------------------------------------------------------------------------------
# formats and keys
# --------------------------------------------------------------------------------------------


def detect_format(path, fmt: str | None = None) -> str:
    """``fmt`` when given (checked), else the format of ``path``'s suffix."""
    if fmt is not None:
        f = str(fmt).lower().lstrip(".")
        f = {"hdf5": "h5", "hdf": "h5", "tsv": "csv", "txt": "csv", "matlab": "mat"}.get(f, f)
        if f not in FORMATS:
            raise FedalignError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}",
                                param="fmt")
        return f
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise FedalignError(f"{path}: cannot tell the format from the suffix {suffix or '(none)'!r}: "
                            f"give {spell('fmt')} ({', '.join(FORMATS)})")
    return SUFFIXES[suffix]


def _pick(available, explicit, candidates, what, path, param, required=True):
    """The key to read: ``explicit`` (must exist) or the first candidate present; ``param``
    names the parameter that gives it (in the messages)."""
    available = list(available)
    if explicit is not None:
        if explicit not in available:
            raise FedalignError(f"{path}: no {what} {explicit!r} (has: {_listing(available)})")
        return explicit
    for c in candidates:
        if c in available:
            return c
    if required:
        raise FedalignError(f"{path}: no {what} found (looked for {', '.join(candidates)}; has: "
                            f"{_listing(available)}): give {spell(param)}")
    return None


def _listing(keys) -> str:
    keys = [str(k) for k in keys]
    return ", ".join(keys[:12]) + (f", … ({len(keys)} in all)" if len(keys) > 12 else "") or "nothing"


def _strings(a, where) -> list:
    """A 1-D list of strings from an array of str/bytes/objects (MATLAB cell arrays, whose
    elements are 1-element arrays, included)."""
    out = []
    for v in np.asarray(a, dtype=object).ravel():
        while isinstance(v, np.ndarray) and v.size == 1:
            v = v.reshape(()).item()
        if isinstance(v, (bytes, np.bytes_)):
            v = bytes(v).decode("utf-8", errors="replace")
        if not isinstance(v, (str, int, np.integer)):
            raise FedalignError(f"{where}: class names must be strings, got {type(v).__name__}")
        out.append(str(v).strip())
    return out


# --------------------------------------------------------------------------------------------
# readers
# --------------------------------------------------------------------------------------------


def _read_npz(path, fk, lk, ik, nk) -> Source:
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise FedalignError(f"{path}: not a readable .npz file ({_first_line(e)})") from None
    if not hasattr(z, "files"):
        raise FedalignError(f"{path}: is a single .npy array, not an .npz archive: give "
                            f"{spell('fmt', repr('npy'))}")
    with z:
        names = z.files

        def get(key):
            try:
                return z[key]
            except ValueError as e:  # object arrays need pickle
                raise FedalignError(f"{path}: array {key!r} holds Python objects, which are not "
                                    f"loaded ({_first_line(e)}): save it as a plain array") from None

        f = _pick(names, fk, FEATURE_KEYS, "features array", path, "features_key")
        lab = _pick(names, lk, LABEL_KEYS, "labels array", path, "labels_key", required=False)
        i = _pick(names, ik, ID_KEYS, "ids array", path, "ids_key", required=False)
        n = _pick(names, nk, CLASS_NAME_KEYS, "class-names array", path, "class_names_key",
                  required=False)
        return Source(get(f), None if lab is None else get(lab),
                      None if i is None else list(get(i).ravel()),
                      None if n is None else _strings(get(n), f"{path}: {n!r}"),
                      dict(features=f, labels=lab, ids=i, class_names=n))


def _load_npy(path, what="features") -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        raise FedalignError(f"{path}: the {what} array holds Python objects, which are not loaded "
                            f"({_first_line(e)})") from None
    except (OSError, EOFError) as e:
        raise FedalignError(f"{path}: not a readable .npy file ({_first_line(e)})") from None


def sibling_labels(path) -> Path | None:
    """The labels file next to a features ``.npy``: ``*features*`` → ``*labels*``, ``*fts*``
    → ``*labels*``, ``X.npy`` → ``y.npy``."""
    path = Path(path)
    stem = path.stem
    names = []
    for old in ("features", "Features", "fts", "feats"):
        if old in stem:
            names.append(stem.replace(old, "labels"))
    if stem in ("X", "x"):
        names.append("y")
    for name in names:
        cand = path.with_name(name + path.suffix)
        if cand.is_file() and cand != path:
            return cand
    return None


def _read_npy(path, fk, lk, ik, nk) -> Source:
    for name, v in (("features_key", fk), ("labels_key", lk), ("ids_key", ik)):
        if v is not None:
            raise FedalignError(f"{name} has no meaning for a .npy file (one array): give the "
                                f"labels file as {spell('labels_file')}", param=name)
    X = _load_npy(path)
    lab = sibling_labels(path)
    return Source(X, None if lab is None else _load_npy(lab, "labels"), None, None,
                  dict(features=str(path.name), labels=None if lab is None else lab.name),
                  detail="" if lab is None else f"labels from {lab.name}")


def _read_mat(path, fk, lk, ik, nk) -> Source:
    import h5py
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    if h5py.is_hdf5(str(path)):  # MATLAB v7.3: HDF5 inside
        return _read_mat73(path, fk, lk, ik, nk)
    try:
        m = loadmat(str(path))
    except NotImplementedError:  # a v7.3 header h5py did not recognise
        return _read_mat73(path, fk, lk, ik, nk)
    except (ValueError, TypeError, OSError, MatReadError) as e:
        raise FedalignError(f"{path}: not a readable MATLAB file ({_first_line(e)})") from None
    names = [k for k in m if not k.startswith("__")]
    f = _pick(names, fk, FEATURE_KEYS, "features variable", path, "features_key")
    lab = _pick(names, lk, LABEL_KEYS, "labels variable", path, "labels_key", required=False)
    i = _pick(names, ik, ID_KEYS, "ids variable", path, "ids_key", required=False)
    n = _pick(names, nk, CLASS_NAME_KEYS, "class-names variable", path, "class_names_key",
              required=False)

    def dense(a):
        return a.toarray() if hasattr(a, "toarray") else np.asarray(a)

    ids = None
    if i is not None:
        ids = _strings(m[i], f"{path}: {i!r}") if np.asarray(m[i]).dtype == object else list(dense(m[i]).ravel())
    labels = None
    if lab is not None:
        labels = dense(m[lab])
        if labels.dtype == object:
            labels = np.array(_strings(labels, f"{path}: {lab!r}"))
    return Source(dense(m[f]), labels, ids,
                  None if n is None else _strings(m[n], f"{path}: {n!r}"),
                  dict(features=f, labels=lab, ids=i, class_names=n), detail="MATLAB v5")


def _read_mat73(path, fk, lk, ik, nk) -> Source:
    import h5py

    with h5py.File(path, "r") as h:
        names = [k for k in h.keys() if not k.startswith("#")]
        f = _pick(names, fk, FEATURE_KEYS, "features variable", path, "features_key")
        lab = _pick(names, lk, LABEL_KEYS, "labels variable", path, "labels_key", required=False)
        i = _pick(names, ik, ID_KEYS, "ids variable", path, "ids_key", required=False)
        for key in (f, lab, i):
            if key is not None and not isinstance(h[key], h5py.Dataset):
                raise FedalignError(f"{path}: MATLAB variable {key!r} is a struct or cell array, "
                                    "expected a numeric matrix")
        # MATLAB stores column-major: an (n, d) matrix reads as (d, n)
        X = _dataset(h, f, path).T
        labels = None if lab is None else _dataset(h, lab, path).T
        ids = None if i is None else list(_dataset(h, i, path).T.ravel())
    return Source(X, labels, ids, None, dict(features=f, labels=lab, ids=i),
                  detail="MATLAB v7.3")


def _dataset(h, name: str, path) -> np.ndarray:
    """An HDF5 dataset's values; an empty one (no shape: ``h5py.Empty``) is refused."""
    ds = h[name]
    if ds.shape is None:
        raise FedalignError(f"{path}: dataset {name!r} is empty (it has no shape)")
    return np.asarray(ds)


def _read_h5(path, fk, lk, ik, nk) -> Source:
    import h5py

    try:
        h = h5py.File(path, "r")
    except OSError as e:
        raise FedalignError(f"{path}: not a readable HDF5 file ({_first_line(e)})") from None
    with h:
        names = []
        h.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        f = _pick(names, fk, FEATURE_KEYS, "features dataset", path, "features_key")
        lab = _pick(names, lk, LABEL_KEYS, "labels dataset", path, "labels_key", required=False)
        i = _pick(names, ik, ID_KEYS, "ids dataset", path, "ids_key", required=False)
        n = _pick(names, nk, CLASS_NAME_KEYS, "class-names dataset", path, "class_names_key",
                  required=False)
        X = _dataset(h, f, path)
        labels = None if lab is None else _dataset(h, lab, path)
        if labels is not None and labels.dtype.kind in "SO":
            labels = np.array(_strings(labels, f"{path}: {lab!r}"))
        ids = None if i is None else list(_dataset(h, i, path).ravel())
        class_names = None
        if n is not None:
            class_names = _strings(_dataset(h, n, path), f"{path}: {n!r}")
        else:
            for holder in (h[f], h):
                v = holder.attrs.get("class_names")
                if v is not None:
                    class_names = _class_names_value(v, f"{path}: attribute 'class_names'")
                    n = "attribute class_names"
                    break
    return Source(X, labels, ids, class_names, dict(features=f, labels=lab, ids=i, class_names=n))


def _class_names_value(v, where) -> list:
    import json

    if isinstance(v, np.ndarray) and v.ndim >= 1:
        return _strings(v, where)
    text = v.decode("utf-8", errors="replace") if isinstance(v, (bytes, np.bytes_)) else str(v)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, list):
        return [str(x) for x in value]
    return [s.strip() for s in text.split(",") if s.strip()]


def _sniff_delimiter(path, sample: str, delimiter) -> str:
    if delimiter:
        d = {"tab": "\t", "\\t": "\t", "space": " "}.get(delimiter, delimiter)
        if len(d) != 1:
            raise FedalignError(f"delimiter must be one character (or tab, space), got "
                                f"{delimiter!r}")
        return d
    if Path(path).suffix.lower() == ".tsv":
        return "\t"
    first = sample.splitlines()[0] if sample else ""
    for d in (",", "\t", ";"):
        if d in first:
            return d
    return " " if " " in first.strip() else ","


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _read_csv(path, fk, lk, ik, nk, delimiter=None) -> Source:
    if fk is not None:
        raise FedalignError("features_key has no meaning for CSV: every column that is not the "
                            "label or id column is a feature", param="features_key")
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise FedalignError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    delim = _sniff_delimiter(path, text[:4096], delimiter)
    reader = csv.reader(io.StringIO(text), delimiter=delim, skipinitialspace=True)
    rows = [r for r in reader if r and any(c.strip() for c in r)]
    if delim == " ":
        rows = [[c for c in r if c != ""] for r in rows]
    if not rows:
        raise FedalignError(f"{path}: no rows")
    header = None
    if not all(_is_number(c) for c in rows[0]):
        header, rows = [c.strip() for c in rows[0]], rows[1:]
    width = len(header) if header else len(rows[0]) if rows else 0
    for k, r in enumerate(rows):
        if len(r) != width:
            raise FedalignError(f"{path}: row {k + 1 + bool(header)} has {len(r)} columns, "
                                f"expected {width}")
    columns = header or [str(j) for j in range(width)]

    def column(key, candidates, what, param):
        if key is not None:
            if key in columns:
                return columns.index(key)
            try:
                j = int(key)
            except ValueError:
                raise FedalignError(f"{path}: no {what} column {key!r} (columns: "
                                    f"{_listing(columns)})") from None
            if not -width <= j < width:
                raise FedalignError(f"{path}: {param} {j} is out of range for {width} columns")
            return j % width
        if header:
            lower = [c.lower() for c in header]
            for c in candidates:
                if c.lower() in lower:
                    return lower.index(c.lower())
        return None

    lj = column(lk, LABEL_KEYS, "labels", "labels_key")
    ij = column(ik, ID_KEYS, "ids", "ids_key")
    if lj is not None and lj == ij:
        raise FedalignError(f"{path}: the label and id columns are the same column")
    fcols = [j for j in range(width) if j not in (lj, ij)]
    if not fcols:
        raise FedalignError(f"{path}: no feature columns left (label and id columns only)")
    X = np.empty((len(rows), len(fcols)), dtype=np.float64)
    for k, r in enumerate(rows):
        try:
            X[k] = [float(r[j]) for j in fcols]
        except ValueError:
            bad = next(j for j in fcols if not _is_number(r[j]))
            raise FedalignError(f"{path}: row {k + 1 + bool(header)}, column {columns[bad]!r}: "
                                f"{r[bad]!r} is not a number (give the label column with "
                                f"{spell('labels_key')}, a name or index)") from None
    labels = None
    if lj is not None:
        raw = [r[lj].strip() for r in rows]
        labels = _numbers_or_strings(raw)
    ids = None if ij is None else [r[ij].strip() for r in rows]
    return Source(X, labels, ids, None,
                  dict(labels=None if lj is None else columns[lj],
                       ids=None if ij is None else columns[ij],
                       features=f"{len(fcols)} columns"),
                  detail=f"delimiter {delim!r}" + (", header row" if header else ", no header"))


def _numbers_or_strings(raw: list) -> np.ndarray:
    if raw and all(_is_number(s) for s in raw):
        v = np.array([float(s) for s in raw])
        return v.astype(np.int64) if np.all(np.isfinite(v)) and np.all(v == np.round(v)) else v
    return np.array(raw, dtype=str)


def read_labels_file(path) -> np.ndarray:
    """Labels from their own file: ``.npy``, or text with one label per line."""
    path = Path(path)
    if not path.is_file():
        raise FedalignError(f"{path}: no such labels file" if not path.exists() else
                            f"{path}: is a folder, not a labels file" if path.is_dir() else
                            f"{path}: not a file (give a labels file)")
    if path.suffix.lower() == ".npy":
        return _load_npy(path, "labels")
    lines = [s.strip() for s in path.read_text(encoding="utf-8-sig").splitlines()]
    return _numbers_or_strings([s for s in lines if s])


def read_class_names(value) -> list:
    """Class names from a file (one per line) or ``a,b,c``."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        names = [str(v).strip() for v in value]
    else:
        p = Path(str(value))
        if p.is_file():
            try:
                text = p.read_text(encoding="utf-8-sig")
            except (OSError, UnicodeDecodeError) as e:
                raise FedalignError(f"class_names: cannot read {p} ({_first_line(e)})",
                                    param="class_names") from None
            names = [s.strip() for s in text.splitlines() if s.strip()]
        elif "," in str(value) or not p.suffix:
            names = [s.strip() for s in str(value).split(",") if s.strip()]
        else:
            raise FedalignError(f"class_names: no such file {value}", param="class_names")
    if not names:
        raise FedalignError("class_names: no class names given", param="class_names")
    return names


_READERS = {"npz": _read_npz, "npy": _read_npy, "mat": _read_mat, "h5": _read_h5}


def read_source(path, fmt: str | None = None, features_key=None, labels_key=None, ids_key=None,
                class_names_key=None, delimiter=None) -> Source:
    """Read features, raw labels, ids and class names from ``path`` (see the module doc)."""
    path = Path(path)
    if not path.is_file():
        raise FedalignError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    fmt = detect_format(path, fmt)
    _check_signature(path, fmt)
    try:
        if fmt == "csv":
            return _read_csv(path, features_key, labels_key, ids_key, class_names_key, delimiter)
        return _READERS[fmt](path, features_key, labels_key, ids_key, class_names_key)
    except _UNREADABLE as e:  # damaged files: what the format libraries raise on them
        raise FedalignError(f"{path}: not a readable {fmt} file ({_first_line(e)})") from None


#: The file formats (:func:`fedalign.files.outputs.file_format`) each binary format's reader
#: takes: a MATLAB v7.3 file is HDF5 after its header, a plain HDF5 file can hold the variables;
#: an unknown start (None) is the reader's to judge (a MATLAB v4 file has no text header, an HDF5
#: file may begin with a user block).
_SIGNATURES = {"npz": ("npz",), "npy": ("npy",), "h5": ("hdf5", "mat", None),
               "mat": ("mat", "hdf5", None)}


def _check_signature(path, fmt: str) -> None:
    """A binary format's file must start as one does: a CSV read as an .npz was refused with
    numpy's words about pickled data, not as the text file it is."""
    from fedalign.files.outputs import FORMAT_NAMES, file_format

    if fmt not in _SIGNATURES:
        return
    found = file_format(path)
    if found in _SIGNATURES[fmt]:
        return
    names = {"npz": ".npz", "npy": ".npy", "h5": "HDF5", "mat": "MATLAB"}
    guess = {"npz": "npz", "npy": "npy", "hdf5": "h5", "mat": "mat"}.get(found)
    hint = (f": give {spell('fmt', guess)}" if guess else
            f" (a CSV? give {spell('fmt', 'csv')})" if found == "text" else "")
    raise FedalignError(f"{path}: not a readable {names[fmt]} file: it is "
                        f"{FORMAT_NAMES[found]}, not {'an' if fmt in ('npz', 'h5') else 'a'} "
                        f"{names[fmt]} file{hint}")


#: What the readers' libraries raise on a damaged or unusual file: a truncated or corrupt
#: zip/deflate stream (npz, compressed .mat), text that is not UTF-8, an over-long CSV field,
#: integers beyond int64.
_UNREADABLE = (zipfile.BadZipFile, zlib.error, UnicodeDecodeError, csv.Error, OverflowError,
               EOFError)


# --------------------------------------------------------------------------------------------
# validation and labels
# --------------------------------------------------------------------------------------------


def check_features(X, where: str) -> np.ndarray:
    """(n, d) finite numbers that fit float32, n ≥ 1, d ≥ 1 → float32."""
    X = np.asarray(X)
    if X.dtype.kind == "b":
        X = X.astype(np.float32)
    if X.dtype.kind not in "fiu":
        raise FedalignError(f"{where}: features must be numbers, got {X.dtype}")
    if X.ndim == 1:
        raise FedalignError(f"{where}: features must be 2-D (n, d), got a 1-D array of {len(X)} "
                            "values (one column? reshape it to (n, 1))")
    if X.ndim != 2:
        raise FedalignError(f"{where}: features must be 2-D (n, d), got shape {X.shape} "
                            "(flatten each sample first)")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise FedalignError(f"{where}: features have shape {X.shape}: need n ≥ 1 rows and d ≥ 1 columns")
    bad = ~np.isfinite(X) if X.dtype.kind == "f" else None
    if bad is not None and bad.any():
        r, c = np.argwhere(bad)[0]
        raise FedalignError(f"{where}: features hold {int(bad.sum())} NaN/Inf values (first at row "
                            f"{r}, column {c}): remove or impute them first")
    with np.errstate(over="ignore"):
        X32 = X.astype(np.float32)
    if not np.all(np.isfinite(X32)):
        raise FedalignError(f"{where}: features hold values beyond float32's range "
                            f"(|x| > {np.finfo(np.float32).max:.3g}): rescale them first")
    return X32


def _label_vector(labels, n, where) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim == 2 and 1 in y.shape:
        y = y.ravel()
    if y.ndim != 1:
        raise FedalignError(f"{where}: labels must be one value per row, got shape {y.shape}")
    if len(y) != n:
        raise FedalignError(f"{where}: {len(y)} labels for {n} feature rows")
    return y


def encode_labels(raw, n: int, class_names=None, label_base: int = 0,
                  label_values: str = "index", where: str = "labels") -> tuple:
    """Class indices (n,) int64 (−1 unlabeled), class names and notes from raw labels.

    See the module doc for the rules. Returns ``(y, class_names, mapping, notes)``; ``mapping``
    describes the rule for the provenance.
    """
    if label_values not in LABEL_VALUES:
        raise FedalignError(f"label_values must be index or sorted, got {label_values!r}",
                            param="label_values")
    y = _label_vector(raw, n, where)
    names = list(class_names) if class_names else None
    if names is not None:
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise FedalignError(f"class names list {dup[0]!r} more than once")
    notes = []
    if y.dtype.kind in "USO":  # names
        strs = np.array([s.decode() if isinstance(s, bytes) else str(s) for s in y], dtype=object)
        present = sorted({s for s in strs if s != ""})
        if names is None:
            names = present
        index = {c: i for i, c in enumerate(names)}
        unknown = [s for s in present if s not in index]
        if unknown:
            raise FedalignError(f"{where}: label {unknown[0]!r} is not one of the {len(names)} class "
                                f"names ({_listing(names)})")
        out = np.array([index[s] if s != "" else -1 for s in strs], dtype=np.int64)
        return out, names, dict(rule="names"), notes
    if y.dtype.kind == "b":
        y = y.astype(np.int64)
    if y.dtype.kind not in "fiu":
        raise FedalignError(f"{where}: labels must be integers or strings, got {y.dtype}")
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)):
            raise FedalignError(f"{where}: labels hold NaN/Inf (row {int(np.argmax(~np.isfinite(y)))})")
        if label_values == "index" and not np.all(y == np.round(y)):
            k = int(np.argmax(y != np.round(y)))
            raise FedalignError(f"{where}: label {y[k]!r} (row {k}) is not an integer: use "
                                f"{spell('label_values', 'sorted')} to number the distinct values")
    if label_values == "sorted":
        uniq = np.unique(y)
        if names is not None and len(names) != len(uniq):
            raise FedalignError(f"{where}: {len(uniq)} distinct label values but {len(names)} class "
                                "names (sorted values are matched to the names in order)")
        if names is None:
            names = [_value_name(v) for v in uniq]
        out = np.searchsorted(uniq, y).astype(np.int64)
        return out, names, dict(rule="sorted", values=[_value_name(v) for v in uniq]), notes
    base = int(label_base)
    if abs(base) > MAX_CLASSES:
        raise FedalignError(f"label_base must be between −{MAX_CLASSES:,} and {MAX_CLASSES:,}, "
                            f"got {base}", param="label_base")
    # the range is checked before the int64 cast (2⁶⁴−1 wrapped to −1, 1e300 to garbage)
    top = int(np.max(y)) if y.dtype.kind in "iu" else float(np.max(y))
    k = int(np.argmax(y))
    if names is not None and top - base + 1 > len(names):
        C = len(names)
        raise FedalignError(f"{where}: label {_value_name(y[k])} is out of range for the {C} "
                            f"class names (labels {base}…{C - 1 + base})")
    if top - base + 1 > MAX_CLASSES:
        raise FedalignError(f"{where}: label {_value_name(y[k])} (row {k}) is out of range: "
                            f"labels are class indices from {spell('label_base', base)}, "
                            f"{MAX_CLASSES:,} classes at most; use "
                            f"{spell('label_values', 'sorted')} to number arbitrary values")
    out = np.round(y).astype(np.int64) - base
    if out.min() < -1:
        k = int(np.argmin(out))
        raise FedalignError(f"{where}: label {_value_name(y[k])} (row {k}) is below "
                            f"{base - 1}: labels are class indices from "
                            f"{spell('label_base', base)} (−1 after the shift = unlabeled); use "
                            f"{spell('label_values', 'sorted')} to number arbitrary values")
    C = len(names) if names is not None else int(out.max()) + 1   # (the range: checked above)
    labeled = out[out >= 0]
    if labeled.size and not (labeled == 0).any() and base == 0 and labeled.min() == 1:
        notes.append(f"no row has label 0 (labels {int(labeled.min())}…{int(labeled.max())}): if "
                     f"they count from 1 (MATLAB), import again with {spell('label_base', 1)}; "
                     f"if they are codes such as ±1, with {spell('label_values', 'sorted')}")
    if names is None:
        names = [str(c) for c in range(C)] if C > 0 else []
    return out, names, dict(rule="index", base=base), notes


def _value_name(v) -> str:
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, float) and v == round(v) and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def import_features(source, output, fmt: str | None = None, *, features_key=None,
                    labels_key=None, ids_key=None, class_names_key=None, labels_file=None,
                    class_names=None, label_base: int = 0, label_values: str = "index",
                    unlabeled: bool = False, delimiter=None) -> ImportResult:
    """Read ``source`` (see the module doc), validate it and write the features file ``output``.

    Parameters
    ----------
    source : path of a ``.npz``, ``.npy``, ``.mat``, CSV or HDF5 file
    output : features file to write (``.h5``)
    fmt : npz, npy, mat, csv or h5 (default: from the suffix)
    features_key, labels_key, ids_key, class_names_key : arrays / variables / datasets / CSV
        columns to read (default: the first of :data:`FEATURE_KEYS`, :data:`LABEL_KEYS`, … found)
    labels_file : labels from their own file (``.npy`` or one per line) instead
    class_names : list, a file with one name per line, or ``"a,b,c"``
    label_base : integer labels count classes from this value (1 for MATLAB's 1…C)
    label_values : ``index`` (labels are class indices) or ``sorted`` (distinct values → 0…K−1)
    unlabeled : ignore any labels: every row −1

    Returns
    -------
    ImportResult
    """
    from fedalign.files import check_outputs, sha256_file, write_features

    source = Path(source)
    check_outputs(input_files(source, fmt, labels_file, class_names), [output])
    src = read_source(source, fmt, features_key, labels_key, ids_key, class_names_key, delimiter)
    fmt = detect_format(source, fmt)
    X = check_features(src.X, f"{source}: {src.keys.get('features') or 'features'}")
    n, d = X.shape
    names = read_class_names(class_names) if class_names is not None else src.class_names
    keys = {k: v for k, v in src.keys.items() if v is not None}
    raw = src.labels
    if labels_file is not None:
        raw = read_labels_file(labels_file)
        keys["labels"] = str(labels_file)
    notes = []
    if unlabeled:
        y = np.full(n, -1, dtype=np.int64)
        names = names or []
        mapping = dict(rule="unlabeled")
    elif raw is None:
        hint = (f"give {spell('labels_file')} (e.g. the labels .npy)" if fmt == "npy" else
                f"give {spell('labels_key')} (or {spell('labels_file')})")
        raise FedalignError(f"{source}: no labels found: {hint}, or {spell('unlabeled', True)} "
                            "for unlabeled features")
    else:
        where = f"{source}: {keys.get('labels', 'labels')}"
        y, names, mapping, notes = encode_labels(raw, n, names, label_base, label_values, where)
    ids = src.ids
    if ids is not None:
        if len(ids) != n:
            raise FedalignError(f"{source}: {len(ids)} ids for {n} feature rows")
        ids = [i.decode("utf-8", errors="replace") if isinstance(i, (bytes, np.bytes_)) else
               str(i.item() if hasattr(i, "item") else i) for i in ids]
        seen: dict = {}
        for k, i in enumerate(ids):
            if i in seen:
                raise FedalignError(f"{source}: id {i!r} names rows {seen[i]} and {k}: ids must "
                                    "be unique (or leave ids out: they are numbered)")
            seen[i] = k
    else:
        width = len(str(n - 1))
        ids = [f"{source.stem}/{i:0{width}d}" for i in range(n)]
    from fedalign.version import __version__

    provenance = dict(producer=f"fedalign {__version__} import", source=str(source),
                      source_sha256=sha256_file(source), format=fmt, keys=keys, labels=mapping)
    if src.detail:
        provenance["detail"] = src.detail
    write_features(output, X, y, ids, class_names=names, provenance=provenance)
    return ImportResult(Path(output), n, d, list(names), int((y >= 0).sum()), fmt, keys, notes)


def input_files(source, fmt=None, labels_file=None, class_names=None) -> list:
    """Every file an import reads: the source, the labels file (given, or a ``.npy``'s
    sibling), a class-names file; the output may be none of them."""
    source = Path(source)
    files = [source, labels_file]
    if labels_file is None and source.is_file() and detect_format(source, fmt) == "npy":
        files.append(sibling_labels(source))
    if isinstance(class_names, (str, os.PathLike)) and Path(class_names).is_file():
        files.append(Path(class_names))
    return files


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__

"""The ``.npz`` codec: validated bytes (:func:`npz_bytes`, :func:`write_npz`), the validating
reader (:func:`read_npz`), the header alone (:func:`npz_header`), and the packed storage of
symmetric matrices (:func:`pack_symmetric`, :func:`unpack_symmetric`).

A file holds its arrays, its ``kind`` (``__kind__``), its ``format_version``
(``__format_version__``) and its metadata as one JSON string (``__meta__``); nothing is
pickled. What each kind holds is :mod:`fedalign.files.schemas`.
"""

from __future__ import annotations

import functools
import json
import zipfile
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError, short_array
from fedalign.files.outputs import _require_file, _short, with_article
from fedalign.files.schemas import (PACKED_DTYPES, _get_schema, _get_version, _read_schema,
                                    _validate_arrays, _validate_meta)
from fedalign.files.transactions import atomic_output
from fedalign.linalg import check_spd

_META_KEY = "__meta__"
_KIND_KEY = "__kind__"
_VERSION_KEY = "__format_version__"


def write_npz(path, kind: str, arrays: dict, meta: dict | None = None,
              version: int | None = None, dtype: str = "float64") -> Path:
    """Validate ``arrays`` against the schema of ``kind`` and write them atomically.

    ``meta`` is any JSON-serialisable dict (provenance, convergence record, parameters);
    it is stored as a JSON string, never pickled. ``version``: the format version to write
    (default: the kind's default); ``dtype``: storage of the version's packed arrays
    (:data:`PACKED_DTYPES`).
    """
    data = npz_bytes(kind, arrays, meta, source=f"{kind} being written to {path}",
                     version=version, dtype=dtype)
    path = Path(path)
    with atomic_output(path, suffix=".tmp.npz") as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


def npz_bytes(kind: str, arrays: dict, meta: dict | None = None, source: str | None = None,
              version: int | None = None, dtype: str = "float64") -> bytes:
    """The exact bytes :func:`write_npz` writes (validated), e.g. to hash a file before it exists."""
    import io

    schema = _get_schema(kind) if version is None else _get_version(kind, version)
    source = source or f"{kind} being written"
    arrays = {k: np.asarray(v) for k, v in arrays.items() if v is not None}
    _validate_arrays(arrays, schema, source=source)
    if dtype not in PACKED_DTYPES or (dtype != "float64" and not schema.packed):
        raise FedalignError(f"cannot store {with_article(kind)} file (format_version {schema.version}) "
                            f"in {dtype}: storage dtypes are for packed formats "
                            f"({', '.join(PACKED_DTYPES)})")
    payload = dict(arrays)
    for name in schema.packed:
        if name in payload:
            payload[f"{name}_triu"] = pack_symmetric(payload.pop(name), dtype, f"{source}: "
                                                     f"'{name}'", spd=name in schema.spd)
    payload[_KIND_KEY] = np.array(kind)
    payload[_VERSION_KEY] = np.array(schema.version)
    payload[_META_KEY] = np.array(json.dumps(meta or {}, sort_keys=True))
    buf = io.BytesIO()
    np.savez(buf, **payload)
    return buf.getvalue()


def pack_symmetric(M: np.ndarray, dtype: str = "float64", what: str = "matrix",
                   spd: bool = False) -> np.ndarray:
    """The upper triangle of symmetric M (d, d), row by row, as a (d(d+1)/2,) ``dtype``
    array: half the bytes of M, and exact in float64. In float32 every entry must fit the
    float32 range and, with ``spd``, the rounded matrix must still be positive definite."""
    M = np.asarray(M)
    d = M.shape[0]
    iu = np.triu_indices(d)
    if dtype == "float32":
        if M.size and float(np.abs(M).max()) > float(np.finfo(np.float32).max):
            raise FedalignError(f"{what} holds values beyond the float32 range: store it "
                                "in float64")
        P = M[iu].astype(np.float32)
        if spd:
            check_spd(unpack_symmetric(P, d), f"{what} rounded to float32 (store it in "
                      "float64)")
        return P
    return M[iu].astype(np.float64)


def unpack_symmetric(P: np.ndarray, d: int | None = None, what: str = "array") -> np.ndarray:
    """(d, d) float64 symmetric matrix from its packed upper triangle (:func:`pack_symmetric`)."""
    P = np.asarray(P)
    T = P.shape[0] if P.ndim == 1 else -1
    if d is None:
        d = int(round((np.sqrt(8.0 * max(T, 0) + 1.0) - 1.0) / 2.0))
    if P.ndim != 1 or T != d * (d + 1) // 2 or P.dtype.kind != "f":
        raise FedalignError(f"{what} must be a packed upper triangle of {d} × {d} floats "
                            f"(shape ({d * (d + 1) // 2},)), got {P.dtype} {P.shape}")
    iu = _triu_indices(d)
    M = np.empty((d, d))
    M[iu] = P
    M.T[iu] = P
    return M


@functools.lru_cache(maxsize=4)
def _triu_indices(d: int):
    return np.triu_indices(d)


def read_npz(path, kind: str, info: dict | None = None, spd: bool = True) -> tuple[dict, dict]:
    """Read and validate a ``.npz`` file of the given kind (any version :data:`VERSIONS`
    holds; packed arrays come back unpacked, float64 (d, d)).

    ``info``: a dict, when given, receives ``format_version`` and ``dtype`` (the storage of
    the packed arrays, "float64" when none are packed or stored in float32).
    ``spd=False``: the schema's SPD arrays are not checked here — the caller proves them
    another way (:func:`fedalign.align.load_client_stats`: an exact c I + W Wᵀ form, c > 0).

    Returns
    -------
    arrays : dict of str -> ndarray
    meta : dict
    """
    _get_schema(kind)
    path = _npz_file(path, kind)
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
        raise FedalignError(f"{path}: not a fedalign file (no 'kind'); expected {with_article(kind)} file")
    found = str(data.pop(_KIND_KEY))
    if found != kind:
        raise FedalignError(f"{path}: is {with_article(found)} file, expected {with_article(kind)} file")
    version = _npz_version(data.pop(_VERSION_KEY, np.array(-1)), path, kind)
    schema = _read_schema(kind, version, path)
    meta = _npz_meta(data.pop(_META_KEY, np.array("{}")), path)
    dtype = "float64"
    for name in schema.packed:
        key = f"{name}_triu"
        if key in data:
            if data[key].dtype == np.float32:
                dtype = "float32"
            data[name] = unpack_symmetric(data.pop(key), what=f"{path}: array '{key}'")
    if info is not None:
        info.update(format_version=version, dtype=dtype)
    _validate_meta(meta, schema, path)
    _validate_arrays(data, schema, source=str(path), spd=spd)
    return data, meta


def _npz_version(a: np.ndarray, path, kind: str) -> int:
    """The ``__format_version__`` entry: one integer (a string, a float or a list is not)."""
    if a.shape != () or a.dtype.kind not in "iu":
        raise FedalignError(f"{path}: {kind} format_version must be one integer, got "
                            f"{short_array(a)} ({a.dtype})")
    return int(a)


def _npz_meta(a: np.ndarray, path) -> dict:
    """The ``__meta__`` entry: one string holding a JSON object."""
    if a.shape != () or a.dtype.kind not in "US":
        raise FedalignError(f"{path}: metadata must be one JSON string, got {a.dtype} {a.shape}")
    try:
        meta = json.loads(str(a))
    except ValueError as e:
        raise FedalignError(f"{path}: metadata is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise FedalignError(f"{path}: metadata must be a JSON object, got "
                            f"{type(meta).__name__}")
    return meta


def _npz_file(path, kind: str) -> Path:
    """An existing file that starts as a zip (.npz) does, or one error line."""
    path = _require_file(path)
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic.startswith(b"\x89HDF"):
        raise FedalignError(f"{path}: is an HDF5 file (features?), expected {with_article(kind)} .npz file")
    if not magic.startswith(b"PK"):
        raise FedalignError(f"{path}: not a readable .npz file, expected {with_article(kind)} file")
    return path


def npz_kind(path) -> str | None:
    """The ``kind`` an .npz file's header names (``atoms``, ``stats``), or None where it names
    none or cannot be read: for the message of a reader given an .npz file of another kind."""
    try:
        with zipfile.ZipFile(path) as zf, zf.open(_KIND_KEY + ".npy") as f:
            return str(np.lib.format.read_array(f, allow_pickle=False))
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None


def npz_header(path, kind: str) -> dict:
    """A ``.npz`` file's kind, version and array shapes from its zip directory and the .npy
    headers, without reading any array: the cheap check of many files before any is read.

    Returns
    -------
    dict with ``format_version`` (int) and ``shapes`` {array name: shape} (a packed array
    under its unpacked name, (d, d))
    """
    path = _npz_file(path, kind)
    shapes, small = {}, {}
    try:
        with zipfile.ZipFile(path) as zf:
            for zi in zf.infolist():
                name = zi.filename[:-4] if zi.filename.endswith(".npy") else zi.filename
                with zf.open(zi) as f:
                    if name in (_KIND_KEY, _VERSION_KEY):
                        try:
                            small[name] = np.lib.format.read_array(f, allow_pickle=False)
                        except ValueError as e:
                            if "pickle" in str(e).lower():
                                raise FedalignError(f"{path}: refuses to load an .npz that "
                                                    "needs pickle") from None
                            raise
                        continue
                    major, _ = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if major == 1
                            else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read(f)
                    if dtype.hasobject:
                        raise FedalignError(f"{path}: refuses to load an .npz that needs pickle")
                    shapes[name] = shape
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        raise FedalignError(f"{path}: not a readable .npz file, expected {with_article(kind)} file "
                            f"({_short(e)})") from None
    if _KIND_KEY not in small:
        raise FedalignError(f"{path}: not a fedalign file (no 'kind'); expected {with_article(kind)} file")
    found = str(small[_KIND_KEY])
    if found != kind:
        raise FedalignError(f"{path}: is {with_article(found)} file, expected {with_article(kind)} file")
    version = _npz_version(small.get(_VERSION_KEY, np.array(-1)), path, kind)
    schema = _read_schema(kind, version, path)
    for name in schema.packed:
        shp = shapes.pop(f"{name}_triu", None)
        if shp is not None and len(shp) == 1:
            d = int(round((np.sqrt(8.0 * shp[0] + 1.0) - 1.0) / 2.0))
            shapes[name] = (d, d)
    return dict(format_version=version, shapes=shapes)

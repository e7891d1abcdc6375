"""The ``.npz`` file kinds: one :class:`Schema` per kind and format version, and the check of
arrays and metadata against it (:func:`_validate_arrays`, :func:`_validate_meta`).

Shapes use symbolic dimension names; every symbol must take one value in a file, and that
value is at least 1 (no kind has a meaning for an empty dimension: zero atoms, components,
classes or features). An array spec is (shape, dtype kind) with dtype kind "f" (float), "i"
(integer, a count or an index: at most :data:`MAX_INTEGER` in magnitude), "u" (unsigned 64-bit
words, e.g. a generator's state) or "U" (str). Optional arrays are listed in ``optional``; a
symbol of an absent optional array is unbound. Arrays must be finite and below
:data:`MAX_MAGNITUDE`; a schema's ``spd`` arrays symmetric positive definite
(:func:`fedalign.linalg.check_spd`). How the arrays are stored is :mod:`fedalign.files.npz`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from fedalign.errors import FedalignError
from fedalign.linalg import check_spd


@dataclass(frozen=True)
class Schema:
    """Definition of one ``.npz`` file kind."""

    kind: str
    version: int
    required: dict
    optional: dict = field(default_factory=dict)
    spd: tuple = ()  # (d, d) arrays that must be symmetric positive definite
    meta: dict = field(default_factory=dict)  # metadata key → type name (:data:`META_TYPES`)
    #: symmetric (d, d) arrays this version stores once, as their upper triangle
    #: ``<name>_triu`` (d(d+1)/2,) row by row, in float64 or float32 (:func:`pack_symmetric`)
    packed: tuple = ()


SCHEMAS: dict[str, Schema] = {}  # kind → the version writers use by default
VERSIONS: dict[tuple, Schema] = {}  # (kind, format_version) → every version readers accept

#: Storage dtypes of packed arrays (the arithmetic is float64 either way).
PACKED_DTYPES = ("float64", "float32")

#: What a metadata value of each type name must be (a key that is absent or null passes).
META_TYPES = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "strings": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                "a list of strings"),
}

#: Metadata every kind may record about its owner (read by the protocol checks).
_OWNER_META = {"client": "str", "domain": "str", "clients": "strings"}


def _schema(kind, version, required, optional=None, spd=(), meta=None, packed=(),
            default=True):
    sch = Schema(kind, version, required, optional or {}, tuple(spd), meta or {}, tuple(packed))
    VERSIONS[(kind, version)] = sch
    if default:
        SCHEMAS[kind] = sch
    return sch


_STATS = dict(
    required={
        "n": ((), "i"),
        "mean": (("d",), "f"),
        "covariance": (("d", "d"), "f"),
        "shrinkage": ((), "f"),
        "shift": (("d",), "f"),
        "sum_y": (("d",), "f"),
        "sum_yy": (("d", "d"), "f"),
    },
    optional={
        # fourth-moment sums (Ledoit–Wolf); a DP release (meta "dp") does not carry them
        "sum_sqnorm_y": (("d",), "f"),
        "sum_sqnorm2": ((), "f"),
        "class_counts": (("C",), "i"),
        "class_sums": (("C", "d"), "f"),
        "class_names": (("C",), "U"),
    },
    spd=("covariance",),
    meta=dict(_OWNER_META, class_names="strings", dp="object"),
)
_schema("stats", 1, **_STATS)
# version 2: the same arrays, the two symmetric matrices stored once (upper triangle), in
# float64 or float32 (``fedalign stats --compact`` / ``--dtype float32``); readers unpack
# them to float64 (d, d), so version 1 and 2 files read the same
_schema("stats", 2, **_STATS, packed=("covariance", "sum_yy"), default=False)
_schema(
    "reference",
    1,
    required={
        "mean": (("d",), "f"),
        "covariance": (("d", "d"), "f"),
        "weights": (("K",), "f"),
        "n": (("K",), "i"),
    },
    spd=("covariance",),
    meta=dict(convergence="object", dp_inputs="list"),
)
_schema(
    "map",
    1,
    required={
        "A": (("d", "d"), "f"),
        "b": (("d",), "f"),
    },
    spd=("A",),
    meta=dict(_OWNER_META, scope="str", reference_sha256="str", stats_sha256="str",
              client_stats_sha256="strings", dp="object"),
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
    meta=dict(n_classes="int", fit="list"),
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
    2,
    required={
        "means": (("A", "K", "d"), "f"),
        "variances": (("A", "K", "d"), "f"),
        "label_logits": (("A", "K", "C"), "f"),
        "alpha": (("A",), "f"),
        "round": ((), "i"),
        "rng_state": (("six",), "u"),
        "var_floor": (("d",), "f"),
    },
    optional={
        "received_means": (("A", "K", "d"), "f"),
        "received_variances": (("A", "K", "d"), "f"),
        "received_label_logits": (("A", "K", "C"), "f"),
        "alpha_received": (("A",), "f"),
    },
    meta=dict(client="str", settings="object", history="list", gmm_path="str",
              gmm_sha256="str", published="object", producer="str"),
)


def _get_schema(kind: str) -> Schema:
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise ValueError(f"unknown file kind {kind!r}") from None


def _get_version(kind: str, version: int) -> Schema:
    _get_schema(kind)
    sch = VERSIONS.get((kind, version))
    if sch is None:
        raise ValueError(f"unknown {kind} format_version {version!r}")
    return sch


def _read_schema(kind: str, version: int, path) -> Schema:
    """The schema of a file's ``kind`` and ``format_version``, or one error line."""
    sch = VERSIONS.get((kind, version))
    if sch is None:
        known = sorted(v for k, v in VERSIONS if k == kind)
        raise FedalignError(f"{path}: {kind} format_version {version} is not supported "
                            f"(expected {' or '.join(map(str, known))})")
    return sch


#: Largest magnitude an ``.npz`` array may hold: moments, distances and costs square it.
MAX_MAGNITUDE = 1e150

#: Largest magnitude of an integer ("i") array: counts and rounds enter float64 arithmetic
#: (weights n_k / N, moments) and are incremented, exact only up to 2**53; a value beyond it
#: is a damaged or hand-edited file (an unsigned 2**64 − 1 overflowed int64 in the digests).
MAX_INTEGER = 2**53


def _validate_arrays(arrays: dict, schema: Schema, source: str, spd: bool = True) -> dict:
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
        if dkind in "iu" and a.dtype.kind not in "iu":
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
            if n == 0:
                raise FedalignError(f"{source}: array '{name}' has shape {a.shape}: {sym} must "
                                    "be at least 1")
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise FedalignError(f"{source}: array '{name}' contains NaN or Inf")
        if dkind == "u" and a.dtype.kind == "i" and a.size and a.min() < 0:
            raise FedalignError(f"{source}: array '{name}' must hold unsigned words, got "
                                f"{int(a.min())}")
        if dkind == "i" and a.size and not (-MAX_INTEGER <= int(a.min())
                                            and int(a.max()) <= MAX_INTEGER):
            v = int(a.max()) if int(a.max()) > MAX_INTEGER else int(a.min())
            raise FedalignError(f"{source}: array '{name}' holds the integer {v}, beyond "
                                f"±2**53 (a count or a round): a damaged file")
        if a.dtype.kind in "fiu" and dkind != "u" and a.size and np.abs(a).max() > MAX_MAGNITUDE:
            raise FedalignError(f"{source}: array '{name}' holds a value of magnitude "
                                f"{float(np.abs(a).max()):.3g}, beyond {MAX_MAGNITUDE:.0e}: its "
                                "square overflows float64")
    for name in schema.spd if spd else ():
        if name in arrays:
            check_spd(arrays[name], f"{source}: '{name}'")
    return sizes


def _validate_meta(meta: dict, schema: Schema, path) -> None:
    """The metadata values a reader uses have their types (:attr:`Schema.meta`)."""
    for key, tname in schema.meta.items():
        value = meta.get(key)
        ok, what = META_TYPES[tname]
        if value is not None and not ok(value):
            raise FedalignError(f"{path}: metadata '{key}' must be {what}, got "
                                f"{type(value).__name__} {json.dumps(value)[:60]}")

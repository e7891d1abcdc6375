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
                  format_version 1 (default) or 2 (``stats --compact``/``--dtype float32``:
                  covariance and Σyyᵀ stored once, upper triangle, float64 or float32).
                  A DP release (meta ``dp``: :mod:`fedalign.dp`) holds the noisy count, Σx
                  and Σxxᵀ (shift 0), no fourth-moment sums, and a post-processed covariance.
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

Features files written by other tools are read in their natural h5py forms (class names as
an array of strings or bytes, integer ids, int32 labels, float64 features) or refused with
one line naming the attribute and the expected form: ``docs/features-format.md``.
Covariances (stats, reference) and map matrices A must be symmetric (to
:data:`SYMMETRY_RTOL`) and positive definite (:func:`check_spd`); labels must lie in
[-1, C) when class names are given.

Outputs
-------
Nothing is lost, ever:

- **No output over an input.** :func:`check_outputs` compares resolved paths (symlinks,
  ``./`` spellings) and (st_dev, st_ino) (hard links); the CLI checks every command before it
  starts (``dadil-round``'s in-place state update is the one documented exception).
- **Outputs checked first.** :func:`check_output_file` / :func:`check_output_folder`: the
  folder exists and is writable, a file output is not a folder, a folder output not a file.
- **All outputs or none.** Every writer goes through :func:`atomic_output`: the file (or
  folder) is written as ``.<name>.fedalign-tmp-<pid>-<random><suffix>`` next to the output.
  Inside :func:`atomic_outputs` (every CLI command runs in one) the temporaries are renamed
  together when the block ends and no signal is pending, or all removed on any failure,
  SIGINT and SIGTERM included (:mod:`fedalign.interrupt`).
- **Killed runs.** A temporary left by SIGKILL is removed by the next run writing the same
  output (:func:`remove_stale`: its pid is gone). ``extract``'s resume file
  ``.<name>.partial.h5`` is kept on purpose until the output is in place.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import secrets
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from fedalign import defaults
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
        "rng_state": (("six",), "i"),
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

#: Most classes a features file may name: a label beyond it is a mistake (an id, a code, a
#: wrapped integer), not a class index (ImageNet-21k has 21,841 classes); its names list
#: alone would take minutes and gigabytes.
MAX_CLASSES = 100_000

FEATURES_KIND = "features"
FEATURES_VERSION = 1
REPORT_KIND = "report"
REPORT_VERSION = 1

_META_KEY = "__meta__"
_KIND_KEY = "__kind__"
_VERSION_KEY = "__format_version__"


# --------------------------------------------------------------------------------------------
# Outputs: never over an input, all of a command's outputs together, nothing left behind
# --------------------------------------------------------------------------------------------

#: Temporary outputs are named ``.<name>.fedalign-tmp-<pid>-<random><suffix>``, next to the
#: output; the pid lets the next run remove what a killed run left (:func:`remove_stale`).
TMP_MARK = ".fedalign-tmp-"
_TMP_PID = re.compile(r"(\d+)-")
_ACTIVE: set = set()  # temporaries of this process's open transactions (never stale)
_TX: list = []  # stack of open transactions (:func:`atomic_outputs`)


def _identity(path) -> tuple:
    p = Path(path)
    try:
        st = os.stat(p)
        ino = (st.st_dev, st.st_ino)
    except OSError:
        ino = None
    return os.path.realpath(p), ino


def _keys(path) -> tuple:
    """The names under which ``path`` is one file: its resolved path and, when it exists, its
    (st_dev, st_ino). Two paths are one file when they share a key (:func:`same_file`)."""
    real, ino = _identity(path)
    return (("path", real),) if ino is None else (("path", real), ("inode", ino))


def same_file(a, b) -> bool:
    """True when two spellings name one file: the same resolved path (symlinks, ``./``, ``..``)
    or, for existing files, the same (st_dev, st_ino) (hard links)."""
    return not set(_keys(a)).isdisjoint(_keys(b))


def check_outputs(inputs, outputs, allow=()) -> None:
    """Refuse a command whose outputs include one of its inputs, or one file twice.

    Each path is resolved once and looked up by its keys (:func:`_keys`), so a command with n
    outputs and m inputs costs O(n + m) path resolutions, not O(n·(n + m)) (a federation of
    10 clients × 100 rounds has ~1,000 outputs: 20 s pairwise).

    Parameters
    ----------
    inputs, outputs : iterables of paths (None entries are ignored)
    allow : paths that may be both input and output: a file the command updates in place,
        atomically (``dadil-round``'s client state; ``--init --force``)
    """
    ins = [Path(p) for p in inputs if p is not None]
    outs = [Path(p) for p in outputs if p is not None]
    allowed = {k for p in allow if p is not None for k in _keys(p)}
    first_input: dict = {}  # key → (position, input): the first input named by that key
    for i, p in enumerate(ins):
        for k in _keys(p):
            first_input.setdefault(k, (i, p))
    for o, keys, earlier in _repeats(outs):
        if earlier is not None:
            raise FedalignError(f"{earlier} and {o} are the same output file: give "
                                "different names")
        if allowed.intersection(keys):
            continue
        hits = [first_input[k] for k in keys if k in first_input]
        if hits:
            p = min(hits, key=lambda h: h[0])[1]
            alias = "" if str(p) == str(o) else f" ({p})"
            raise FedalignError(f"output {o} is also an input{alias}: refusing to overwrite "
                                "an input; give another output name")


def check_distinct(paths, what: str = "input") -> None:
    """Refuse one file given twice among ``paths`` (any spelling: symlinks, ``./``, hard
    links): e.g. one client's statistics counted as two clients of a barycenter."""
    for p, _, earlier in _repeats(p for p in paths if p is not None):
        if earlier is not None:
            alias = "" if str(earlier) == str(p) else f" (as {earlier})"
            raise FedalignError(f"{what} {p} is given twice{alias}: each file counts once")


def _repeats(paths):
    """(path, its keys, the earlier path naming the same file or None) for each of ``paths``
    in order: each path resolved once, looked up by its keys (:func:`_keys`)."""
    seen: dict = {}  # key → the first path with it
    for p in paths:
        keys = _keys(p)
        yield p, keys, next((seen[k] for k in keys if k in seen), None)
        for k in keys:
            seen.setdefault(k, p)


def _writable_folder(folder: Path, target: Path) -> None:
    if not folder.exists():
        raise FedalignError(f"output folder does not exist: {folder}")
    if not folder.is_dir():
        raise FedalignError(f"cannot write {target}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FedalignError(f"cannot write {target}: folder {folder} is not writable")
    try:  # access() does not see every reason (read-only mounts for root, ACLs, quotas)
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}{TMP_MARK}{os.getpid()}-probe",
                                     dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise FedalignError(f"cannot write {target}: {e.strerror or e} (folder {folder})") from None


def check_output_file(path) -> Path:
    """Before any work: ``path`` can be written as a file (its folder exists and is writable,
    it is not a folder). Removes temporaries of ``path`` left by killed runs."""
    path = Path(path)
    if path.is_dir():
        raise FedalignError(f"output {path} is an existing folder, expected a file name")
    _not_special(path)
    _writable_folder(path.parent, path)
    remove_stale(path)
    return path


def _not_special(path: Path) -> None:
    """An existing output must be a regular file: a rename would replace a device, a pipe or
    a socket (``-o /dev/null`` run as root) by a regular file."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise FedalignError(f"output {path} exists and is not a regular file (a device, pipe "
                            "or socket): refusing to replace it")


def check_output_folder(path, empty: bool = False) -> Path:
    """Before any work: ``path`` is a folder, or can be created (its nearest existing parent is
    a writable folder); with ``empty``, an existing folder must be empty."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FedalignError(f"output folder {path} is an existing file, expected a folder")
    if path.is_dir():
        if empty and any(path.iterdir()):
            raise FedalignError(f"{path} exists and is not empty")
        _writable_folder(path, path / "x")
        return path
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise FedalignError(f"cannot create folder {path}: {anc} is not a folder")
    _writable_folder(anc, path)
    remove_stale(path)
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def remove_stale(path) -> list:
    """Remove the temporaries of output ``path`` that runs killed with SIGKILL left behind
    (named ``.<name>.fedalign-tmp-<pid>-…`` with ``<pid>`` no longer running). Returns them."""
    path = Path(path)
    folder = path.parent
    prefix = f".{path.name}{TMP_MARK}"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        m = _TMP_PID.match(name[len(prefix):]) if name.startswith(prefix) else None
        if m is None:
            continue
        tmp, pid = folder / name, int(m.group(1))
        if tmp in _ACTIVE or (pid != os.getpid() and _pid_alive(pid)):
            continue
        _remove(tmp)
        removed.append(tmp)
    return removed


def _remove(p: Path) -> None:
    import shutil

    with contextlib.suppress(FileNotFoundError):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()


def _before_commit(paths: list) -> None:
    """Called with the outputs just before a transaction renames them (a seam for fault tests:
    they replace it to stop a command mid-write; does nothing)."""


class Transaction:
    """The outputs of one command: temporaries that are renamed together or all removed."""

    def __init__(self):
        self.entries: list = []  # (tmp, path, is_dir)
        self._by_key: dict = {}  # key of an output (:func:`_keys`) → its entry
        self.folders: list = []  # folders created for the outputs (removed on rollback)
        self.after: list = []  # callables run after the commit

    def add(self, path, suffix: str | None = None, directory: bool = False) -> Path:
        """Reserve the temporary of output ``path`` (a file, or a folder with ``directory``)."""
        path = Path(path)
        if directory:
            if path.exists() and not (path.is_dir() and not any(path.iterdir())):
                raise FedalignError(f"{path} exists and is not an empty folder")
        elif path.is_dir():
            raise FedalignError(f"output {path} is an existing folder, expected a file name")
        _not_special(path)
        folder = path.parent
        if not folder.is_dir():
            raise FedalignError(f"output folder does not exist: {folder}")
        keys = _keys(path)
        if any(k in self._by_key for k in keys):
            raise FedalignError(f"{path} would be written twice by one command")
        remove_stale(path)
        suffix = path.suffix if suffix is None else suffix
        tmp = folder / f".{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}{suffix}"
        try:
            if directory:
                tmp.mkdir()
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except OSError as e:
            raise FedalignError(f"cannot write {path}: {e.strerror or e}") from None
        _ACTIVE.add(tmp)
        entry = (tmp, path, directory)
        self.entries.append(entry)
        self._by_key.update((k, entry) for k in keys)
        return tmp

    def _entry(self, path):
        """The entry of output ``path`` (by any of its keys), or None."""
        return next((self._by_key[k] for k in _keys(path) if k in self._by_key), None)

    def temporary(self, path) -> Path:
        """The temporary that will become output ``path``."""
        entry = self._entry(path)
        if entry is None:
            raise KeyError(f"{path} is not an output of this transaction")
        return entry[0]

    def commit_first(self, path) -> None:
        """Rename output ``path`` before the others (e.g. a state before the file it points to)."""
        entry = self._entry(path)
        if entry is not None:
            self.entries = [entry] + [e for e in self.entries if e is not entry]

    def discard(self, tmp: Path) -> None:
        """Forget (and remove) one temporary, e.g. after its writer failed."""
        self.entries = [e for e in self.entries if e[0] != tmp]
        self._by_key = {k: e for k, e in self._by_key.items() if e[0] != tmp}
        _ACTIVE.discard(tmp)
        _remove(tmp)

    def make_folder(self, path) -> Path:
        """Create output folder ``path`` (and missing parents); removed again on rollback."""
        path = Path(path)
        missing = []
        p = path
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        for p in reversed(missing):
            try:
                p.mkdir()
            except OSError as e:
                raise FedalignError(f"cannot create folder {p}: {e.strerror or e}") from None
            self.folders.append(p)
        if not path.is_dir():
            raise FedalignError(f"output folder {path} is an existing file, expected a folder")
        return path

    def commit(self) -> None:
        from fedalign import interrupt

        _before_commit([p for _, p, _ in self.entries])
        interrupt.check()
        with interrupt.deferred():
            for tmp, path, _ in self.entries:
                try:
                    os.replace(tmp, path)
                except OSError as e:
                    raise FedalignError(f"cannot write {path}: {e.strerror or e}") from None
                _ACTIVE.discard(tmp)
            self.entries, self._by_key = [], {}
            for fn in self.after:
                fn()

    def rollback(self) -> None:
        for tmp, _, _ in self.entries:
            _ACTIVE.discard(tmp)
            _remove(tmp)
        self.entries, self._by_key = [], {}
        for p in reversed(self.folders):
            with contextlib.suppress(OSError):
                p.rmdir()
        self.folders = []


@contextlib.contextmanager
def atomic_outputs(join: bool = True) -> Iterator[Transaction]:
    """Commit every :func:`atomic_output` opened inside the block together, at its end.

    The temporaries are renamed onto their outputs in the order they were opened, after the
    whole block succeeded and no signal is pending (:mod:`fedalign.interrupt`); on any
    exception (KeyboardInterrupt and SIGTERM included) all of them, and the folders created
    with :meth:`Transaction.make_folder`, are removed and no output is touched. Inside an open
    transaction the block joins it (``join=False``: commit this block on its own).
    """
    if join and _TX:
        yield _TX[-1]
        return
    tx = Transaction()
    _TX.append(tx)
    try:
        yield tx
        _TX.remove(tx)
        tx.commit()
    except BaseException:
        tx.rollback()
        raise
    finally:
        if tx in _TX:
            _TX.remove(tx)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str | None = None,
                  directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; it becomes ``path`` when the transaction ends.

    Outside :func:`atomic_outputs` the transaction is this one output: it is renamed when the
    block ends. On any exception the temporary is removed and ``path`` is left untouched.
    ``directory``: the temporary (and the output) is a folder, e.g. an image tree.
    """
    with atomic_outputs() as tx:
        tmp = tx.add(path, suffix, directory)
        try:
            yield tmp
        except BaseException:
            tx.discard(tmp)
            raise


def make_output_folder(path) -> Path:
    """Create an output folder; inside a transaction it is removed again if that fails."""
    if _TX:
        return _TX[-1].make_folder(path)
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FedalignError(f"cannot create folder {path}: {e.strerror or e}") from None
    return path


def staging_folder(target) -> Path:
    """A new, empty folder next to ``target`` named like its temporaries
    (``.NAME.fedalign-tmp-<pid>-…``): work that reads its own intermediate files (a simulated
    federation reads every round's atoms) is written there, then moved in with
    :func:`move_in`. A run killed with SIGKILL leaves it for the next run to remove
    (:func:`remove_stale`), and it is never inside ``target``."""
    target = Path(target).resolve()
    remove_stale(target)
    try:
        return Path(tempfile.mkdtemp(prefix=f".{target.name}{TMP_MARK}{os.getpid()}-",
                                     dir=target.parent))
    except OSError as e:
        raise FedalignError(f"cannot write next to {target}: {e.strerror or e}") from None


def move_in(stage, output, first=None) -> list:
    """Every file under ``stage`` becomes an output at the same place under ``output``, all in
    one transaction (joining the open one, e.g. a command's); ``first(relative path)`` true
    for files renamed before the others. Returns the output paths."""
    import shutil

    stage, output = Path(stage), Path(output)
    rel = sorted(p.relative_to(stage) for p in stage.rglob("*") if p.is_file())
    if first is not None:
        rel.sort(key=lambda r: not first(r))
    with atomic_outputs():
        for r in rel:
            make_output_folder((output / r).parent)
            with atomic_output(output / r) as tmp:
                shutil.move(stage / r, tmp)
    return [output / r for r in rel]


def after_commit(fn) -> None:
    """Run ``fn`` once the open transaction has committed (at once when none is open)."""
    if _TX:
        _TX[-1].after.append(fn)
    else:
        fn()


# --------------------------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(path, holder: str = "another process") -> Iterator[None]:
    """Hold an exclusive lock on existing file ``path`` for the block (``fcntl.flock``, not
    blocking: a lock held elsewhere is a :class:`FedalignError` naming ``holder``).

    The lock is taken on the file's inode, so it survives nothing but the process; a file
    that was replaced (renamed over) while the lock was being taken is locked again.
    """
    import fcntl

    path = Path(path)
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise FedalignError(f"cannot open {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise FedalignError(f"{path} is locked by {holder}; try again when it has finished") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise FedalignError(f"{path} keeps changing while being locked ({holder})")
    try:
        yield
    finally:
        os.close(fd)


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
        raise FedalignError(f"cannot store a {kind} file (format_version {schema.version}) "
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
        raise FedalignError(f"{path}: not a fedalign file (no 'kind'); expected a {kind} file")
    found = str(data.pop(_KIND_KEY))
    if found != kind:
        raise FedalignError(f"{path}: is a {found} file, expected a {kind} file")
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


def _validate_meta(meta: dict, schema: Schema, path) -> None:
    """The metadata values a reader uses have their types (:attr:`Schema.meta`)."""
    for key, tname in schema.meta.items():
        value = meta.get(key)
        ok, what = META_TYPES[tname]
        if value is not None and not ok(value):
            raise FedalignError(f"{path}: metadata '{key}' must be {what}, got "
                                f"{type(value).__name__} {json.dumps(value)[:60]}")


def _npz_version(a: np.ndarray, path, kind: str) -> int:
    """The ``__format_version__`` entry: one integer (a string, a float or a list is not)."""
    if a.shape != () or a.dtype.kind not in "iu":
        raise FedalignError(f"{path}: {kind} format_version must be one integer, got "
                            f"{np.array2string(a, threshold=5)} ({a.dtype})")
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
        raise FedalignError(f"{path}: is an HDF5 file (features?), expected a {kind} .npz file")
    if not magic.startswith(b"PK"):
        raise FedalignError(f"{path}: not a readable .npz file, expected a {kind} file")
    return path


def _read_schema(kind: str, version: int, path) -> Schema:
    """The schema of a file's ``kind`` and ``format_version``, or one error line."""
    sch = VERSIONS.get((kind, version))
    if sch is None:
        known = sorted(v for k, v in VERSIONS if k == kind)
        raise FedalignError(f"{path}: {kind} format_version {version} is not supported "
                            f"(expected {' or '.join(map(str, known))})")
    return sch


def _get_version(kind: str, version: int) -> Schema:
    _get_schema(kind)
    sch = VERSIONS.get((kind, version))
    if sch is None:
        raise ValueError(f"unknown {kind} format_version {version!r}")
    return sch


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
        raise FedalignError(f"{path}: not a readable .npz file, expected a {kind} file "
                            f"({_short(e)})") from None
    if _KIND_KEY not in small:
        raise FedalignError(f"{path}: not a fedalign file (no 'kind'); expected a {kind} file")
    found = str(small[_KIND_KEY])
    if found != kind:
        raise FedalignError(f"{path}: is a {found} file, expected a {kind} file")
    version = _npz_version(small.get(_VERSION_KEY, np.array(-1)), path, kind)
    schema = _read_schema(kind, version, path)
    for name in schema.packed:
        shp = shapes.pop(f"{name}_triu", None)
        if shp is not None and len(shp) == 1:
            d = int(round((np.sqrt(8.0 * shp[0] + 1.0) - 1.0) / 2.0))
            shapes[name] = (d, d)
    return dict(format_version=version, shapes=shapes)


def _get_schema(kind: str) -> Schema:
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise ValueError(f"unknown file kind {kind!r}") from None


#: Largest magnitude an ``.npz`` array may hold: moments, distances and costs square it.
MAX_MAGNITUDE = 1e150


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
        if a.dtype.kind in "fiu" and a.size and np.abs(a).max() > MAX_MAGNITUDE:
            raise FedalignError(f"{source}: array '{name}' holds a value of magnitude "
                                f"{float(np.abs(a).max()):.3g}, beyond {MAX_MAGNITUDE:.0e}: its "
                                "square overflows float64")
    for name in schema.spd if spd else ():
        if name in arrays:
            check_spd(arrays[name], f"{source}: '{name}'")
    return sizes


#: Relative asymmetry max|M − Mᵀ| / max|M| accepted as rounding (then M is symmetrised).
SYMMETRY_RTOL = 1e-8


def check_spd(M, what: str = "matrix", rtol: float = SYMMETRY_RTOL) -> np.ndarray:
    """Symmetric positive definite, numerically: returns the symmetrised float64 matrix.

    Symmetric: max|M − Mᵀ| ≤ rtol · max|M|. Positive definite: λ_min > d · eps · tr M (the
    usual numerical-rank tolerance), tested by a Cholesky factorisation of M − tol·I.
    """
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise FedalignError(f"{what} must be a square matrix, got shape {M.shape}")
    scale = float(np.abs(M).max()) if M.size else 0.0
    asym = float(np.abs(M - M.T).max()) if M.size else 0.0
    if asym > rtol * scale:
        raise FedalignError(f"{what} is not symmetric (max |M − Mᵀ| = {asym:.3g}, "
                            f"{asym / scale:.1e} of its largest entry)")
    S = 0.5 * (M + M.T)
    d = S.shape[0]
    tol = d * np.finfo(np.float64).eps * float(np.trace(S))
    ok = scale > 0 and tol >= 0 and bool(np.all(np.diag(S) > 0))
    if ok:
        try:
            np.linalg.cholesky(S - tol * np.eye(d))
        except np.linalg.LinAlgError:
            ok = False
    if not ok:
        raise FedalignError(f"{what} is not positive definite (singular or with negative "
                            "eigenvalues)")
    return S


# --------------------------------------------------------------------------------------------
# Features (.h5)
# --------------------------------------------------------------------------------------------

DEFAULT_CHUNK_ROWS = defaults.CHUNK_ROWS


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
        import h5py

        h5, p = self._h5, self.path
        kind = _attr_str(h5.attrs.get("kind"))
        if kind is None:
            raise FedalignError(
                f"{p}: not a fedalign features file: attribute 'kind' is missing (expected "
                f"attrs kind='features', format_version={FEATURES_VERSION}; see "
                "docs/features-format.md)")
        if kind != FEATURES_KIND:
            raise FedalignError(f"{p}: is a {kind} file, expected a features file")
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


def report_accuracies(report: dict, path) -> tuple[str, dict]:
    """Check the accuracy tables of a report and return ``(producer, results)``.

    ``evaluate`` reports hold ``methods: {method: {"summary": {domain: {"mean", "std"}}}}``
    (with a ``macro`` domain) and ``alignment: null | {"tau": τ, …}``; ``dadil-evaluate``
    reports hold ``summary: {method: {"mean", "std"}}``. ``results`` is the one present.
    """
    def mean_std(v, where):
        if not (isinstance(v, dict) and all(isinstance(v.get(k), (int, float))
                                             and not isinstance(v.get(k), bool)
                                             for k in ("mean", "std"))):
            raise FedalignError(f"{path}: {where} must be {{\"mean\": number, \"std\": number}}")

    if "methods" in report:
        methods = report["methods"]
        if not isinstance(methods, dict) or not methods:
            raise FedalignError(f"{path}: 'methods' must be a non-empty object of method results")
        for m, r in methods.items():
            summ = r.get("summary") if isinstance(r, dict) else None
            if not isinstance(summ, dict) or "macro" not in summ:
                raise FedalignError(f"{path}: methods.{m}.summary must be an object of per-domain "
                                    "accuracies with a 'macro' entry")
            for dom, v in summ.items():
                mean_std(v, f"methods.{m}.summary.{dom}")
        al = report.get("alignment")
        if al is not None and not (isinstance(al, dict) and isinstance(al.get("tau"), (int, float))):
            raise FedalignError(f"{path}: 'alignment' must be null or an object with a number 'tau'")
        return "evaluate", methods
    if "summary" in report:
        summ = report["summary"]
        if not isinstance(summ, dict) or not summ:
            raise FedalignError(f"{path}: 'summary' must be a non-empty object of method results")
        for m, v in summ.items():
            mean_std(v, f"summary.{m}")
        return "dadil-evaluate", summ
    raise FedalignError(f"{path}: report has no accuracy results (no 'methods' or 'summary'; "
                        f"producer {report.get('producer', 'unknown')!r})")


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


def _short(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__

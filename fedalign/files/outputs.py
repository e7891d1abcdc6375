"""Outputs never over an input, checked before any work; what killed runs left; locks, hashes.

Nothing is lost, ever:

- **No output over an input.** :func:`check_outputs` compares resolved paths (symlinks,
  ``./`` spellings) and (st_dev, st_ino) (hard links); the CLI checks every command before it
  starts (``dadil-round``'s in-place state update is the one documented exception).
- **Outputs checked first.** :func:`check_output_file` / :func:`check_output_folder`: the
  folder exists and is writable, a file output is not a folder, a folder output not a file.
- **All outputs or none.** Every writer goes through
  :func:`~fedalign.files.transactions.atomic_output`: the file (or folder) is written as
  ``.<name>.fedalign-tmp-<pid>-<random><suffix>`` next to the output. Inside
  :func:`~fedalign.files.transactions.atomic_outputs` (every CLI command runs in one) the
  temporaries are renamed together when the block ends and no signal is pending, or all
  removed on any failure, SIGINT and SIGTERM included (:mod:`fedalign.interrupt`); the
  machinery is :mod:`fedalign.files.transactions`.
- **Killed runs.** A temporary left by SIGKILL is removed by the next run writing the same
  output (:func:`remove_stale`: its pid is gone). ``extract``'s resume file
  ``.<name>.partial.h5`` is kept on purpose until the output is in place.

The files a command reads are here too: an input exists and is a file (:func:`_require_file`),
its SHA-256 (:func:`sha256_file`), and the lock on a file updated in place (:func:`locked`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Iterator

from fedalign.errors import FedalignError

#: Temporary outputs are named ``.<name>.fedalign-tmp-<pid>-<random><suffix>``, next to the
#: output; the pid lets the next run remove what a killed run left (:func:`remove_stale`).
TMP_MARK = ".fedalign-tmp-"
_TMP_PID = re.compile(r"(\d+)-")
_ACTIVE: set = set()  # temporaries of this process's open transactions (never stale)


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


# --------------------------------------------------------------------------------------------
# Inputs: a file that exists, its lock, its hash
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


#: The first bytes of the binary formats fedalign reads: {signature: format}.
SIGNATURES = {b"PK\x03\x04": "npz", b"PK\x05\x06": "npz", b"\x89HDF\r\n\x1a\n": "hdf5",
              b"\x93NUMPY": "npy", b"MATLAB": "mat"}

#: How a message names each format :func:`file_format` tells apart.
FORMAT_NAMES = {"npz": "an .npz file", "hdf5": "an HDF5 file", "npy": "a .npy array",
                "mat": "a MATLAB file", "text": "a text file", "empty": "an empty file",
                None: "a file of unknown format"}


def file_format(path) -> str | None:
    """What ``path`` holds, from its first bytes: ``npz`` (a zip), ``hdf5``, ``npy``, ``mat``
    (a MATLAB header; v7.3 files are HDF5 after it), ``empty``, ``text`` (UTF-8 without NUL),
    or None. For the messages of a reader given another format's file."""
    with open(path, "rb") as f:
        head = f.read(512)
    for sig, fmt in SIGNATURES.items():
        if head.startswith(sig):
            return fmt
    if not head:
        return "empty"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not only a character cut at the 512th byte
            return None
    return None if b"\0" in head else "text"


def with_article(word: str) -> str:
    """``an atoms``, ``a gmm``: the indefinite article of a file kind."""
    return ("an " if str(word)[:1].lower() in "aeiou" else "a ") + str(word)


def _short(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__

"""All of a command's outputs or none: temporaries renamed together, or all removed.

Every writer goes through :func:`atomic_output`: the file (or folder) is written as
``.<name>.fedalign-tmp-<pid>-<random><suffix>`` next to the output
(:data:`~fedalign.files.outputs.TMP_MARK`). Inside :func:`atomic_outputs` (every CLI command
runs in one) the temporaries are renamed together when the block ends and no signal is
pending, or all removed on any failure, SIGINT and SIGTERM included
(:mod:`fedalign.interrupt`). Work that reads its own intermediate files is written in a
:func:`staging_folder` and moved in as one transaction (:func:`move_in`); :func:`after_commit`
runs what must wait for the renames. The checks before any work, and the removal of what a
killed run left, are :mod:`fedalign.files.outputs`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path
from typing import Iterator

from fedalign.errors import FedalignError
from fedalign.files.outputs import TMP_MARK, _ACTIVE, _keys, _not_special, _remove, remove_stale

_TX: list = []  # stack of open transactions (:func:`atomic_outputs`)


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

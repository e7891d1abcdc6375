"""What to extract: an image listing in a deterministic order.

:func:`list_images` turns an input into an :class:`ImageList` (paths, ids, labels, class
names): an ImageFolder tree (one sub-folder per class, sorted), a flat or nested folder of
unlabeled images, or a text/CSV list of paths with optional labels (kept in the list's order,
:func:`read_list_file`).
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError, spell
from fedalign.files import MAX_CLASSES

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)
LIST_SUFFIXES = frozenset({".txt", ".csv", ".tsv", ".lst"})


@dataclass
class ImageList:
    """What to extract, in output order.

    Attributes
    ----------
    paths : list of Path
        Files to read, (n,).
    ids : list of str
        Row identifiers, (n,): paths relative to the input root, POSIX separators.
    labels : ndarray of int64, (n,)
        Class index per row, -1 for unlabeled.
    class_names : list of str
        (C,), label order.
    source : str
        The input as given.
    """

    paths: list
    ids: list
    labels: np.ndarray
    class_names: list = field(default_factory=list)
    source: str = ""

    def __len__(self) -> int:
        return len(self.paths)

    def sha256(self) -> str:
        """Hash of the listing (ids, labels, class names): equal listings, equal hash."""
        payload = json.dumps(
            {"ids": list(self.ids), "labels": [int(v) for v in self.labels],
             "class_names": list(self.class_names)},
            sort_keys=True, separators=(",", ":"),
        )
        return hashlib.sha256(payload.encode()).hexdigest()


def is_image(path: Path) -> bool:
    """True for a regular file with a known image extension (case-insensitive)."""
    return path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()


def _images_under(folder: Path) -> list:
    """All image files below ``folder`` (recursive, hidden entries skipped), sorted by relative path."""
    found = [p for p in folder.rglob("*")
             if is_image(p) and not any(s.startswith(".") for s in p.relative_to(folder).parts)]
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def list_images(source, unlabeled: bool = False, root=None) -> ImageList:
    """List the images of ``source`` in a deterministic order.

    Parameters
    ----------
    source : path
        A folder (ImageFolder layout, or any images with ``unlabeled``) or a list file
        (``.txt``/``.csv``/``.tsv``/``.lst``; see :func:`read_list_file`).
    unlabeled : bool
        Ignore class structure and labels: every row gets label -1.
    root : path, optional
        For list files: folder that relative paths are resolved against (default: the list
        file's folder).
    """
    src = Path(source)
    if not src.exists():
        raise FedalignError(f"no such input: {src}")
    if src.is_dir():
        if root is not None:
            raise FedalignError("root applies to list files only")
        return _list_folder(src, unlabeled)
    if src.suffix.lower() not in LIST_SUFFIXES:
        raise FedalignError(
            f"{src}: expected a folder of images or a list file ({', '.join(sorted(LIST_SUFFIXES))})"
        )
    return read_list_file(src, unlabeled=unlabeled, root=root)


def _list_folder(folder: Path, unlabeled: bool) -> ImageList:
    if unlabeled:
        paths = _images_under(folder)
        if not paths:
            raise FedalignError(f"no images found in {folder}")
        ids = [p.relative_to(folder).as_posix() for p in paths]
        return ImageList(paths, ids, np.full(len(paths), -1, dtype=np.int64), [], str(folder))
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = [p.name for p in folder.iterdir() if is_image(p)]
    if not classes:
        raise FedalignError(
            f"{folder} has no class sub-folders (ImageFolder layout); "
            f"use {spell('unlabeled', True)} for a folder of unlabeled images"
        )
    if loose:
        raise FedalignError(
            f"{folder} mixes class sub-folders with loose images (e.g. {loose[0]}); "
            f"use {spell('unlabeled', True)} or move them into a class folder"
        )
    paths, labels = [], []
    for c, name in enumerate(classes):
        files = _images_under(folder / name)
        paths += files
        labels += [c] * len(files)
    if not paths:
        raise FedalignError(f"no images found in the class folders of {folder}")
    ids = [p.relative_to(folder).as_posix() for p in paths]
    return ImageList(paths, ids, np.asarray(labels, dtype=np.int64), classes, str(folder))


def read_list_file(path, unlabeled: bool = False, root=None) -> ImageList:
    """Read a list of image paths with optional labels; rows keep the file's order.

    Format: one image per line, ``path`` or ``path<sep>label`` with ``<sep>`` a comma
    (``.csv``), a tab (``.tsv``) or, for ``.txt``/``.lst``, a comma, tab or whitespace.
    Blank lines and lines starting with ``#`` are ignored; a first line ``path[,label]``
    is a header. Labels are all integers (class names become ``"0" … str(max)``) or all class
    names (sorted to give the label order). Either every row has a label or none does.
    ``ids`` are the paths as written (relative paths resolve against ``root``, default the
    list file's folder).
    """
    path = Path(path)
    base = Path(root) if root is not None else path.parent
    if not base.is_dir():
        raise FedalignError(f"root is not a folder: {base}")
    rows = _parse_list(path)
    if rows and rows[0][0].strip().lower() in ("path", "file", "filename", "image"):
        rows = rows[1:]
    if not rows:
        raise FedalignError(f"{path}: the list is empty")
    has_label = {len(r) == 2 for r in rows}
    if len(has_label) != 1:
        raise FedalignError(f"{path}: either every row has a label or none does")
    ids = [r[0] for r in rows]
    dup = _first_duplicate(ids)
    if dup is not None:
        raise FedalignError(f"{path}: '{dup}' is listed twice")
    paths = [Path(i) if Path(i).is_absolute() else base / i for i in ids]
    n = len(ids)
    if unlabeled or has_label == {False}:
        labels, classes = np.full(n, -1, dtype=np.int64), []
    else:
        raw = [r[1] for r in rows]
        if all(_is_int(v) for v in raw):
            values = [int(v) for v in raw]
            if min(values) < 0:
                raise FedalignError(f"{path}: negative label {min(values)} (use "
                                    f"{spell('unlabeled', True)})")
            if max(values) >= MAX_CLASSES:
                raise FedalignError(f"{path}: label {max(values)} is beyond the {MAX_CLASSES:,} "
                                    "classes a features file may have: integer labels are "
                                    "class indices 0…C−1")
            labels = np.asarray(values, dtype=np.int64)
            classes = [str(c) for c in range(int(labels.max()) + 1)]
        else:
            classes = sorted(set(raw))
            index = {c: k for k, c in enumerate(classes)}
            labels = np.asarray([index[v] for v in raw], dtype=np.int64)
    return ImageList(paths, ids, labels, classes, str(path))


def _parse_list(path: Path) -> list:
    try:
        text = path.read_text(encoding="utf-8-sig")  # (a BOM, as spreadsheet tools write)
    except (OSError, UnicodeDecodeError) as e:
        raise FedalignError(f"cannot read list file {path} ({e})") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        delim = "," if suffix == ".csv" else "\t"
        rows = [[c.strip() for c in r] for r in csv.reader(lines, delimiter=delim)]
    else:
        rows = []
        for ln in lines:
            for sep in ("\t", ","):
                if sep in ln:
                    rows.append([c.strip() for c in ln.rsplit(sep, 1)])
                    break
            else:
                rows.append(ln.strip().rsplit(None, 1) if len(ln.split()) > 1 else [ln.strip()])
    for k, r in enumerate(rows):
        if not 1 <= len(r) <= 2 or not r[0] or (len(r) == 2 and not r[1]):
            raise FedalignError(f"{path}: line {k + 1}: expected 'path' or 'path,label', got {r}")
    return rows


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _first_duplicate(items):
    seen = set()
    for x in items:
        if x in seen:
            return x
        seen.add(x)
    return None

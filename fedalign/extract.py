"""Images → features: a frozen encoder over an image listing, written to a features ``.h5``.

Pipeline
--------
1. :func:`list_images` turns an input into an :class:`ImageList` (paths, ids, labels, class
   names) in a deterministic order: an ImageFolder tree (one sub-folder per class, sorted), a
   flat or nested folder of unlabeled images, or a text/CSV list of paths with optional labels
   (kept in the list's order).
2. :func:`extract_features` decodes images in DataLoader worker processes (decoding overlaps
   the forward pass), applies timm's eval transform for the model, runs the frozen encoder in
   ``torch.inference_mode()`` and writes pooled pre-logits features.
3. Writing is resumable: committed batches go to ``.<output name>.partial.h5`` next to the
   output, flushed after every batch. Batches are aligned to a fixed grid (batch k holds
   listing rows ``[kB, (k+1)B)``), so a resumed run forms exactly the batches an uninterrupted
   one does and produces the same numbers. At the end the final file is written from the
   partial one with :class:`fedalign.files.FeatureWriter` inside
   :func:`fedalign.files.atomic_output`, and the partial file is removed.

A corrupt or unreadable image raises a :class:`FedalignError` naming the file; with
``skip_bad=True`` it is left out and listed in the ``skipped`` attribute of the output.
No image is ever replaced by another one.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)
LIST_SUFFIXES = frozenset({".txt", ".csv", ".tsv", ".lst"})
PARTIAL_FORMAT = 1


# --------------------------------------------------------------------------------------------
# Listing inputs
# --------------------------------------------------------------------------------------------


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
            raise FedalignError("--root applies to list files only")
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
            "use --unlabeled for a folder of unlabeled images"
        )
    if loose:
        raise FedalignError(
            f"{folder} mixes class sub-folders with loose images (e.g. {loose[0]}); "
            "use --unlabeled or move them into a class folder"
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
        raise FedalignError(f"--root is not a folder: {base}")
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
            labels = np.asarray([int(v) for v in raw], dtype=np.int64)
            if labels.min() < 0:
                raise FedalignError(f"{path}: negative label {labels.min()} (use --unlabeled)")
            classes = [str(c) for c in range(int(labels.max()) + 1)]
        else:
            classes = sorted(set(raw))
            index = {c: k for k, c in enumerate(classes)}
            labels = np.asarray([index[v] for v in raw], dtype=np.int64)
    return ImageList(paths, ids, labels, classes, str(path))


def _parse_list(path: Path) -> list:
    try:
        text = path.read_text()
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


# --------------------------------------------------------------------------------------------
# Decoding (runs in DataLoader workers)
# --------------------------------------------------------------------------------------------


def decode_image(path) -> tuple:
    """Read and decode one image to RGB.

    Returns
    -------
    image : PIL.Image.Image
        RGB (grayscale, palette and alpha images are converted).
    sha256 : str
        Hex SHA-256 of the file's bytes.

    Raises
    ------
    OSError, ValueError, PIL.UnidentifiedImageError
        for unreadable, truncated or corrupt files (PIL's ``LOAD_TRUNCATED_IMAGES`` stays off).
    """
    from PIL import Image

    data = Path(path).read_bytes()
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        rgb = im.convert("RGB")
    return rgb, hashlib.sha256(data).hexdigest()


class ImageDataset:
    """Map-style dataset over an :class:`ImageList`: item ``i`` → ``(i, tensor|None, sha, error)``.

    Failures are returned, not raised, so the main process decides (error or skip) and names
    the file; nothing is substituted for a bad image.
    """

    def __init__(self, paths, transform):
        self.paths = [str(p) for p in paths]
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        try:
            img, sha = decode_image(self.paths[i])
            return i, self.transform(img), sha, None
        except Exception as e:  # noqa: BLE001 - any decoder failure is reported by name
            msg = str(e).splitlines()[0] if str(e) else ""
            return i, None, "", f"{type(e).__name__}: {msg}".rstrip(": ")


def collate(items):
    """Batch decoded items: ``(indices (m,), images (m', 3, H, W) or None, shas, errors)``.

    ``errors`` maps a listing index to its error message; ``images`` holds only good items.
    """
    import torch

    idx = [it[0] for it in items]
    good = [it for it in items if it[3] is None]
    x = torch.stack([it[1] for it in good]) if good else None
    return idx, x, [it[2] for it in good], {it[0]: it[3] for it in items if it[3] is not None}


# --------------------------------------------------------------------------------------------
# Devices, precision, threads
# --------------------------------------------------------------------------------------------


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; ``cuda`` without a GPU is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FedalignError("--device cuda: no CUDA device is available")
    if device != "cpu" and not device.startswith("cuda"):
        raise FedalignError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    return device


def default_batch_size(device: str) -> int:
    """64 on CPU (no gain beyond); 256 on a GPU (fills a modern device for small encoders)."""
    return 256 if device.startswith("cuda") else 64


def default_workers(device: str) -> int:
    """Decoding processes: ``cores − 1`` (at least 1), at most 16 with a GPU and 8 on CPU.

    On a GPU, decoding is the bottleneck for small encoders, so every spare core decodes; on
    CPU the forward pass needs the cores too and one decoder per spare core is plenty.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    spare = max(1, (cores or 1) - 1)
    return min(16, spare) if device.startswith("cuda") else min(8, spare)


_DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def autocast_context(device: str, precision: str):
    """``torch.autocast`` for bf16/fp16, a null context for fp32."""
    import contextlib

    import torch

    if precision not in _DTYPES:
        raise FedalignError(f"--precision must be fp32, bf16 or fp16, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, _DTYPES[precision]))


def set_determinism(device: str) -> None:
    """Deterministic kernels (warn-only for ops without one); no cuDNN autotuning."""
    import torch

    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


# --------------------------------------------------------------------------------------------
# The partial (resumable) file
# --------------------------------------------------------------------------------------------


def partial_path(output) -> Path:
    """Deterministic temporary file next to ``output``: ``.<name>.partial.h5``."""
    output = Path(output)
    return output.with_name(f".{output.name}.partial.h5")


class PartialStore:
    """Committed batches of an extraction, flushed after every batch.

    Layout: datasets ``features`` (r, d) float32, ``index`` (r,) listing index per row,
    ``sha256`` (r,) file hash per row; attrs ``fingerprint`` (JSON of everything that
    determines the numbers), ``skipped`` (JSON list of ``[index, error]``), and the commit
    record ``rows`` / ``next`` written last, so anything after the last commit is discarded
    on reopening.
    """

    def __init__(self, path, d: int, fingerprint: dict, batch_rows: int):
        import h5py

        self.path = Path(path)
        self.fp = json.dumps(fingerprint, sort_keys=True)
        self.resumed = False
        self.discarded = None  # why an existing partial file was not resumed
        self.rows, self.next, self.skipped = 0, 0, []
        h5 = None
        if self.path.exists():
            try:
                h5 = h5py.File(self.path, "r+")
                if h5.attrs.get("fingerprint") != self.fp or h5.attrs.get("partial_format") != PARTIAL_FORMAT:
                    h5.close()
                    h5 = None
                    self.discarded = "it was made with other settings or inputs"
            except Exception:  # noqa: BLE001 - a damaged partial file is started over
                h5 = None
                self.discarded = "it is damaged"
        if h5 is not None:
            self.rows, self.next = int(h5.attrs["rows"]), int(h5.attrs["next"])
            self.skipped = [s for s in json.loads(h5.attrs["skipped"]) if s[0] < self.next]
            for name in ("features", "index", "sha256"):
                h5[name].resize(self.rows, axis=0)
            self.resumed = self.next > 0
        else:
            self.path.unlink(missing_ok=True)
            h5 = h5py.File(self.path, "w")
            h5.attrs["partial_format"] = PARTIAL_FORMAT
            h5.attrs["fingerprint"] = self.fp
            rows = max(1, batch_rows)
            h5.create_dataset("features", (0, d), maxshape=(None, d), dtype=np.float32, chunks=(rows, d))
            h5.create_dataset("index", (0,), maxshape=(None,), dtype=np.int64, chunks=(rows,))
            h5.create_dataset("sha256", (0,), maxshape=(None,), dtype="S64", chunks=(rows,))
            self._commit_attrs(h5)
            h5.flush()
        self._h5 = h5

    def _commit_attrs(self, h5):
        h5.attrs["skipped"] = json.dumps(self.skipped)
        h5.attrs["rows"] = self.rows
        h5.attrs["next"] = self.next

    def commit(self, X, index, shas, skipped, next_index: int) -> None:
        """Append one batch's rows and skipped items; record the new resume point."""
        h5, m = self._h5, len(index)
        if m:
            for name, val in (("features", X), ("index", index), ("sha256", shas)):
                h5[name].resize(self.rows + m, axis=0)
                h5[name][self.rows:] = val
        self.rows += m
        self.skipped += [[int(i), str(e)] for i, e in skipped]
        self.next = int(next_index)
        self._commit_attrs(h5)
        h5.flush()

    def iter_blocks(self, rows: int = 8192):
        """Yield ``(X, index, sha256)`` blocks of the committed rows."""
        h5 = self._h5
        for s in range(0, self.rows, rows):
            e = min(self.rows, s + rows)
            yield (np.asarray(h5["features"][s:e]), np.asarray(h5["index"][s:e]),
                   [v.decode() for v in h5["sha256"][s:e]])

    def close(self):
        self._h5.close()


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------


@dataclass
class ExtractResult:
    """Summary of one extraction: rows written, feature width, skipped files, timing."""

    output: Path
    n: int
    d: int
    skipped: list
    seconds: float
    resumed_from: int
    images_per_second: float


def extract_features(
    images: ImageList,
    output,
    model: str = "tf_efficientnet_lite0",
    weights: str = "builtin",
    batch_size: int = 0,
    device: str = "auto",
    precision: str = "fp32",
    workers: int = -1,
    threads: int = 0,
    skip_bad: bool = False,
    seed: int = 0,
    image_size: int = 0,
    progress=None,
    log=None,
) -> ExtractResult:
    """Extract pooled pre-logits features of ``images`` into the features file ``output``.

    Parameters
    ----------
    images : ImageList
        From :func:`list_images`; its order is the output order.
    output : path
        Features ``.h5`` to write (kind ``features``). Any partial file from an interrupted
        run with the same settings is resumed.
    model, weights, seed, image_size
        Encoder (see :func:`fedalign.encoders.create_encoder`).
    batch_size : int
        Images per forward pass; 0 = :func:`default_batch_size`.
    device : str
        ``auto``, ``cpu`` or ``cuda[:N]``.
    precision : str
        ``fp32``, ``bf16`` or ``fp16`` (autocast; features are stored as float32).
    workers : int
        DataLoader decoding processes; -1 = :func:`default_workers`, 0 = decode in-process.
    threads : int
        ``torch.set_num_threads`` for the forward pass; 0 keeps torch's default.
    skip_bad : bool
        Leave unreadable images out and list them in the ``skipped`` attribute instead of
        failing.
    progress : callable, optional
        Called with the number of listing rows finished after every batch.
    log : callable, optional
        Called with one-line messages (resume notices).

    Returns
    -------
    ExtractResult
    """
    import torch
    from timm.data import create_transform

    from fedalign import __version__
    from fedalign.encoders import create_encoder
    from fedalign.files import FeatureWriter, after_commit, atomic_output

    log = log or (lambda msg: None)
    output = Path(output)
    if not output.parent.is_dir() and str(output.parent):
        raise FedalignError(f"output folder does not exist: {output.parent}")
    if len(images) == 0:
        raise FedalignError("no images to extract")
    dev = resolve_device(device)
    bs = int(batch_size) or default_batch_size(dev)
    if bs < 1:
        raise FedalignError(f"--batch-size must be positive, got {batch_size}")
    nw = default_workers(dev) if workers < 0 else int(workers)
    autocast_context(dev, precision)  # validates precision early
    if threads > 0:
        torch.set_num_threads(int(threads))
    set_determinism(dev)

    enc = create_encoder(model, weights, seed=seed, image_size=image_size)
    transform = create_transform(**enc.data_config, is_training=False)
    fingerprint = {
        "model": enc.name, "weights": enc.info, "data_config": enc.data_config,
        "precision": precision, "device": dev.split(":")[0], "batch_size": bs,
        "listing_sha256": images.sha256(), "skip_bad": bool(skip_bad),
        "torch": torch.__version__, "timm": _timm_version(),
    }
    t0 = time.perf_counter()
    part = PartialStore(partial_path(output), enc.num_features, fingerprint, bs)
    if part.discarded:
        log(f"starting {output.name} over: the partial file {part.path.name} was not resumed "
            f"because {part.discarded}")
    try:
        start = part.next
        if part.resumed:
            log(f"resuming {output.name} at image {start} of {len(images)} ({part.rows} rows kept)")
            if progress is not None:
                progress(start)
        if start < len(images):
            _run_batches(enc, transform, images, part, start, bs, dev, precision, nw,
                         skip_bad, progress)
        provenance = {
            "producer": f"fedalign {__version__} extract",
            "source": images.source,
            "n_inputs": len(images),
            "inputs_sha256": _inputs_sha256(part),
            **fingerprint,
        }
        skipped = [{"id": images.ids[i], "error": e} for i, e in part.skipped]
        with atomic_output(output, suffix=".tmp.h5") as tmp:
            with FeatureWriter(tmp, enc.num_features, images.class_names, provenance,
                               expected_rows=max(part.rows, 1)) as w:
                for X, idx, _ in part.iter_blocks():
                    w.append(X, images.labels[idx], [images.ids[i] for i in idx])
                w.set_attr("skipped", skipped)
        n, d = part.rows, enc.num_features
    except FedalignError:
        # Bad input: leave nothing behind. (An interruption keeps the partial file to resume.)
        part.close()
        part.path.unlink(missing_ok=True)
        raise
    finally:
        part.close()
    # the resume file goes once the output is in place (at the end of the CLI's transaction)
    after_commit(lambda: part.path.unlink(missing_ok=True))
    secs = time.perf_counter() - t0
    done = len(images) - start
    return ExtractResult(output, n, d, skipped, secs, start, done / secs if secs > 0 else 0.0)


def _run_batches(enc, transform, images, part, start, bs, dev, precision, nw, skip_bad, progress):
    """Decode (workers) → forward → commit, one grid-aligned batch at a time."""
    import torch
    from torch.utils.data import DataLoader, Subset

    cuda = dev.startswith("cuda")
    model = enc.model.to(dev)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    ds = Subset(ImageDataset(images.paths, transform), range(start, len(images)))
    loader = DataLoader(
        ds, batch_size=bs, shuffle=False, num_workers=nw, collate_fn=collate,
        pin_memory=cuda, persistent_workers=False,
        prefetch_factor=(4 if nw > 0 else None),
    )
    with torch.inference_mode():
        for idx, x, shas, errors in loader:
            if errors and not skip_bad:
                i = min(errors)
                raise FedalignError(
                    f"cannot read image {images.paths[i]} ({errors[i]}); "
                    "fix or remove it, or use --skip-bad to leave bad images out"
                )
            good = [i for i in idx if i not in errors]
            feats = np.empty((0, enc.num_features), dtype=np.float32)
            if x is not None:
                if cuda:
                    x = x.to(dev, non_blocking=True, memory_format=torch.channels_last)
                with autocast_context(dev, precision):
                    y = model(x)
                feats = y.float().cpu().numpy()
                if feats.shape != (len(good), enc.num_features):
                    raise RuntimeError(f"encoder output {feats.shape}, expected (m, {enc.num_features})")
                if not np.all(np.isfinite(feats)):
                    bad = good[int(np.flatnonzero(~np.isfinite(feats).all(axis=1))[0])]
                    raise FedalignError(
                        f"non-finite features for {images.paths[bad]} "
                        f"(precision {precision}; try --precision fp32)"
                    )
            part.commit(feats, np.asarray(good, dtype=np.int64), shas,
                        sorted(errors.items()), idx[-1] + 1)
            if progress is not None:
                progress(len(idx))


def _inputs_sha256(part: PartialStore) -> str:
    """SHA-256 over the per-file hashes of the rows written, in output order."""
    h = hashlib.sha256()
    for _, _, shas in part.iter_blocks():
        for s in shas:
            h.update(s.encode())
    return h.hexdigest()


def _timm_version() -> str:
    import timm

    return timm.__version__

"""Images → features: a frozen encoder over an image listing, written to a features ``.h5``.

Modules: :mod:`~fedalign.extract.listing` (what to extract), :mod:`~fedalign.extract.decoding`
(images in worker processes), :mod:`~fedalign.extract.device` (device, precision, workers),
:mod:`~fedalign.extract.store` (the resumable partial file); this module is the loop.

Pipeline
--------
1. :func:`list_images` turns an input into an :class:`ImageList` (paths, ids, labels, class
   names) in a deterministic order: an ImageFolder tree (one sub-folder per class, sorted), a
   flat or nested folder of unlabeled images, or a text/CSV list of paths with optional labels
   (kept in the list's order).
2. :func:`extract_features` decodes images in DataLoader worker processes (decoding overlaps
   the forward pass), applies timm's eval transform for the model, runs the frozen encoder in
   ``torch.inference_mode()`` and writes pooled pre-logits features. :func:`load_encoder`
   creates the encoder once for several listings (``extract_features(..., encoder=...)``).
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

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError, spell
from fedalign.extract.decoding import ImageDataset, collate, decode_image
from fedalign.extract.device import (autocast_context, default_batch_size, default_workers,
                                     resolve_device, retain_freed_memory, set_determinism)
from fedalign.extract.listing import (IMAGE_EXTENSIONS, LIST_SUFFIXES, ImageList, is_image,
                                      list_images, read_list_file)
from fedalign.extract.store import PARTIAL_FORMAT, PartialStore, partial_path

__all__ = [
    "IMAGE_EXTENSIONS", "LIST_SUFFIXES", "PARTIAL_FORMAT", "ExtractResult", "ImageDataset",
    "ImageList", "LoadedEncoder", "PartialStore", "autocast_context", "collate", "decode_image",
    "default_batch_size", "default_workers", "extract_features", "is_image", "list_images",
    "load_encoder", "output_paths", "partial_path", "read_list_file", "resolve_device",
    "retain_freed_memory", "set_determinism",
]



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


@dataclass
class LoadedEncoder:
    """A frozen encoder ready to extract, shared by several :func:`extract_features` calls.

    Attributes
    ----------
    encoder : fedalign.encoders.Encoder
        The timm model (``model(x)``: (B, 3, H, W) → (B, d)), its name, d, data config and
        weights provenance.
    transform : callable
        timm's eval transform for ``encoder.data_config`` (PIL image → (3, H, W) tensor).
    device : str
        Resolved device (``cpu``, ``cuda``, ``cuda:N``).
    precision : str
        ``fp32``, ``bf16`` or ``fp16`` (validated).
    """

    encoder: object
    transform: object
    device: str
    precision: str


def load_encoder(
    model: str = "tf_efficientnet_lite0",
    weights: str = "builtin",
    seed: int = 0,
    image_size: int = 0,
    device: str = "auto",
    precision: str = "fp32",
    threads: int = 0,
    log=None,
) -> LoadedEncoder:
    """Create the encoder and its eval transform once, for one or several listings.

    Parameters are those of :func:`extract_features`. Sets the process-wide torch state the
    extraction relies on: ``torch.set_num_threads(threads)`` (when > 0) and deterministic
    kernels (:func:`set_determinism`). Features computed with one :class:`LoadedEncoder` are
    the same numbers as with a fresh one per listing: the model is frozen, in eval mode, and
    nothing of a listing is kept in it.

    Returns
    -------
    LoadedEncoder
    """
    import torch
    from timm.data import create_transform

    from fedalign.encoders import create_encoder

    log = log or (lambda msg: None)
    dev = resolve_device(device)
    autocast_context(dev, precision)  # validates precision early
    if threads > 0:
        torch.set_num_threads(int(threads))
    set_determinism(dev)
    t_load = time.perf_counter()
    log(f"loading {model} ({weights} weights) on {dev} …")
    enc = create_encoder(model, weights, seed=seed, image_size=image_size)
    transform = create_transform(**enc.data_config, is_training=False)
    log(f"model ready: d={enc.num_features}, input {tuple(enc.data_config.get('input_size', ()))} "
        f"({time.perf_counter() - t_load:.1f} s)")
    return LoadedEncoder(enc, transform, dev, precision)


def output_paths(sources, folder) -> list:
    """``folder/<name>.h5`` per input: the folder's name, or a list file's stem
    (``mnist.csv`` → ``mnist``); two inputs of one name are an error naming both."""
    folder, outs, seen = Path(folder), [], {}
    for src in map(Path, sources):
        is_list = src.suffix.lower() in LIST_SUFFIXES and not src.is_dir()
        name = (src.stem if is_list else src.name) or src.resolve().name
        if name in seen:
            raise FedalignError(f"inputs {seen[name]} and {src} would both write "
                                f"{folder / (name + '.h5')}: rename one, or extract them in "
                                "separate runs")
        seen[name] = src
        outs.append(folder / f"{name}.h5")
    return outs


def _never_over_an_image(paths, outputs) -> None:
    """Refuse an output that is one of the images read (``-o imgs/c0/i0.png``, any spelling:
    the same file). An output that does not exist yet cannot be one, so only an existing
    output is compared, by (st_dev, st_ino) with every image: one stat each."""
    import os

    for out in map(Path, outputs):
        try:
            st = os.stat(out)
        except OSError:
            continue
        for p in paths:
            try:
                s = os.stat(p)
            except OSError:
                continue
            if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
                raise FedalignError(f"output {out} is also an input image ({p}): refusing to "
                                    "overwrite an input; give another output name")


#: Largest batch: 65,536 images of 224² are 37 GiB of float32 input.
MAX_BATCH = 65_536


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
    encoder: LoadedEncoder | None = None,
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
        Called with one-line messages (model loading, resume notices).
    encoder : LoadedEncoder, optional
        From :func:`load_encoder`, to extract several listings with one model; then
        ``model``, ``weights``, ``seed``, ``image_size``, ``device``, ``precision`` and
        ``threads`` are the encoder's and the arguments given here are ignored. The output
        (numbers, provenance, resumability) is the same as without it.

    Returns
    -------
    ExtractResult
    """
    import torch

    from fedalign.version import __version__
    from fedalign.files import FeatureWriter, after_commit, atomic_output

    log = log or (lambda msg: None)
    output = Path(output)
    if not output.parent.is_dir() and str(output.parent):
        raise FedalignError(f"output folder does not exist: {output.parent}")
    if len(images) == 0:
        raise FedalignError("no images to extract")
    _never_over_an_image(images.paths, [output, partial_path(output)])
    dev = encoder.device if encoder is not None else resolve_device(device)
    bs = int(batch_size) or default_batch_size(dev)
    if not 1 <= bs <= MAX_BATCH:
        raise FedalignError(f"batch_size must be between 1 and {MAX_BATCH:,} (or 0: the "
                            f"device's default), got {batch_size}", param="batch_size")
    nw = default_workers(dev) if workers < 0 else int(workers)
    if encoder is None:
        encoder = load_encoder(model, weights, seed=seed, image_size=image_size, device=dev,
                               precision=precision, threads=threads, log=log)
    enc, transform, precision = encoder.encoder, encoder.transform, encoder.precision
    log(f"{output.name}: {len(images)} images in batches of {bs}, {nw} decoding workers")
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
            with retain_freed_memory():  # activations' pages reused, not faulted in per batch
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
    """Decode (workers) → forward → commit, one grid-aligned batch at a time.

    On CUDA (only there): channels-last weights and inputs, pinned host batches copied with
    ``non_blocking``, and the features of batch k copied back (non-blocking, into pinned
    memory) while batch k+1 is decoded and launched; batch k is committed once its copy has
    finished, so the GPU never waits on the HDF5 write. On the CPU the loop is unchanged.
    """
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
    def finish(pending):
        """Check and commit one batch whose features are (being) copied to the host."""
        idx, good, shas, errors, y, event = pending
        feats = np.empty((0, enc.num_features), dtype=np.float32)
        if y is not None:
            if event is not None:
                event.synchronize()
            feats = y.numpy()
            if feats.shape != (len(good), enc.num_features):
                raise RuntimeError(f"encoder output {feats.shape}, expected (m, {enc.num_features})")
            if not np.all(np.isfinite(feats)):
                bad = good[int(np.flatnonzero(~np.isfinite(feats).all(axis=1))[0])]
                raise FedalignError(
                    f"non-finite features for {images.paths[bad]} "
                    f"(precision {precision}; try precision fp32)"
                )
        part.commit(feats, np.asarray(good, dtype=np.int64), shas,
                    sorted(errors.items()), idx[-1] + 1)
        if progress is not None:
            progress(len(idx))

    pending = None
    with torch.inference_mode():
        for idx, x, shas, errors in loader:
            if errors and not skip_bad:
                i = min(errors)
                raise FedalignError(
                    f"cannot read image {images.paths[i]} ({errors[i]}); "
                    f"fix or remove it, or use {spell('skip_bad', True)} to leave bad images out"
                )
            good = [i for i in idx if i not in errors]
            y, event = None, None
            if x is not None:
                if cuda:
                    x = x.to(dev, non_blocking=True, memory_format=torch.channels_last)
                with autocast_context(dev, precision):
                    y = model(x)
                if cuda:
                    host = torch.empty(y.shape, dtype=torch.float32, pin_memory=True)
                    host.copy_(y.float(), non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
                    y = host
                else:
                    y = y.float().cpu()
            if pending is not None:
                finish(pending)
            pending = (idx, good, shas, errors, y, event)
            if not cuda:
                finish(pending)
                pending = None
        if pending is not None:
            finish(pending)


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

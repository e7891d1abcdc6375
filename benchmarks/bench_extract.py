"""``extract`` against a plain timm loop in the same process: images/s and the user/system split.

For each torch thread count (``--threads 1 2``), in one process and on the same images:

* extract: :func:`fedalign.extract.extract_features` (decoding workers → timm's eval transform →
  frozen encoder → resumable partial file → features ``.h5``), with the encoder from
  :func:`fedalign.extract.load_encoder` (``--weights builtin``: no download);
* plain: the loop anyone would write with timm — ``PIL.Image.open(p).convert("RGB")`` → the
  same transform → ``model(x)`` in batches of the same size under ``torch.inference_mode()``,
  in the main process;
* plain+retain: the same loop inside :func:`fedalign.extract.retain_freed_memory` (the fix of
  issue 29 applied to the plain loop: the forward's own ceiling).

Printed per run: images/s, user and system CPU seconds of the process (``RUSAGE_SELF``) and of
the decoding workers (``RUSAGE_CHILDREN``, once they are joined), sys/user over both, minor and
major page faults, and extract's images/s over each plain loop's. The plain loop's features are
checked equal to the file's (``np.array_equal``). A warm-up forward of each batch shape comes
first, so neither side pays oneDNN's kernel generation.

    python benchmarks/bench_extract.py /work/shared/data/office_caltech10/images/dslr
    python benchmarks/bench_extract.py IMAGES --threads 1 2 --workers 1 --batch-size 64
    python benchmarks/bench_extract.py --raw [--images IMAGES]   # extract vs raw forward on
                                                                 # pre-decoded tensors (GPU check)

Measured (issue 29) on the 2-core machine while another job kept about one core busy (load
average 2-3, so walls and the 2-thread rows are noisy), ``nice -n 19``, tf_efficientnet_lite0
builtin weights, batch 64, 1 decoding worker, CPU. ``dslr`` (157 JPEGs of 1000×1000):

    threads run            img/s  user s  sys s  wk user  wk sys  sys/user  minflt     extract/this
    before (fedalign at main; "plain+retain" is the plain loop again there)
          1 extract         15.2    2.53   6.09     1.29    0.16      1.63  3,650,577
          1 plain           15.7    3.84   5.92                       1.54  3,662,957   0.97
          2 extract          7.9   11.34   6.38     1.45    0.20      0.51  3,774,989
          2 plain            6.2   18.55   6.19                       0.33  3,741,132   1.28
    after (retain_freed_memory around the forward loop)
          1 extract         29.3    2.63   0.73     1.72    0.20      0.21    384,359
          1 plain           13.6    4.21   7.01                       1.67  4,023,857   2.16
          1 plain+retain    30.7    4.34   0.52                       0.12    339,481   0.95
          2 extract         21.4    4.84   0.73     1.43    0.22      0.15    419,810
          2 plain            6.3   18.93   5.80                       0.31  3,834,728   3.40
          2 plain+retain    17.0    8.41   0.55                       0.07    366,781   1.26

The dslr table ran with OpenMP's default (spinning) wait policy; the script now sets
``OMP_WAIT_POLICY=PASSIVE`` as the CLI does. With it, after, ``amazon`` (958 images):

    threads run            img/s  user s  sys s  wk user  wk sys  sys/user  minflt      extract/this
          1 extract         51.6   14.90   0.87     2.04    0.45      0.08     589,154
          1 plain           16.9   16.87  38.32                       2.27  23,474,390   3.04
          1 plain+retain    53.5   17.09   0.57                       0.03     404,430   0.96
          2 extract         52.5   14.36   1.16     2.04    0.45      0.10     524,777
          2 plain           16.1   17.76  40.28                       2.27  22,285,065   3.25
          2 plain+retain    49.7   17.88   0.90                       0.05     347,266   1.06

(spinning, 2 threads: extract 27.4 img/s, plain+retain 77.2, ratio 0.36 — the decoding worker
and the spinning pool fight for 2 cores). The remaining faults are the heap's one growth per
listing (≈ 1.2 GB at batch 64) and the workers' shared-memory batches.

Where the system time went: a CPU forward of EfficientNet-Lite0 at batch 64 allocates ≈ 5 GB of
activations per batch (``F.pad`` of the TF-"same" convolutions fills a fresh tensor, most of the
faults), many over 32 MB — glibc's largest mmap threshold — so each was a fresh ``mmap`` freed by
``munmap`` and every page was faulted in (and zeroed) again: ≈ 1.2 M minor faults per batch.
``retain_freed_memory`` (glibc ``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` 2 GiB for the loop, defaults
restored after) makes the heap keep them. Thread spinning, HDF5 writes and the progress output
were not it (perf: 50 % of the faults in torch's fill kernel, the rest in oneDNN convolutions).
The whole CLI run over the four Office-Caltech10 folders (2,533 images, ``--threads 1 --workers
1``, ``/usr/bin/time -v``): before 2:44 wall, 53.6 s user, 104.5 s sys, 60.8 M faults; after
0:57 wall, 52.5 s user, 8.0 s sys (15 % of user), 2.9 M faults; the four files byte-identical
(``cmp``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def make_images(folder: Path, n: int, size: int, seed: int = 0) -> Path:
    """``n`` JPEGs of ``size``×``size`` (smooth random content, like photos) in 2 classes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        low = rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8)
        img = Image.fromarray(low).resize((size, size), Image.BILINEAR)
        d = folder / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        img.save(d / f"{i:05d}.jpg", quality=90)
    return folder


def raw_forward(enc, x, batch_size, n, device, precision, repeats=1) -> float:
    """Images/s of ``enc.model`` on in-memory tensors, ``n`` images in batches."""
    import torch

    from fedalign.extract import autocast_context

    model = enc.model.to(device)
    cuda = device.startswith("cuda")
    if cuda:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(device, memory_format=torch.channels_last)
    nb = max(1, n // batch_size)
    with torch.inference_mode(), autocast_context(device, precision):
        model(x)  # warm-up
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats * nb):
            y = model(x).float()
            if not cuda:
                y.numpy()
        if cuda:
            torch.cuda.synchronize()
    return repeats * nb * batch_size / (time.perf_counter() - t0)


def decode_cpu_per_image(paths, transform) -> float:
    """CPU seconds per image to decode + transform, single-threaded as in a worker (warmed up)."""
    import torch
    from PIL import Image

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    transform(Image.open(paths[0]).convert("RGB"))
    c0 = time.process_time()
    for p in paths:
        transform(Image.open(p).convert("RGB"))
    torch.set_num_threads(threads)
    return (time.process_time() - c0) / len(paths)


def forward_cpu_per_image(enc, x) -> float:
    """CPU seconds per image of one single-threaded forward pass (no spin-waiting threads)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.inference_mode():
        enc.model(x[:2])
        c0 = time.process_time()
        enc.model(x)
    torch.set_num_threads(threads)
    return (time.process_time() - c0) / len(x)


def raw_main(argv=None):
    """The former comparison: end-to-end extraction vs the encoder's forward on in-memory
    tensors (goal ≥ 0.85 on CPU with workers, ≥ 0.8 on a GPU at bf16)."""
    ap = argparse.ArgumentParser(description="end-to-end extract vs raw forward on pre-decoded tensors")
    ap.add_argument("--images", type=Path, help="ImageFolder to read (default: generated JPEGs)")
    ap.add_argument("--n", type=int, default=256, help="generated images (default 256)")
    ap.add_argument("--size", type=int, default=300, help="generated image side (default 300)")
    ap.add_argument("--model", default="tf_efficientnet_lite0")
    ap.add_argument("--weights", default="builtin")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--workers", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from PIL import Image
    from timm.data import create_transform

    from fedalign.encoders import create_encoder
    from fedalign.extract import default_workers, extract_features, list_images, resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    workers = default_workers(device) if args.workers < 0 else args.workers
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = args.images or make_images(tmp / "imgs", args.n, args.size)
        listing = list_images(folder)
        n = len(listing)
        enc = create_encoder(args.model, args.weights)
        t = create_transform(**enc.data_config)
        x = torch.stack([t(Image.open(p).convert("RGB")) for p in listing.paths[: args.batch_size]])
        decode_cpu = decode_cpu_per_image(listing.paths[: args.batch_size], t)
        if len(x) < args.batch_size:
            x = x.repeat((args.batch_size + len(x) - 1) // len(x), 1, 1, 1)[: args.batch_size]
        raw1 = raw_forward(enc, x, args.batch_size, n, device, args.precision)
        forward_cpu = forward_cpu_per_image(enc, x) if not device.startswith("cuda") else 0.0
        res = extract_features(listing, tmp / "f.h5", model=args.model, weights=args.weights,
                               batch_size=args.batch_size, device=device,
                               precision=args.precision, workers=workers)
        raw2 = raw_forward(enc, x, args.batch_size, n, device, args.precision)
    raw = (raw1 + raw2) / 2
    e2e = n / res.seconds
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    print(f"model={args.model} device={name} precision={args.precision} batch={args.batch_size} "
          f"n={n} workers={workers} torch_threads={torch.get_num_threads()}")
    print(f"raw forward on pre-decoded tensors: {raw:8.1f} img/s  (before {raw1:.1f}, after {raw2:.1f})")
    print(f"end-to-end extract (files → .h5):  {e2e:8.1f} img/s  ({res.seconds:.1f}s)")
    print(f"ratio end-to-end / raw: {e2e / raw:.2f}")
    if not device.startswith("cuda"):
        # On an otherwise idle CPU, decoding and the forward pass share the same cores, so
        # the best possible ratio is forward / (forward + decode) in CPU time per image.
        print(f"CPU time per image: decode+transform {1e3 * decode_cpu:.1f} ms, forward "
              f"{1e3 * forward_cpu:.1f} ms → CPU-bound ceiling on an idle machine "
              f"{forward_cpu / (forward_cpu + decode_cpu):.2f}")



def _usage():
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return np.array([s.ru_utime, s.ru_stime, c.ru_utime, c.ru_stime,
                     s.ru_minflt + c.ru_minflt, s.ru_majflt + c.ru_majflt, time.perf_counter()])


def _measure(fn):
    """Run ``fn()``; its result and the usage deltas (user, sys, child user, child sys,
    minor faults, major faults, wall)."""
    u0 = _usage()
    out = fn()
    return out, _usage() - u0


def plain_loop(paths, transform, model, batch_size):
    """PIL open → transform → forward in batches under inference_mode → (n, d) float32."""
    import torch
    from PIL import Image

    out = []
    with torch.inference_mode():
        for s in range(0, len(paths), batch_size):
            x = torch.stack([transform(Image.open(p).convert("RGB"))
                             for p in paths[s:s + batch_size]])
            out.append(model(x).float().numpy())
    return np.concatenate(out)


def main(argv=None):
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if "--raw" in argv:
        return raw_main([a for a in argv if a != "--raw"])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images", type=Path, help="image folder (ImageFolder tree) to extract")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--workers", type=int, default=1, help="decoding workers (default 1)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--model", default="tf_efficientnet_lite0")
    ap.add_argument("--weights", default="builtin")
    args = ap.parse_args(argv)

    import os

    # as the fedalign CLI does (fedalign.cli.app.main): torch's OpenMP threads sleep while they
    # wait; spinning ones cost 2-3x the CPU time when a decoding worker or another job shares
    # the cores (amazon, 2 threads: extract 21.5 img/s spinning, 53.7 sleeping). Read when
    # torch is imported, so it is set first; both loops run under it.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import h5py
    import torch

    from fedalign.extract import extract_features, list_images, load_encoder

    try:
        from fedalign.extract import retain_freed_memory
    except ImportError:  # a fedalign before issue 29: the plain loop twice
        import contextlib

        retain_freed_memory = contextlib.nullcontext

    listing = list_images(args.images)
    n, bs = len(listing), args.batch_size
    print(f"{args.images}: n={n} model={args.model} weights={args.weights} batch={bs} "
          f"workers={args.workers} torch {torch.__version__}")
    head = (f"{'threads':>7} {'run':<13} {'img/s':>7} {'wall s':>7} {'user s':>7} {'sys s':>7} "
            f"{'wk user':>7} {'wk sys':>7} {'sys/user':>8} {'minflt':>9} {'majflt':>6} "
            f"{'extract/this':>12}")
    rows = []
    for threads in args.threads:
        le = load_encoder(args.model, args.weights, device="cpu", threads=threads)
        model, transform = le.encoder.model, le.transform
        with torch.inference_mode():  # warm-up: oneDNN kernels for both batch shapes
            c, h, w = le.encoder.data_config["input_size"]
            for m in {min(bs, n), n % bs or bs}:
                model(torch.zeros(m, c, h, w))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "f.h5"
            _, ue = _measure(lambda: extract_features(listing, out, batch_size=bs,
                                                      workers=args.workers, encoder=le))
            with h5py.File(out, "r") as f:
                ref = f["features"][:]
        feats, up = _measure(lambda: plain_loop(listing.paths, transform, model, bs))
        with retain_freed_memory():
            feats2, ur = _measure(lambda: plain_loop(listing.paths, transform, model, bs))
        equal = np.array_equal(ref, feats) and np.array_equal(ref, feats2)
        for name, u in (("extract", ue), ("plain", up), ("plain+retain", ur)):
            user, sys_ = u[0] + u[2], u[1] + u[3]
            ratio = "" if name == "extract" else f"{(n / ue[6]) / (n / u[6]):.2f}"
            rows.append(f"{threads:>7} {name:<13} {n / u[6]:7.1f} {u[6]:7.2f} {u[0]:7.2f} "
                        f"{u[1]:7.2f} {u[2]:7.2f} {u[3]:7.2f} {sys_ / max(user, 1e-9):8.2f} "
                        f"{int(u[4]):9d} {int(u[5]):6d} {ratio:>12}")
        rows.append(f"{threads:>7} features of plain == extract's file: {equal}")
    print(head)
    print("\n".join(rows))
    print("wk = decoding workers (RUSAGE_CHILDREN); sys/user over the process and its workers; "
          "faults of both")


if __name__ == "__main__":
    main()

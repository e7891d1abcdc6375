"""End-to-end extraction throughput vs the encoder's raw forward throughput.

Both sides are measured in this run, with the same model, batch size, threads and device:

* raw: ``model(x)`` on pre-decoded, pre-transformed tensors already in memory;
* end-to-end: :func:`fedalign.extract.extract_features` on image files (decode in DataLoader
  workers → transform → forward → HDF5 write, resumable partial file and final write included).

The ratio end-to-end / raw shows how much decoding and writing cost once overlapped with the
forward pass (goal ≥ 0.85 on CPU with workers, ≥ 0.8 on a GPU at bf16).

    python benchmarks/bench_extract.py                      # generated 300x300 JPEGs, lite0
    python benchmarks/bench_extract.py --images ../shared/data/office_caltech10/images/amazon
    python benchmarks/bench_extract.py --device cuda --precision bf16 --n 4096 --batch-size 256
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = ap.parse_args()

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


if __name__ == "__main__":
    main()

"""The heavy steps on an accelerator, measured in one run → one JSON (issue 17).

Run through ``benchmarks/gpu_check.sh`` (which installs the missing wheels offline first).
Every figure is measured in this process; nothing is assumed:

* ``extract``: end-to-end :func:`fedalign.extract.extract_features` (generated JPEGs → .h5)
  against the raw forward on pre-decoded tensors at the same batch size, bf16, for the builtin
  architecture (``tf_efficientnet_lite0``, ``--weights random``) and one larger timm model
  (random weights);
* ``barycenter``: d ∈ {512, 2048}, K = 10 random SPD — torch on the GPU (time, iterations,
  residual) and the numpy path on the CPU (the same), with ‖S_gpu − S_cpu‖_F/‖S_cpu‖_F;
* ``stats`` and ``align`` on a generated 1M × 1280 float32 file: the GPU time against the
  plain read (stats) / plain chunked copy (align) of the same file, and the numpy path's
  moments for the equality check.

``GPU_CHECK_SMALL=1`` shrinks every size (a CPU dry run of the whole script: it then runs the
torch backend on the CPU). Usage: ``python benchmarks/gpu_check.py OUT.json``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SMALL = os.environ.get("GPU_CHECK_SMALL", "") not in ("", "0")
SIZES = dict(
    extract_n=48 if SMALL else 4096, extract_bs=16 if SMALL else 256, image_side=96 if SMALL else 300,
    big_model="resnet18" if SMALL else "vit_base_patch16_224",
    bary_d=(32, 64) if SMALL else (512, 2048), bary_K=10,
    rows=20_000 if SMALL else 1_000_000, width=64 if SMALL else 1280, chunk=4096 if SMALL else 65536,
)


def _time(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def check_extract(device, tmp: Path) -> dict:
    import torch
    from PIL import Image
    from timm.data import create_transform

    from bench_extract import make_images, raw_forward
    from fedalign.encoders import create_encoder
    from fedalign.extract import default_workers, extract_features, list_images

    folder = make_images(tmp / "imgs", SIZES["extract_n"], SIZES["image_side"])
    listing = list_images(folder)
    bs, out = SIZES["extract_bs"], {}
    precision = "bf16"
    for model in ("tf_efficientnet_lite0", SIZES["big_model"]):
        try:
            enc = create_encoder(model, "random", seed=0)
            t = create_transform(**enc.data_config)
            x = torch.stack([t(Image.open(p).convert("RGB")) for p in listing.paths[:bs]])
            if len(x) < bs:
                x = x.repeat((bs + len(x) - 1) // len(x), 1, 1, 1)[:bs]
            raw1 = raw_forward(enc, x, bs, len(listing), device, precision, repeats=2)
            res = extract_features(listing, tmp / f"{model}.h5", model=model, weights="random",
                                   batch_size=bs, device=device, precision=precision)
            raw2 = raw_forward(enc, x, bs, len(listing), device, precision, repeats=2)
            raw = (raw1 + raw2) / 2
            e2e = len(listing) / res.seconds
            out[model] = dict(n=len(listing), batch_size=bs, precision=precision,
                              workers=default_workers(device), raw_img_s=raw,
                              raw_img_s_before_after=[raw1, raw2], end_to_end_img_s=e2e,
                              seconds=res.seconds, ratio=e2e / raw, goal_ratio=0.8)
        except Exception as e:  # noqa: BLE001 - one failing model must not lose the others
            out[model] = dict(error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(-3))
    return out


def check_barycenter(device) -> dict:
    from bench_barycenter import random_covs
    from fedalign.gaussian import bures_barycenter

    out = {}
    K, tol = SIZES["bary_K"], 1e-10
    for d in SIZES["bary_d"]:
        covs = random_covs(K, d, seed=1)
        w = np.full(K, 1.0 / K)
        bures_barycenter(covs[:2], w[:2] * 5, max_iter=1, backend="torch", device=device)  # warm-up
        _sync()
        tg, g = _time(lambda: bures_barycenter(covs, w, tol=tol, backend="torch", device=device))
        tc, c = _time(lambda: bures_barycenter(covs, w, tol=tol))
        rel = float(np.linalg.norm(g.covariance - c.covariance) / np.linalg.norm(c.covariance))
        out[f"d{d}"] = dict(
            K=K, d=d, tol=tol,
            gpu=dict(seconds=tg, iterations=g.iterations, residual=g.residual, converged=g.converged),
            cpu_numpy=dict(seconds=tc, iterations=c.iterations, residual=c.residual),
            rel_diff_vs_cpu=rel, equal_within_10_tol=bool(rel <= 10 * tol),
            speedup=tc / tg, goal_seconds=10.0 if d == 2048 else None)
    return out


def _big_file(path: Path) -> Path:
    from fedalign.files import FeatureWriter, atomic_output

    n, d, ch = SIZES["rows"], SIZES["width"], SIZES["chunk"]
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(d, d)).astype(np.float32) / np.sqrt(d)
    with atomic_output(path, suffix=".tmp.h5") as tmp, FeatureWriter(
            tmp, d, ["a", "b"], {"producer": "gpu_check"}, expected_rows=n) as w:
        for s in range(0, n, ch):
            m = min(ch, n - s)
            X = rng.standard_normal((m, d), dtype=np.float32) @ mix + 1.0
            w.append(X, np.arange(s, s + m) % 2, [f"r{i}" for i in range(s, s + m)])
    return path


def check_stats_align(device, tmp: Path) -> dict:
    from fedalign.align import AffineMap, align_file, apply_map, client_map, make_reference
    from fedalign.files import FeatureWriter, atomic_output, open_features
    from fedalign.stats import compute_stats

    ch = SIZES["chunk"]
    t_gen, f = _time(lambda: _big_file(tmp / "big.h5"))
    out = dict(rows=SIZES["rows"], d=SIZES["width"], chunk_rows=ch, generate_seconds=t_gen,
               file_gib=f.stat().st_size / 2**30)

    def read_only():
        with open_features(f) as ff:
            for _ in ff.iter_chunks(ch):
                pass

    t_read, _ = _time(read_only)
    compute_stats(f, chunk_rows=ch, backend="torch", device=device)  # warm-up (page cache too)
    _sync()
    t_gpu, g = _time(lambda: compute_stats(f, chunk_rows=ch, backend="torch", device=device))
    t_cpu, c = _time(lambda: compute_stats(f, chunk_rows=ch))
    rel = max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in
              ((g.mean, c.mean), (g.covariance, c.covariance), (g.moments.sum_yy, c.moments.sum_yy)))
    out["stats"] = dict(gpu_seconds=t_gpu, cpu_numpy_seconds=t_cpu, read_seconds=t_read,
                        gpu_over_read=t_gpu / t_read, rel_diff_vs_cpu=rel,
                        equal_within_1e_10=bool(rel <= 1e-10))

    ref = make_reference([c, compute_stats(f, chunk_rows=ch, shrinkage=0.5)])
    t_map, amap = _time(lambda: client_map(c, ref, backend="torch", device=device))

    def copy_only():
        with open_features(f) as ff, atomic_output(tmp / "copy.h5", suffix=".tmp.h5") as t2:
            with FeatureWriter(t2, ff.d, ff.class_names, {}, chunk_rows=4096,
                               expected_rows=ff.n) as w:
                ids = ff.ids
                for s, X, y in ff.iter_chunks(ch, with_labels=True):
                    w.append(X, y, ids[s:s + len(X)])

    t_copy, _ = _time(copy_only)
    (tmp / "copy.h5").unlink()
    t_al, _ = _time(lambda: align_file(f, tmp / "al.h5", amap, 0.4, ch, backend="torch",
                                       device=device))
    with open_features(tmp / "al.h5") as fa, open_features(f) as ff:
        Z = next(fa.iter_chunks(ch))[1]
        X = next(ff.iter_chunks(ch))[1]
    Zc = apply_map(X, AffineMap(amap.A, amap.b, {}), 0.4)
    out["align"] = dict(gpu_seconds=t_al, map_seconds=t_map, copy_seconds=t_copy,
                        copy_over_align=t_copy / t_al,
                        max_abs_diff_first_chunk_vs_numpy=float(np.abs(Z - Zc).max()),
                        scale=float(np.abs(Zc).max()))
    return out


def main():
    import torch

    path = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_check.json")
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    report = dict(
        small=SMALL, sizes=SIZES, device=device,
        device_name=torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        torch=torch.__version__, cpu_count=os.cpu_count(), python=sys.version.split()[0],
        note=None if cuda else "no CUDA device: the torch backend ran on the CPU (dry run)",
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.environ.get("GPU_CHECK_TMP")) as tmp:
        for name, fn in (("barycenter", lambda: check_barycenter(device)),
                         ("stats_align", lambda: check_stats_align(device, Path(tmp))),
                         ("extract", lambda: check_extract(device, Path(tmp)))):
            t = time.perf_counter()
            try:
                report[name] = fn()
            except Exception as e:  # noqa: BLE001 - keep what the other checks measured
                report[name] = dict(error=f"{type(e).__name__}: {e}",
                                    trace=traceback.format_exc(-4))
            report.setdefault("section_seconds", {})[name] = time.perf_counter() - t
            path.write_text(json.dumps(report, indent=2, default=str))  # partial results survive
            print(f"gpu_check: {name} done ({time.perf_counter() - t:.1f}s)", flush=True)
    report["total_seconds"] = time.perf_counter() - t0
    path.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()

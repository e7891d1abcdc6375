"""Where and how the encoder runs: device, batch size, decoding workers, precision,
deterministic kernels."""

from __future__ import annotations

import os

from fedalign.errors import FedalignError



def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; ``cuda`` without a GPU is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FedalignError("device cuda: no CUDA device is available")
    if device != "cpu" and not device.startswith("cuda"):
        raise FedalignError(f"device must be auto, cpu or cuda[:N], got {device!r}")
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
        raise FedalignError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
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

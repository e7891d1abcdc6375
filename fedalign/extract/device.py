"""Where and how the encoder runs: device, batch size, decoding workers, precision,
deterministic kernels, and how freed memory is kept for the next batch."""

from __future__ import annotations

import contextlib
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


# glibc's mallopt parameters and their defaults (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_MALLOC_ENV = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_",
               "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
_retaining = 0


def _libc():
    """glibc's ``mallopt``/``malloc_trim``, or None (another C library, or not Linux)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def retain_freed_memory():
    """Keep memory that torch frees in the process's heap until the block ends.

    A CPU forward pass allocates and frees the same activations every batch (EfficientNet-
    Lite0 at batch 64: ≈ 5 GB of tensors per batch, many over 32 MB). glibc serves
    allocations over its mmap threshold (at most 32 MB) with a fresh ``mmap`` and gives them
    back with ``munmap`` on free, and trims the heap's top when it is freed, so every batch
    touched its activations' pages anew: ≈ 1.2 million minor page faults per batch, more
    system CPU time than the forward's user time (issue 29; ``benchmarks/bench_extract.py``).
    Inside this block glibc serves them from the heap (``M_MMAP_MAX`` 0) and keeps freed
    memory (``M_TRIM_THRESHOLD`` 2 GiB), so the pages are reused, not faulted in again;
    DataLoader workers forked inside it inherit the setting. On entry and on exit the free
    memory is returned (``malloc_trim``) and on exit glibc's defaults are set back: a block
    per listing, not one around several, because a worker forked while the process holds
    gigabytes of kept heap shares them copy-on-write, and the forward's next write to each
    page copies it (measured: more system time than the page faults this block saves).
    Nothing is computed differently: the features are the same bytes.

    A no-op without glibc, and when the environment sets glibc's malloc tunables (the
    user's choice is kept). Nested blocks restore at the outermost exit.
    """
    global _retaining
    libc = None if any(k in os.environ for k in _MALLOC_ENV) else _libc()
    if libc is None:
        yield
        return
    if _retaining == 0:
        # Give back what is free first: the decoding workers forked inside the block share
        # the heap copy-on-write, and every page of it the forward then writes is copied.
        libc.malloc_trim(0)
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    _retaining += 1
    try:
        yield
    finally:
        _retaining -= 1
        if _retaining == 0:
            libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
            libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
            libc.malloc_trim(0)

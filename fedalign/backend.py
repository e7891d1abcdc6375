"""Where the Gaussian core computes: numpy on the CPU (default) or torch on a CPU or a GPU.

The algorithms of :mod:`fedalign.stats`, :mod:`fedalign.gaussian` and :mod:`fedalign.align`
are written once; the few kernels that differ between array libraries (eigendecompositions,
one or many; Cholesky factor, triangular solves, (G L)(G L)ᵀ, norms; the streaming ``syrk``
of :class:`fedalign.stats.Moments`; BLAS thread limits; moving arrays to and from the
device) are the methods of one small adapter, :class:`NumpyBackend` or :class:`TorchBackend`,
chosen by :func:`get_backend`, so the algorithms call them without asking which it is (the
barycenter's root sum alone has one implementation per adapter, chosen by ``batched``:
:mod:`fedalign._bures_fixed_point`). Precision follows the numpy path: float64 for moments and
matrix functions (``torch.linalg.eigh`` with the same relative eigenvalue clipping as
:func:`fedalign.linalg.eigh_clipped`), float32 for the products that are float32 there
(applying a map to features).

``get_backend("numpy", "cpu")`` never imports torch; ``device="auto"`` is opt-in (it imports
torch to look for a GPU). A GPU out of memory becomes one :class:`FedalignError` line saying
how much was needed (:meth:`TorchBackend.guard`).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

from fedalign.errors import FedalignError

BACKENDS = ("numpy", "torch")
_DEVICE = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")


class NumpyBackend:
    """numpy/scipy kernels on the CPU: the reference path (byte-identical files)."""

    name = "numpy"
    device = "cpu"
    is_torch = False
    #: whether many clients' matrix functions run as one batched call (else one per client,
    #: in a thread pool): the one choice :mod:`fedalign._bures_fixed_point` makes by adapter
    batched = False

    def asarray(self, x, dtype=np.float64):
        return np.asarray(x, dtype=dtype)

    def to_numpy(self, x) -> np.ndarray:
        return np.asarray(x)

    eigh = staticmethod(np.linalg.eigh)
    eigvalsh = staticmethod(np.linalg.eigvalsh)
    sqrt = staticmethod(np.sqrt)
    maximum = staticmethod(np.maximum)

    def add_augmented_gram(self, acc, X, shift, buf=None):
        """``(acc + Σ b bᵀ, buf)`` over the rows b = [x − shift, 1, ‖x − shift‖²] of X (m, d):
        BLAS ``syrk`` in place on the upper triangle of the Fortran-ordered (d+2, d+2) float64
        ``acc``; ``buf`` is the reusable (≥ m, d+2) work array (allocated when too small)."""
        from scipy.linalg.blas import dsyrk

        m, d = X.shape
        if buf is None or len(buf) < m:
            buf = np.empty((m, d + 2))
        B = buf[:m]
        np.subtract(X, shift, out=B[:, :d], dtype=np.float64)
        B[:, d] = 1.0
        np.einsum("ij,ij->i", B[:, :d], B[:, :d], out=B[:, d + 1])
        return dsyrk(1.0, B.T, beta=1.0, c=acc, trans=0, lower=0, overwrite_c=1), buf

    def eye(self, d: int):
        return np.eye(d)

    def norm(self, X) -> float:
        return float(np.linalg.norm(X))

    def cholesky(self, S):
        """Lower Cholesky factor, or None when S is not numerically positive definite."""
        from scipy.linalg import LinAlgError, cholesky

        try:
            return cholesky(S, lower=True)
        except LinAlgError:
            return None

    def solve_lower_t(self, L, B):
        """L^{-T} B for lower-triangular L."""
        from scipy.linalg import solve_triangular

        return solve_triangular(L, B, lower=True, trans="T")

    def gram_lower(self, G, L):
        """(G L)(G L)ᵀ, symmetric, for lower-triangular L: BLAS ``trmm`` and ``syrk``."""
        from scipy.linalg.blas import dsyrk, dtrmm

        return full_symmetric(dsyrk(1.0, dtrmm(1.0, L, G, side=1, lower=1)))

    def eigh_all(self, covs, workers: int = 1) -> list:
        """``eigh`` of every symmetric matrix of ``covs``, in a pool of ``workers`` threads."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, min(workers, len(covs)))) as pool:
            return list(pool.map(lambda C: np.linalg.eigh(C), covs))

    def blas_threads(self, limits):
        """A context with at most ``limits`` BLAS threads (None: no limit; threadpoolctl)."""
        from threadpoolctl import ThreadpoolController

        return ThreadpoolController().limit(limits=limits, user_api="blas")

    def record(self) -> dict:
        """What provenance records about the computation (nothing: the default path)."""
        return {}

    @contextlib.contextmanager
    def guard(self, what: str, nbytes: int = 0):
        yield


class TorchBackend:
    """torch kernels on ``device`` (``cpu``, ``cuda``, ``cuda:N``), float64 matrix functions."""

    name = "torch"
    is_torch = True
    batched = True

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = device
        self._dev = torch.device(device)

    # -- arrays ------------------------------------------------------------------------------
    def asarray(self, x, dtype=np.float64):
        t = self.torch
        tdt = {np.float64: t.float64, np.float32: t.float32}[np.dtype(dtype).type]
        if isinstance(x, t.Tensor):
            return x.to(self._dev, tdt)
        x = np.asarray(x)
        src = t.from_numpy(np.ascontiguousarray(x))
        if self._dev.type == "cuda":
            return src.pin_memory().to(self._dev, non_blocking=True).to(tdt)
        return src.to(tdt)

    def to_numpy(self, x) -> np.ndarray:
        if isinstance(x, self.torch.Tensor):
            return x.detach().cpu().numpy()
        return np.asarray(x)

    def eye(self, d: int):
        return self.torch.eye(d, dtype=self.torch.float64, device=self._dev)

    # -- kernels -----------------------------------------------------------------------------
    def eigh(self, S):
        return self.torch.linalg.eigh(S)

    def sqrt(self, x):
        return self.torch.sqrt(x)

    def maximum(self, x, v):
        return self.torch.clamp_min(x, float(v))

    def eigvalsh(self, S):
        return self.torch.linalg.eigvalsh(S)

    def add_augmented_gram(self, acc, X, shift, buf=None):
        """``(acc + Σ b bᵀ, None)`` for the rows b = [x − shift, 1, ‖x − shift‖²] of X, float64
        on the device (the float32 rows travel, pinned, and are widened there). ``acc`` is the
        (d+2, d+2) numpy start (first block) or the running device tensor; the full product is
        kept (readers take its upper triangle, as they do BLAS ``syrk``'s)."""
        t = self.torch
        if not isinstance(acc, t.Tensor):
            acc = self.asarray(acc)
        Y = self.asarray(X, np.float32 if X.dtype == np.float32 else np.float64).to(t.float64)
        Y -= self.asarray(shift)
        B = t.empty((Y.shape[0], Y.shape[1] + 2), dtype=t.float64, device=Y.device)
        B[:, :-2] = Y
        B[:, -2] = 1.0
        B[:, -1] = (Y * Y).sum(1)
        return acc.addmm_(B.mT, B), None

    def cholesky(self, S):
        """Lower Cholesky factor, or None when S is not numerically positive definite."""
        L, info = self.torch.linalg.cholesky_ex(S)
        return None if int(info.max()) != 0 else L

    def solve_lower_t(self, L, B):
        """L^{-T} B for lower-triangular L."""
        return self.torch.linalg.solve_triangular(L.mT, B, upper=True)

    def norm(self, X) -> float:
        return float(self.torch.linalg.norm(X))

    def gram_lower(self, G, L):
        """(G L)(G L)ᵀ, symmetric (two products)."""
        GL = G @ L
        P = GL @ GL.mT
        return 0.5 * (P + P.T)

    def eigh_all(self, covs, workers: int = 1) -> list:
        """``eigh`` of every matrix of ``covs`` on the device, one after another, as numpy
        (w, V) pairs."""
        return [tuple(map(self.to_numpy, self.eigh(C))) for C in covs]

    def blas_threads(self, limits):
        """No BLAS limit: torch runs its own kernels."""
        return contextlib.nullcontext()

    def record(self) -> dict:
        """Provenance: the backend and the device used (with the GPU's name)."""
        rec = dict(backend="torch", device=self.device)
        if self._dev.type == "cuda":
            rec["device_name"] = self.torch.cuda.get_device_name(self._dev)
        return rec

    @contextlib.contextmanager
    def guard(self, what: str, nbytes: int = 0):
        """Turn a GPU out-of-memory error into one line: what needed how much."""
        t = self.torch
        try:
            yield
        except t.cuda.OutOfMemoryError as e:
            free = total = None
            with contextlib.suppress(Exception):
                free, total = t.cuda.mem_get_info(self._dev)
            need = f"about {nbytes / 2**30:.2f} GiB" if nbytes else "more memory than is free"
            have = (f"; {free / 2**30:.2f} of {total / 2**30:.2f} GiB free on {self.device}"
                    if total else "")
            raise FedalignError(f"out of GPU memory in {what}: it needs {need}{have}; use "
                                "--device cpu or a smaller --chunk-rows") from e


_NUMPY = NumpyBackend()


def get_backend(backend: str = "numpy", device: str = "cpu"):
    """The adapter for ``backend`` on ``device``.

    Parameters
    ----------
    backend : "numpy" (default) or "torch"
    device : "cpu" (default), "cuda", "cuda:N" or "auto" (a GPU if torch sees one, else the
        CPU). Any CUDA device implies the torch backend.

    Returns
    -------
    :class:`NumpyBackend` or :class:`TorchBackend`

    Raises
    ------
    FedalignError
        unknown backend or device string, torch not installed, no CUDA device, or a device
        index beyond the GPUs present.
    """
    if isinstance(backend, (NumpyBackend, TorchBackend)):
        return backend
    backend = str(backend or "numpy").lower()
    device = str(device or "cpu").lower()
    if backend not in BACKENDS:
        raise FedalignError(f"backend must be numpy or torch, got {backend!r}")
    if not _DEVICE.match(device):
        raise FedalignError(f"device must be cpu, cuda, cuda:N or auto, got {device!r}")
    if backend == "numpy" and device == "cpu":
        return _NUMPY
    try:
        import torch
    except ImportError as e:
        raise FedalignError("the torch backend needs torch (pip install torch)") from e
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu" and backend == "numpy":
            return _NUMPY
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise FedalignError(f"device {device}: no CUDA device is available "
                                "(use --device cpu)")
        idx = int(device.split(":")[1]) if ":" in device else 0
        if idx >= torch.cuda.device_count():
            raise FedalignError(f"device {device}: only {torch.cuda.device_count()} CUDA "
                                "device(s) present")
    return TorchBackend(device)


def full_symmetric(U: np.ndarray) -> np.ndarray:
    """The symmetric matrix of an upper triangle ``U`` (BLAS ``syrk`` output)."""
    return np.triu(U) + np.triu(U, 1).T


def array_bytes(*shapes, itemsize: int = 8) -> int:
    """Bytes of float arrays of the given shapes (for out-of-memory messages)."""
    return int(sum(np.prod(s) for s in shapes) * itemsize)

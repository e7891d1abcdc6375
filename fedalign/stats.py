"""Streaming moments and Ledoit–Wolf shrinkage, exact in one pass.

A client summarises its features by aggregates only: the count n, the sums Σy and Σyyᵀ, and
the fourth-moment sums Σ‖y‖²y and Σ‖y‖⁴, all of ``y = x − shift`` around a provisional
shift (the first chunk's mean), accumulated in float64. These sums merge across chunks (and
across clients with the same shift) by addition, and they determine the Ledoit–Wolf estimator
exactly:

    Σ̂ = Σyyᵀ/n − c cᵀ,  c = Σy/n = μ − shift                         (1/n covariance)
    m = tr Σ̂ / d
    β̃ = Σ_i ‖x_i − μ‖⁴ = Σ‖y‖⁴ − 4 cᵀΣ‖y‖²y + 4 cᵀ(Σyyᵀ)c + 2‖c‖² tr Σyyᵀ − 4‖c‖² cᵀΣy + n‖c‖⁴
    b² = (β̃/n − ‖Σ̂‖²_F) / (n d),   δ² = ‖Σ̂ − m I‖²_F / d
    s = min(b², δ²) / δ²
    Σ_LW = (1 − s) Σ̂ + s m I

``s`` is scikit-learn's ``shrinkage_`` (the weight on the scaled identity). In the notation
Σ = λ Σ̂ + (1−λ)(tr Σ̂/d) I of Ledoit & Wolf, λ = 1 − s.

``backend``/``device`` (:func:`fedalign.backend.get_backend`) run the one streaming product
Σ b bᵀ on torch (float64, on a CPU or a GPU); everything else is the same code, and the sums
agree with the numpy path to rounding (1e-10 relative is what the tests require).

References
----------
O. Ledoit and M. Wolf, "A well-conditioned estimator for large-dimensional covariance
matrices", J. Multivariate Analysis 88 (2004).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedalign.backend import array_bytes, get_backend
from fedalign.defaults import CHUNK_ROWS
from fedalign.errors import FedalignError, short_array, spell


@dataclass
class Moments:
    """Float64 moment sums of ``y = x − shift``, mergeable by addition.

    Attributes
    ----------
    n : int
    shift : (d,) provisional centre
    sum_y : (d,)          Σ y
    sum_yy : (d, d)       Σ y yᵀ (full symmetric)
    sum_sqnorm_y : (d,)   Σ ‖y‖² y
    sum_sqnorm2 : float   Σ ‖y‖⁴
    class_counts : (C,) int64 or None
    class_sums : (C, d) float64 or None   Σ_{i: y_i = c} x_i (uncentred)
    backend : None (numpy) or a :mod:`fedalign.backend` adapter for the streaming product
    """

    d: int
    shift: np.ndarray | None = None
    n: int = 0
    sum_y: np.ndarray = None
    sum_yy: np.ndarray = None
    sum_sqnorm_y: np.ndarray = None
    sum_sqnorm2: float = 0.0
    n_classes: int | None = None
    class_counts: np.ndarray | None = None
    class_sums: np.ndarray | None = None
    _acc: np.ndarray | None = field(default=None, repr=False)
    _buf: np.ndarray | None = field(default=None, repr=False)
    backend: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        d = self.d
        if self.sum_y is None:
            self.sum_y = np.zeros(d)
            self.sum_yy = np.zeros((d, d))
            self.sum_sqnorm_y = np.zeros(d)
            # streaming accumulator: upper triangle of Σ b bᵀ for b = [y, 1, ‖y‖²] (Fortran
            # order so BLAS syrk accumulates in place); unpacked by finalize()
            self._acc = np.zeros((d + 2, d + 2), order="F")
        if self.n_classes is not None and self.class_counts is None:
            self.class_counts = np.zeros(self.n_classes, dtype=np.int64)
            self.class_sums = np.zeros((self.n_classes, d))

    def update(self, X: np.ndarray, labels: np.ndarray | None = None) -> "Moments":
        """Add a block of rows X (m, d); labels (m,) int with -1 for unlabeled.

        One BLAS ``syrk`` on the augmented rows b = [y, 1, ‖y‖²] (m, d + 2) accumulates every
        sum at once: Σ y yᵀ, Σ y, Σ ‖y‖² y and Σ ‖y‖⁴ are blocks of Σ b bᵀ.
        """
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.d:
            raise FedalignError(f"block has shape {X.shape}, expected (m, {self.d})")
        if len(X) == 0:
            return self
        if self._acc is None:
            raise RuntimeError("update() after finalize(); create a new Moments")
        if self.shift is None:
            self.shift = X.mean(axis=0, dtype=np.float64)
        m, d = X.shape
        bk = get_backend(self.backend)
        with bk.guard(f"stats of a {m} × {d} block", array_bytes((m, d + 2), (d + 2, d + 2))):
            self._acc, self._buf = bk.add_augmented_gram(self._acc, X, self.shift, self._buf)
        self.n += m
        if self.class_counts is not None and labels is not None:
            labels = np.asarray(labels)
            keep = labels >= 0
            if np.any(labels[keep] >= self.n_classes):
                raise FedalignError(
                    f"label {int(labels.max())} out of range for {self.n_classes} classes"
                )
            lab = labels[keep]
            self.class_counts += np.bincount(lab, minlength=self.n_classes)
            onehot = np.zeros((len(lab), self.n_classes))
            onehot[np.arange(len(lab)), lab] = 1.0
            self.class_sums += onehot.T @ X[keep].astype(np.float64)
        return self

    def finalize(self) -> "Moments":
        """Unpack the streaming accumulator into the sums (after the last :meth:`update`)."""
        if self._acc is not None:
            d, A = self.d, get_backend(self.backend).to_numpy(self._acc)
            U = np.triu(A[:d, :d])
            self.sum_yy = self.sum_yy + U + np.triu(U, 1).T
            self.sum_y = self.sum_y + A[:d, d]
            self.sum_sqnorm_y = self.sum_sqnorm_y + A[:d, d + 1]
            self.sum_sqnorm2 += float(A[d + 1, d + 1])
            self._acc = self._buf = None
        return self

    # -- derived quantities --------------------------------------------------------------------
    @property
    def mean(self) -> np.ndarray:
        """(d,) sample mean."""
        self._check_n(1)
        self.finalize()
        return self.shift + self.sum_y / self.n

    def empirical_covariance(self) -> np.ndarray:
        """(d, d) maximum-likelihood (1/n) covariance Σ̂."""
        self._check_n(1)
        self.finalize()
        c = self.sum_y / self.n
        S = self.sum_yy / self.n - np.outer(c, c)
        return 0.5 * (S + S.T)

    def raw_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """Uncentred ``(Σx (d,), Σxxᵀ (d, d))`` — what FedCGS-style heads aggregate."""
        self.finalize()
        s, a = self.shift, self.sum_y
        sx = a + self.n * s
        sxx = self.sum_yy + np.outer(s, a) + np.outer(a, s) + self.n * np.outer(s, s)
        return sx, sxx

    def fourth_moment_sum(self) -> float:
        """Σ_i ‖x_i − μ‖⁴ from the shifted sums (exact algebra, see module docstring)."""
        self.finalize()
        c = self.sum_y / self.n
        e = float(c @ c)
        return float(
            self.sum_sqnorm2
            - 4.0 * (self.sum_sqnorm_y @ c)
            + 4.0 * (c @ self.sum_yy @ c)
            + 2.0 * e * np.trace(self.sum_yy)
            - 4.0 * e * (self.sum_y @ c)
            + self.n * e * e
        )

    def _check_n(self, k):
        if self.n < k:
            raise FedalignError(f"need at least {k} samples, got {self.n}")

    def merge(self, other: "Moments") -> "Moments":
        """Sum of two moment sets taken around the same shift."""
        if other.shift is None:
            return self
        if self.shift is None:
            return other
        if not np.array_equal(self.shift, other.shift):
            raise FedalignError("moments taken around different shifts cannot be added")
        self.finalize()
        other.finalize()
        out = Moments(self.d, shift=self.shift.copy(), n=self.n + other.n,
                      sum_y=self.sum_y + other.sum_y, sum_yy=self.sum_yy + other.sum_yy,
                      sum_sqnorm_y=self.sum_sqnorm_y + other.sum_sqnorm_y,
                      sum_sqnorm2=self.sum_sqnorm2 + other.sum_sqnorm2)
        if self.class_counts is not None and other.class_counts is not None:
            out.n_classes = self.n_classes
            out.class_counts = self.class_counts + other.class_counts
            out.class_sums = self.class_sums + other.class_sums
        return out


def ledoit_wolf_shrinkage(m: Moments) -> float:
    """Ledoit–Wolf shrinkage ``s`` (scikit-learn's ``shrinkage_``) from moment sums."""
    n, d = m.n, m.d
    if m.sum_sqnorm2 is None:
        raise FedalignError("these moments carry no fourth-moment sums (a DP release): Ledoit–"
                            "Wolf needs them; fedalign.dp post-processes DP moments")
    if d == 1:
        return 0.0
    S = m.empirical_covariance()
    mu = np.trace(S) / d
    delta_ = float(np.sum(S * S))
    beta = (m.fourth_moment_sum() / n - delta_) / (d * n)
    delta = (delta_ - 2.0 * mu * np.trace(S) + d * mu * mu) / d
    beta = min(beta, delta)
    return 0.0 if beta <= 0 else float(min(beta / delta, 1.0))  # n ≤ d rounded to -8.8e-17


def shrunk_covariance(m: Moments, shrinkage="auto") -> tuple[np.ndarray, float]:
    """Covariance Σ = (1 − s) Σ̂ + s (tr Σ̂/d) I.

    Parameters
    ----------
    m : Moments with at least 2 samples
    shrinkage : "auto" (Ledoit–Wolf), "none" (s = 0) or a float in [0, 1]

    Returns
    -------
    covariance : (d, d) float64
    s : float
    """
    m._check_n(2)
    if shrinkage == "auto":
        s = ledoit_wolf_shrinkage(m)
    elif shrinkage in ("none", None):
        s = 0.0
    else:
        s = float(shrinkage)
        if not 0.0 <= s <= 1.0:
            raise FedalignError(f"shrinkage must be in [0, 1], got {s}")
    S = m.empirical_covariance()
    mu = np.trace(S) / m.d
    C = (1.0 - s) * S
    C[np.diag_indices_from(C)] += s * mu
    return C, s


@dataclass
class GaussianStats:
    """What a client shares for SLOT-Align: a Gaussian proxy plus its moment sums.

    Attributes
    ----------
    n : int
    mean : (d,)
    covariance : (d, d) shrunk covariance
    shrinkage : float (scikit-learn convention: weight on the scaled identity)
    moments : Moments
    class_names : list of str
    storage : "float64", or "float32" when a file stored the matrices so (read back as
        float64)
    meta : the metadata of the file it was read from (empty otherwise)
    dp : None, or the record of a differentially private release (:mod:`fedalign.dp`): the
        moments are then noisy sums around shift 0 without fourth-moment sums
    """

    n: int
    mean: np.ndarray
    covariance: np.ndarray
    shrinkage: float
    moments: Moments
    class_names: list = field(default_factory=list)
    dp: dict | None = None
    storage: str = "float64"
    meta: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def d(self) -> int:
        return self.mean.shape[0]

    def require_float64(self, source, why: str) -> None:
        """Refuse statistics whose matrices a file stored in float32 (``stats --dtype
        float32``) where ``why`` needs float64 sums."""
        if self.storage != "float64":
            raise FedalignError(f"{source}: the statistics are stored in {self.storage}; {why} "
                                "needs float64 (recompute them with `fedalign stats` without "
                                "--dtype float32)")


def moments_of_file(path, per_class: bool = False, chunk_rows: int = CHUNK_ROWS, progress=None,
                    backend="numpy", device="cpu") -> tuple[Moments, list]:
    """One streaming pass over a features file → (:class:`Moments`, class_names).

    Peak memory is O(chunk_rows · d + d²), independent of n (on the device too with torch).
    """
    bk = get_backend(backend, device)
    from fedalign.files import open_features

    with open_features(path) as ff:
        names = ff.class_names
        C = None
        if per_class:
            labels = ff.labels
            if not np.any(labels >= 0):
                raise FedalignError(f"{path}: per-class statistics need labeled rows; all "
                                    f"{ff.n} rows are unlabeled (label -1)")
            C = max(len(names), int(labels.max()) + 1)
        m = Moments(ff.d, n_classes=C, backend=bk)
        for _, X, y in ff.iter_chunks(chunk_rows, with_labels=True):
            m.update(X, y)
            if progress is not None:
                progress(len(X))
    return m.finalize(), names


def compute_stats(path, shrinkage="auto", per_class: bool = False, chunk_rows: int = CHUNK_ROWS,
                  progress=None, backend="numpy", device="cpu") -> GaussianStats:
    """Mean and Ledoit–Wolf covariance of a features file in one streaming pass.

    ``backend``, ``device``: where the streaming product runs (:func:`moments_of_file`).
    """
    m, names = moments_of_file(path, per_class, chunk_rows, progress, backend, device)
    if m.n < 2:  # the file's own words (the command line's error), before the shared rule
        raise FedalignError(f"{path}: need at least 2 samples to estimate a covariance, got {m.n}")
    return gaussian_from_moments(m, shrinkage, path, names)


def gaussian_from_moments(m: Moments, shrinkage="auto", source="statistics",
                          class_names=()) -> GaussianStats:
    """The Gaussian proxy of moment sums: μ = shift + Σy/n and Σ = (1 − s) Σ̂ + s (tr Σ̂/d) I,
    Σ̂ = Σyyᵀ/n − c cᵀ (c = Σy/n), s by Ledoit–Wolf or as given (:func:`shrunk_covariance`),
    Σ positive definite (:func:`check_definite`) — the one home of this rule for a file
    (:func:`compute_stats`), rows (:func:`gaussian_stats`), pooled clients
    (:func:`fedalign.pooling.pool_stats`) and an estimator's domain (``SLOTAlign``).

    Parameters
    ----------
    m : :class:`Moments` of n ≥ 2 rows in d dimensions (finalized here)
    shrinkage : "auto" (Ledoit–Wolf), "none" (s = 0) or a float in [0, 1]
    source : what the moments are of, named by the errors; class_names : (C,) kept

    Returns
    -------
    :class:`GaussianStats` — n, mean (d,), covariance (d, d) float64, shrinkage s, moments m
    """
    m.finalize()
    if m.n < 2:
        raise FedalignError(f"{source}: need at least 2 rows to estimate a covariance, got {m.n}")
    C, s = shrunk_covariance(m, shrinkage)
    check_definite(C, m, s, source, shrinkage)
    return GaussianStats(m.n, m.mean, C, s, m, list(class_names))


def gaussian_stats(X: np.ndarray, shrinkage="auto", source="client statistics") -> GaussianStats:
    """:func:`gaussian_from_moments` of the rows X (n, d): a :class:`GaussianStats`."""
    X = np.asarray(X)
    return gaussian_from_moments(Moments(X.shape[1]).update(X), shrinkage, source)


def check_definite(C: np.ndarray, m: Moments, s: float, source, shrinkage="auto") -> None:
    """Refuse a covariance that is not positive definite, naming why and the fix for the
    ``shrinkage`` asked for: s > 0 makes Σ = (1 − s) Σ̂ + s (tr Σ̂/d) I definite unless every
    column is constant (tr Σ̂ = 0); s = 0 (given, or Ledoit–Wolf's from n ≤ d rows) leaves Σ̂
    singular with zero-variance columns or n ≤ d."""
    from fedalign.files import check_spd

    try:
        check_spd(C, "covariance")
        return
    except FedalignError:
        pass
    var = np.diag(m.empirical_covariance())
    zero = np.flatnonzero(var <= (1e-7 * np.maximum(np.abs(m.mean), 1.0)) ** 2)
    if len(zero) == m.d:
        raise FedalignError(
            f"{source}: the features are constant (every column has the same value in all "
            f"{m.n} rows): their covariance is zero, so there is no Gaussian to align")
    cols = ", ".join(map(str, zero[:8])) + (", …" if len(zero) > 8 else "")
    why = (f"column{'s' if len(zero) > 1 else ''} {cols} {'have' if len(zero) > 1 else 'has'} "
           "zero variance" if len(zero) else
           f"n={m.n} rows for d={m.d} dimensions" if m.n <= m.d else "it is numerically singular")
    fix = (f"Ledoit–Wolf ({spell('shrinkage', 'auto')}) finds no shrinkage in these rows: give "
           f"{spell('shrinkage')} a value in (0, 1]" if shrinkage == "auto" else
           f"give {spell('shrinkage', 'auto')} or a value in (0, 1]")
    raise FedalignError(f"{source}: the covariance is not positive definite with shrinkage s={s:.3g}"
                        f" ({why}); {fix}" + f" or at least {m.d + 1} rows" * (m.n <= m.d))


#: Stats file layouts: ``full`` (format_version 1, the default: every matrix d × d in
#: float64) and ``compact`` (format_version 2: the covariance and Σyyᵀ stored once, as
#: their upper triangles, in float64 or float32).
STATS_VERSIONS = {"full": 1, "compact": 2}


def save_stats(path, st: GaussianStats, meta: dict | None = None, compact: bool = False,
               dtype: str = "float64"):
    """Write a stats file (aggregates only).

    ``compact``: format_version 2, the symmetric (d, d) matrices stored once (upper
    triangle: d(d+1)/2 numbers); ``dtype`` "float32" (implies ``compact``) halves that again,
    the arithmetic of every reader staying float64.
    """
    from fedalign.files import write_npz

    m = st.moments.finalize()
    arrays = dict(
        n=np.int64(st.n), mean=st.mean, covariance=st.covariance, shrinkage=np.float64(st.shrinkage),
        shift=m.shift, sum_y=m.sum_y, sum_yy=m.sum_yy, sum_sqnorm_y=m.sum_sqnorm_y,
        sum_sqnorm2=None if m.sum_sqnorm2 is None else np.float64(m.sum_sqnorm2),
    )
    if m.class_counts is not None:
        arrays["class_counts"] = m.class_counts
        arrays["class_sums"] = m.class_sums
        if st.class_names and len(st.class_names) == len(m.class_counts):
            arrays["class_names"] = np.array(st.class_names, dtype=str)
    compact = compact or dtype != "float64"
    return write_npz(path, "stats", arrays, meta, version=STATS_VERSIONS["compact" if compact
                                                                          else "full"],
                     dtype=dtype)


def load_stats(path, check_spd: bool = True) -> GaussianStats:
    """Read and validate a stats file (format_version 1 or 2; ``storage`` says whether its
    matrices were stored in float32). ``check_spd=False``: the caller proves the covariance
    positive definite itself (:func:`fedalign.files.read_npz`)."""
    from fedalign.files import read_npz

    info = {}
    a, meta = read_npz(path, "stats", info, spd=check_spd)
    n = int(a["n"])
    if n < 2:
        raise FedalignError(f"{path}: stats from fewer than 2 samples (n={n})")
    if not 0.0 <= float(a["shrinkage"]) <= 1.0:
        raise FedalignError(f"{path}: 'shrinkage' must be in [0, 1], got {float(a['shrinkage'])}")
    d = a["mean"].shape[0]
    dp = meta.get("dp")
    fourth = "sum_sqnorm_y" in a and "sum_sqnorm2" in a
    if not fourth and not dp:
        raise FedalignError(f"{path}: missing the fourth-moment sums 'sum_sqnorm_y', 'sum_sqnorm2' "
                            "(only a DP release, which records 'dp' in its metadata, omits them)")
    m = Moments(d, shift=a["shift"].astype(float), n=n, sum_y=a["sum_y"].astype(float),
                sum_yy=a["sum_yy"].astype(float),
                sum_sqnorm_y=a["sum_sqnorm_y"].astype(float) if fourth else None,
                sum_sqnorm2=float(a["sum_sqnorm2"]) if fourth else None)
    if "class_counts" in a:
        counts = a["class_counts"]   # each within ±2**53 (read_npz); summed exactly
        total = sum(int(c) for c in counts)
        if int(counts.min()) < 0 or total > n:
            raise FedalignError(f"{path}: 'class_counts' must be ≥ 0 and sum to at most n={n} "
                                f"(the labeled rows), got {short_array(counts, threshold=8)} "
                                f"(sum {total})")
        m.n_classes = len(a["class_counts"])
        m.class_counts = a["class_counts"].astype(np.int64)
        m.class_sums = a["class_sums"].astype(float)
    names = [str(s) for s in a.get("class_names", [])] or list(meta.get("class_names", []))
    return GaussianStats(n, a["mean"].astype(float), a["covariance"].astype(float),
                         float(a["shrinkage"]), m, names, dp=dp, storage=info["dtype"],
                         meta=meta)


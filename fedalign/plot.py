"""Pictures people would rather look at than read (PNG via matplotlib's Agg backend).

- :func:`plot_embedding` — a 2-D projection (PCA, or t-SNE) of several clients' features
  before and after alignment, coloured by client and marked by class. Both panels share one
  projection fitted on the *before* features, so movement is visible.
- :func:`plot_accuracy` — grouped bars of per-domain accuracy for several reports (e.g.
  baseline vs +SLOT).
- :func:`plot_reconstruction` — the DaDiL reconstruction picture (GMM-DaDiL, Figure 5): one
  2-D embedding (t-SNE or PCA) of the real target features and of samples of B(α_T); the
  classes missing from the target's adaptation data in colour, the present ones in grey.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError

_MARKERS = "o^sDv<>pP*Xh8d"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out):
    from fedalign.files import atomic_output

    with atomic_output(out, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    _pyplot().close(fig)
    return Path(out)


def _load_subsample(paths, max_points, seed):
    from fedalign.files import read_features

    rng = np.random.default_rng(seed)
    Xs, ys, cs, names = [], [], [], []
    for k, p in enumerate(paths):
        X, y, info = read_features(p)
        idx = np.sort(rng.choice(len(X), size=min(len(X), max_points), replace=False))
        Xs.append(X[idx].astype(np.float64))
        ys.append(y[idx])
        cs.append(np.full(len(idx), k))
        names.append(Path(p).name.split(".")[0])
    d = {x.shape[1] for x in Xs}
    if len(d) != 1:
        raise FedalignError(f"feature files have different dimensions: {sorted(d)}")
    return np.concatenate(Xs), np.concatenate(ys), np.concatenate(cs), names


def project_2d(X_before, X_after=None, method: str = "pca", seed: int = 0):
    """2-D coordinates of X_before (and X_after in the same frame).

    PCA is fitted on X_before and applied to both. t-SNE has no shared transform, so both
    sets are embedded jointly. Needs at least 2 feature dimensions and 2 rows (t-SNE: more
    rows than its perplexity, min(30, max(5, n // 10))).
    """
    n = len(X_before) + (0 if X_after is None else len(X_after))
    if X_before.ndim != 2 or X_before.shape[1] < 2 or len(X_before) < 2:
        raise FedalignError(f"a 2-D embedding needs at least 2 rows and 2 feature dimensions, "
                            f"got {len(X_before)} rows of d={X_before.shape[-1]}")
    if method == "tsne" and n <= min(30, max(5, n // 10)):
        raise FedalignError(f"t-SNE needs more than {min(30, max(5, n // 10))} rows, got {n} "
                            "(use --method pca)")
    if method == "pca":
        from sklearn.decomposition import PCA

        pca = PCA(2, random_state=seed).fit(X_before)
        return pca.transform(X_before), None if X_after is None else pca.transform(X_after)
    if method == "tsne":
        from sklearn.manifold import TSNE

        both = X_before if X_after is None else np.vstack([X_before, X_after])
        Z = TSNE(2, random_state=seed, init="pca", perplexity=min(30, max(5, len(both) // 10))).fit_transform(both)
        return Z[: len(X_before)], None if X_after is None else Z[len(X_before):]
    raise FedalignError(f"method must be pca or tsne, got {method!r}")


def plot_embedding(before, after=None, out="embedding.png", method: str = "pca",
                   max_points: int = 500, seed: int = 0, title: str | None = None) -> Path:
    """Scatter of client features before (and after) alignment.

    Parameters
    ----------
    before : list of features files, one per client
    after : list of aligned features files in the same order (optional)
    max_points : rows drawn per file (uniform subsample, seeded)
    """
    if after is not None and len(after) != len(before):
        raise FedalignError("give as many aligned files as original files")
    Xb, y, c, names = _load_subsample(before, max_points, seed)
    Xa = None
    if after is not None:
        Xa, ya, ca, _ = _load_subsample(after, max_points, seed)
        if Xa.shape != Xb.shape or not np.array_equal(ya, y):
            raise FedalignError("aligned files must hold the same rows as the originals")
    Zb, Za = project_2d(Xb, Xa, method, seed)
    from fedalign.files import open_features

    with open_features(before[0]) as ff:
        class_names = ff.class_names
    classes = np.unique(y)
    plt = _pyplot()
    from matplotlib.lines import Line2D

    panels = [("before alignment", Zb)] + ([("after alignment", Za)] if Za is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels) + 2, 5), squeeze=False)
    cmap = plt.get_cmap("tab10")
    if method == "pca":  # share of the before features' variance on each axis
        total = float(np.trace(np.atleast_2d(np.cov(Xb, rowvar=False))))
        share = [float(np.var(Zb[:, i], ddof=1)) / total if total > 0 else 0.0 for i in (0, 1)]
        axis_names = [f"PC {i + 1} ({100 * share[i]:.0f} % of the variance)"
                      for i in (0, 1)]
    else:
        axis_names = ["t-SNE 1", "t-SNE 2"]
    for ax, (name, Z) in zip(axes[0], panels):
        for k, client in enumerate(names):
            for j, cls in enumerate(classes):
                sel = (c == k) & (y == cls)
                ax.scatter(Z[sel, 0], Z[sel, 1], s=10, alpha=0.6, color=cmap(k % 10),
                           marker=_MARKERS[j % len(_MARKERS)])
        ax.set_title(name)
        ax.set_xlabel(axis_names[0])
        ax.set_ylabel(axis_names[1])
        ax.set_xticks([])
        ax.set_yticks([])

    def label(cls):
        if cls < 0:
            return "unlabeled"
        return class_names[cls] if 0 <= cls < len(class_names) else f"class {cls}"

    clients = [Line2D([], [], ls="", marker="o", color=cmap(k % 10), label=n)
               for k, n in enumerate(names)]
    markers = [Line2D([], [], ls="", marker=_MARKERS[j % len(_MARKERS)], color="0.3",
                      label=label(int(cls))) for j, cls in enumerate(classes)]
    last = axes[0][-1]
    key = last.legend(handles=clients, title="client (colour)", fontsize=8,
                      loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    last.add_artist(key)
    last.legend(handles=markers, title="class (marker)", fontsize=8, ncol=1 + len(markers) // 16,
                loc="lower left", bbox_to_anchor=(1.02, 0.0), borderaxespad=0)
    fig.suptitle(title or f"{method.upper() if method == 'pca' else 't-SNE'} of client features")
    return _save(fig, out)


def plot_accuracy(series: dict, out="accuracy.png", title: str = "Per-domain accuracy") -> Path:
    """Grouped bars: ``series`` maps a label (e.g. "baseline", "+SLOT τ=0.4") to
    ``{domain: accuracy in [0, 1] or %}``; a ``mean`` group is added."""
    if not series:
        raise FedalignError("nothing to plot")
    labels = list(series)
    domains = sorted({d for s in series.values() for d in s})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * (len(domains) + 1) * len(labels) / 2 + 2), 4))
    width = 0.8 / len(labels)
    groups = domains + ["mean"]
    for i, lab in enumerate(labels):
        vals = [series[lab].get(d, np.nan) for d in domains]
        vals = vals + [float(np.nanmean(vals))]
        vals = [100 * v if v <= 1.0 else v for v in vals]
        x = np.arange(len(groups)) + (i - (len(labels) - 1) / 2) * width
        bars = ax.bar(x, vals, width, label=lab)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return _save(fig, out)


def accuracy_series_from_reports(reports, method: str | None = None, labels=None) -> dict:
    """Per-domain mean accuracies of one method from several evaluate reports.

    Returns ``{label: {domain: mean accuracy}}``; labels default to "baseline" for
    unaligned reports and "+SLOT τ=…" for aligned ones.
    """
    from fedalign.files import read_report, report_accuracies

    series = {}
    for i, path in enumerate(reports):
        rep = read_report(path)
        if "methods" not in rep:
            raise FedalignError(f"{path}: report holds no method results (an evaluate report)")
        _, methods = report_accuracies(rep, path)
        m = method or next(iter(methods))
        if m not in methods:
            raise FedalignError(f"{path}: no results for method {m!r} (has {', '.join(methods)})")
        summ = methods[m]["summary"]
        al = rep.get("alignment")
        label = (labels[i] if labels else
                 f"{m} baseline" if not al else f"{m} +SLOT τ={al['tau']:g}")
        series[label] = {d: v["mean"] for d, v in summ.items() if d != "macro"}
    return series


# --------------------------------------------------------------------------------------------
# Reconstruction of a target by its barycenter (GMM-DaDiL, Figure 5)
# --------------------------------------------------------------------------------------------

#: Real features: filled circles; samples of B(α_T): crosses.
REAL_MARKER, SAMPLE_MARKER = "o", "x"
#: Present classes: light grey (real) and dark grey (samples).
GREY_REAL, GREY_SAMPLE = "#b4b4b4", "#5a5a5a"


def _missing_palette(n: int) -> list:
    """n distinct non-grey colours (tab10 without its grey, then tab20's darker shades)."""
    import matplotlib

    tab10 = [matplotlib.colors.to_hex(c) for i, c in enumerate(matplotlib.colormaps["tab10"].colors)
             if i != 7]
    tab20 = [matplotlib.colors.to_hex(c) for i, c in enumerate(matplotlib.colormaps["tab20"].colors)
             if i % 2 == 1 and i not in (14, 15)]
    pal = tab10 + tab20
    return [pal[i % len(pal)] for i in range(n)]


def _subsample(X, y, max_points, rng):
    if max_points is not None and len(X) > int(max_points):
        idx = np.sort(rng.choice(len(X), size=int(max_points), replace=False))
        return X[idx], y[idx]
    return X, y


def _check_xy(X, y, what):
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).astype(np.int64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise FedalignError(f"{what}: features {X.shape} and labels {y.shape} disagree")
    if not np.all(np.isfinite(X)):
        raise FedalignError(f"{what} contain NaN or Inf")
    return X, y


def reconstruction_figure(X_target, y_target, X_samples, y_samples, missing_classes,
                          method: str = "tsne", seed: int = 0, max_points: int | None = 1000,
                          class_names=None, title: str | None = None):
    """The reconstruction picture as an open matplotlib figure, and what it draws.

    Parameters
    ----------
    X_target : (n, d) real target features; y_target : (n,) their labels (rows with −1 are
        left out: the picture is coloured by class)
    X_samples : (m, d) samples of B(α_T); y_samples : (m,) their labels
    missing_classes : classes removed from the target's adaptation data (drawn in colour;
        every other class in grey)
    method : "tsne" (one joint scikit-learn t-SNE of both sets) or "pca" (fitted on the real
        features, applied to the samples)
    max_points : each set is subsampled (uniformly, seeded) to at most this many rows
    class_names : optional names for the legend

    Returns
    -------
    fig : matplotlib Figure (close it, or use :func:`plot_reconstruction`)
    info : dict with ``method``, ``n_real``, ``n_samples`` and ``groups``: one entry per
        (source ∈ {"real", "reconstructed"}, class group) with ``classes`` ("present" or a
        class index), ``missing``, ``n`` (points drawn), ``color`` (hex), ``marker``, ``label``
    """
    if method not in ("tsne", "pca"):
        raise FedalignError(f"method must be pca or tsne, got {method!r}")
    Xr, yr = _check_xy(X_target, y_target, "target features")
    Xs, ys = _check_xy(X_samples, y_samples, "barycenter samples")
    if Xr.shape[1] != Xs.shape[1]:
        raise FedalignError(f"target features have d={Xr.shape[1]}, the samples d={Xs.shape[1]}")
    if Xr.shape[1] < 2:
        raise FedalignError("a 2-D embedding needs features of dimension ≥ 2")
    keep = yr >= 0
    if not keep.any():
        raise FedalignError("the target features have no labels: cannot colour the classes")
    Xr, yr = Xr[keep], yr[keep]
    if not len(Xs):
        raise FedalignError("no samples of the barycenter to draw")
    missing = sorted({int(c) for c in missing_classes})
    rng = np.random.default_rng(seed)
    Xr, yr = _subsample(Xr, yr, max_points, rng)
    Xs, ys = _subsample(Xs, ys, max_points, rng)
    if method == "tsne" and len(Xr) + len(Xs) < 10:
        raise FedalignError("t-SNE needs at least 10 points: use method pca")
    Zr, Zs = project_2d(Xr, Xs, method, seed)
    names = [str(c) for c in class_names or ()]

    def cname(c):
        return f"{names[c]} (class {c})" if 0 <= c < len(names) else f"class {c}"

    groups = []
    for src, Z, y, grey, marker, what in (
            ("real", Zr, yr, GREY_REAL, REAL_MARKER, "real target"),
            ("reconstructed", Zs, ys, GREY_SAMPLE, SAMPLE_MARKER, "samples of B(α_T)")):
        sel = ~np.isin(y, missing)
        groups.append(dict(source=src, classes="present", missing=False, n=int(sel.sum()),
                           color=grey, marker=marker, label=f"{what}: present classes",
                           _Z=Z[sel]))
    for col, c in zip(_missing_palette(len(missing)), missing):
        for src, Z, y, marker, what in (("real", Zr, yr, REAL_MARKER, "real target"),
                                        ("reconstructed", Zs, ys, SAMPLE_MARKER,
                                         "samples of B(α_T)")):
            sel = y == c
            groups.append(dict(source=src, classes=c, missing=True, n=int(sel.sum()),
                               color=col, marker=marker,
                               label=f"{what}: {cname(c)}, missing", _Z=Z[sel]))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for g in groups:                     # grey first, the missing classes on top
        Z = g.pop("_Z")
        if not len(Z):
            continue
        filled = g["marker"] == REAL_MARKER
        ax.scatter(Z[:, 0], Z[:, 1], s=14 if filled else 22, marker=g["marker"],
                   color=g["color"], alpha=0.55 if filled else 0.9,
                   linewidths=0 if filled else 1.0, label=g["label"],
                   zorder=3 if g["missing"] else 2)
    axis = {"tsne": "t-SNE", "pca": "PC"}[method]
    ax.set_xlabel(f"{axis} 1")
    ax.set_ylabel(f"{axis} 2")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(title=f"{REAL_MARKER} real target features, {SAMPLE_MARKER} samples of B(α_T)",
              fontsize=7, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    miss = ", ".join(cname(c) for c in missing) or "none"
    ax.set_title(title or f"Target reconstructed by B(α_T) ({axis})\n"
                          f"missing classes in colour: {miss}; present classes in grey",
                 fontsize=10)
    return fig, dict(method=method, n_real=int(len(Zr)), n_samples=int(len(Zs)), groups=groups)


def plot_reconstruction(X_target, y_target, X_samples, y_samples, missing_classes,
                        out="reconstruction.png", method: str = "tsne", seed: int = 0,
                        max_points: int | None = 1000, class_names=None,
                        title: str | None = None) -> dict:
    """Write the reconstruction picture (:func:`reconstruction_figure`) as a PNG.

    Returns the figure's ``info`` dict with ``path`` (the PNG) added.
    """
    fig, info = reconstruction_figure(X_target, y_target, X_samples, y_samples, missing_classes,
                                      method, seed, max_points, class_names, title)
    try:
        info["path"] = _save(fig, out)
    finally:
        _pyplot().close(fig)
    return info

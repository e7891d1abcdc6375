"""Pictures people would rather look at than read (PNG via matplotlib's Agg backend).

- :func:`plot_embedding` — a 2-D projection (PCA, or t-SNE) of several clients' features
  before and after alignment, coloured by client and marked by class. Both panels share one
  projection fitted on the *before* features, so movement is visible.
- :func:`plot_accuracy` — grouped bars of per-domain accuracy for several reports (e.g.
  baseline vs +SLOT).
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
    sets are embedded jointly.
    """
    if method == "pca":
        from sklearn.decomposition import PCA

        pca = PCA(2, random_state=seed).fit(X_before)
        return pca.transform(X_before), None if X_after is None else pca.transform(X_after)
    if method == "tsne":
        from sklearn.manifold import TSNE

        both = X_before if X_after is None else np.vstack([X_before, X_after])
        Z = TSNE(2, random_state=seed, init="pca", perplexity=min(30, max(5, len(both) // 10))).fit_transform(both)
        return Z[: len(X_before)], None if X_after is None else Z[len(X_before):]
    raise FedalignError(f"--method must be pca or tsne, got {method!r}")


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
    plt = _pyplot()
    panels = [("before alignment", Zb)] + ([("after alignment", Za)] if Za is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, (name, Z) in zip(axes[0], panels):
        for k, client in enumerate(names):
            for j, cls in enumerate(np.unique(y)):
                sel = (c == k) & (y == cls)
                ax.scatter(Z[sel, 0], Z[sel, 1], s=10, alpha=0.6, color=cmap(k % 10),
                           marker=_MARKERS[j % len(_MARKERS)],
                           label=client if j == 0 else None)
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][0].legend(title="client (colour); class = marker", fontsize=8, loc="best")
    fig.suptitle(title or f"{method.upper()} of client features")
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
    from fedalign.files import read_report

    series = {}
    for i, path in enumerate(reports):
        rep = read_report(path)
        methods = rep.get("methods", {})
        if not methods:
            raise FedalignError(f"{path}: report holds no method results")
        m = method or next(iter(methods))
        if m not in methods:
            raise FedalignError(f"{path}: no results for method {m!r} (has {', '.join(methods)})")
        summ = methods[m]["summary"]
        al = rep.get("alignment")
        label = (labels[i] if labels else
                 f"{m} baseline" if not al else f"{m} +SLOT τ={al['tau']:g}")
        series[label] = {d: v["mean"] for d, v in summ.items() if d != "macro"}
    return series

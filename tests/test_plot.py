"""Plots draw what they say (bar heights, colours and curves read back from the PNG pixels, the
figures' artists); bad input is a clean error."""

import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.errors import FedalignError
from fedalign.files import write_report
from fedalign.plot import accuracy_series_from_reports, plot_accuracy, plot_embedding

PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
    """RGB pixels (H, W, 3) in [0, 1] of a PNG file, after checking its signature."""
    import matplotlib.image as mpimg

    assert open(path, "rb").read(8) == PNG
    return mpimg.imread(path)[..., :3]


def _axes_columns(img):
    """img restricted to the columns between the axes' left and right spines (the two
    outermost dark columns spanning most of the height): the legend outside is left out."""
    cols = np.flatnonzero((img.max(-1) < 0.3).sum(0) > 0.5 * img.shape[0])
    assert len(cols) >= 2 and cols[-1] - cols[0] > 0.3 * img.shape[1], cols
    return img[:, cols[0] + 2: cols[-1] - 1]


def _hue_pixels(img, colour, min_saturation=0.3, tol=0.02) -> int:
    """How many pixels have the hue of ``colour`` (a transparent marker blended with white
    keeps its hue); greys, black and white never count."""
    import matplotlib.colors as mcolors

    hsv = mcolors.rgb_to_hsv(np.clip(img, 0, 1))
    h = mcolors.rgb_to_hsv(np.array(mcolors.to_rgb(colour)))[0]
    d = np.abs(hsv[..., 0] - h)
    return int(((hsv[..., 1] >= min_saturation) & (np.minimum(d, 1 - d) < tol)).sum())


def _bar_heights(img, colour):
    """Heights in pixels of the bars of one solid colour, left to right: the longest vertical
    run of that colour in each group of adjacent columns (groups much narrower than the widest
    are legend patches)."""
    import matplotlib.colors as mcolors

    m = np.abs(img - np.array(mcolors.to_rgb(colour))).max(-1) < 0.02
    xs = np.flatnonzero(m.any(0))
    groups = np.split(xs, np.flatnonzero(np.diff(xs) > 1) + 1)
    heights = []
    for g in groups:
        if len(g) < 0.6 * max(map(len, groups)):
            continue                                        # a legend patch, not a bar
        runs = []
        for x in g:
            col = np.concatenate([[0], m[:, x].astype(np.int8), [0]])
            edges = np.flatnonzero(np.diff(col))
            runs.append((edges[1::2] - edges[::2]).max())
        heights.append(int(max(runs)))
    return heights


def test_embedding_before_after(feature_file, tmp_path):
    a, _, _ = feature_file("a.h5", n=60, d=6, seed=0)
    b, _, _ = feature_file("b.h5", n=50, d=6, seed=1, shift=3)
    out = plot_embedding([a, b], [a, b], tmp_path / "e.png", max_points=40)
    assert out.read_bytes()[:8] == PNG
    # two panels (before | after), each with coloured points, not a blank or one-panel image
    import matplotlib.image as mpimg

    img = mpimg.imread(out)[..., :3]
    sat = img.max(-1) - img.min(-1)
    assert img.shape[1] > 1.4 * img.shape[0]
    w = sat.shape[1]
    assert (sat[:, : w // 2] > 0.3).sum() > 500 and (sat[:, w // 2:] > 0.3).sum() > 500
    one = plot_embedding([a, b], None, tmp_path / "e1.png", max_points=40)
    assert mpimg.imread(one).shape[1] < 0.8 * img.shape[1]     # one panel without --after


def test_embedding_rejects_mismatch(feature_file, tmp_path):
    a, _, _ = feature_file("a.h5", n=30, d=6)
    b, _, _ = feature_file("b.h5", n=30, d=5)
    with pytest.raises(FedalignError, match="dimensions"):
        plot_embedding([a, b], None, tmp_path / "e.png")
    assert not (tmp_path / "e.png").exists()


def _report(path, tau):
    rep = {"alignment": None if tau is None else {"tau": tau, "reference_sha256": "x"},
           "methods": {"fedcgs": {"summary": {"A": {"mean": 0.8, "std": 0.0},
                                              "B": {"mean": 0.6, "std": 0.1},
                                              "macro": {"mean": 0.7, "std": 0.05}}}}}
    write_report(path, rep)


def test_accuracy_from_reports(tmp_path):
    _report(tmp_path / "b.json", None)
    _report(tmp_path / "s.json", 0.4)
    series = accuracy_series_from_reports([tmp_path / "b.json", tmp_path / "s.json"])
    assert list(series) == ["fedcgs baseline", "fedcgs +SLOT τ=0.4"]
    assert series["fedcgs baseline"] == {"A": 0.8, "B": 0.6}
    r = CliRunner().invoke(app, ["plot", "accuracy", str(tmp_path / "b.json"), "--method", "nope",
                                 "-o", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "no results for method" in r.output


def test_accuracy_bars_are_percent_heights_per_series_and_their_mean(tmp_path):
    """Two series, one in fractions and one in percent: six bars (A, B, mean per series) in the
    series' colours C0, C1, their heights proportional to 90, 30, 60 and 45, 60, 52.5 %."""
    out = plot_accuracy({"x": {"A": 0.9, "B": 0.3}, "y": {"A": 45.0, "B": 60.0}},
                        tmp_path / "acc.png")
    img = _png(out)
    got = _bar_heights(img, "C0") + _bar_heights(img, "C1")
    want = [90, 30, 60, 45, 60, 52.5]
    assert len(got) == 6, got
    scale = got[0] / want[0]
    np.testing.assert_allclose(np.array(got) / scale, want, rtol=0.02, atol=0.6)


def test_demo_data_cli(tmp_path):
    r = CliRunner().invoke(app, ["demo-data", str(tmp_path / "img"), "--per-domain", "12", "--size", "16"])
    assert r.exit_code == 0, r.output
    files = sorted((tmp_path / "img").rglob("*.png"))
    assert len(files) == 36 and {f.parts[-3] for f in files} == {"ink", "neon", "blocky"}
    r = CliRunner().invoke(app, ["demo-data", str(tmp_path / "img")])
    assert r.exit_code == 2 and "not empty" in r.output


# --------------------------------------------------------------------------------------------
# Reconstruction picture (DaDiL, Figure 5) and consensus plot
# --------------------------------------------------------------------------------------------


def _recon_data(seed=0, n=90, m=60, d=4):
    rng = np.random.default_rng(seed)
    centers = np.eye(3, d) * 8
    y = np.arange(n) % 3
    X = centers[y] + rng.normal(size=(n, d))
    y[:6] = -1                                               # unlabelled rows are left out
    ys = np.arange(m) % 3
    Xs = centers[ys] + rng.normal(size=(m, d)) * 1.2
    return X, y, Xs, ys


def test_reconstruction_figure_content():
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt
    from sklearn.decomposition import PCA

    from fedalign.plot import GREY_REAL, GREY_SAMPLE, reconstruction_figure

    X, y, Xs, ys = _recon_data()
    fig, info = reconstruction_figure(X, y, Xs, ys, [2], method="pca", max_points=None,
                                      class_names=["bike", "car", "mug"])
    try:
        keep = y >= 0
        assert info["n_real"] == keep.sum() and info["n_samples"] == len(ys)
        g = {(x["source"], x["classes"]): x for x in info["groups"]}
        assert set(g) == {("real", "present"), ("reconstructed", "present"), ("real", 2),
                          ("reconstructed", 2)}
        assert g["real", "present"]["n"] == np.isin(y, [0, 1]).sum()
        assert g["real", 2]["n"] == (y == 2).sum() and g["reconstructed", 2]["n"] == (ys == 2).sum()
        assert g["real", "present"]["color"] == GREY_REAL
        assert g["reconstructed", "present"]["color"] == GREY_SAMPLE
        miss = mcolors.to_rgb(g["real", 2]["color"])
        assert g["reconstructed", 2]["color"] == g["real", 2]["color"]
        assert max(miss) - min(miss) > 0.2                    # a colour, not a grey
        assert g["real", 2]["marker"] != g["reconstructed", 2]["marker"]
        ax = fig.axes[0]
        cols = ax.collections
        assert len(cols) == 4
        assert [len(c.get_offsets()) for c in cols] == [x["n"] for x in info["groups"]]
        for c, x in zip(cols, info["groups"]):
            np.testing.assert_allclose(c.get_facecolor()[0][:3], mcolors.to_rgb(x["color"]))
        # PCA coordinates: fitted on the real (labelled) rows, the samples projected into it
        pca = PCA(2, random_state=0).fit(X[keep])
        Zr, Zs = pca.transform(X[keep]), pca.transform(Xs)
        np.testing.assert_allclose(cols[0].get_offsets(), Zr[np.isin(y[keep], [0, 1])], atol=1e-9)
        np.testing.assert_allclose(cols[3].get_offsets(), Zs[ys == 2], atol=1e-9)
        assert ax.get_xlabel() == "PC 1" and ax.get_ylabel() == "PC 2"
        assert "mug (class 2)" in ax.get_title() and "grey" in ax.get_title()
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(labels) == 4 and sum("missing" in t for t in labels) == 2
        assert any("present" in t and "B(α_T)" in t for t in labels)
    finally:
        plt.close(fig)


def test_reconstruction_png_tsne_subsample_and_errors(tmp_path):
    from fedalign.plot import plot_reconstruction

    X, y, Xs, ys = _recon_data(1, n=40, m=30)
    info = plot_reconstruction(X, y, Xs, ys, [0, 2], tmp_path / "r.png", method="tsne",
                               max_points=15)
    assert info["method"] == "tsne"
    assert info["n_real"] == 15 and info["n_samples"] == 15
    assert sum(x["n"] for x in info["groups"]) == 30
    colours = {x["color"] for x in info["groups"] if x["missing"]}
    assert len(colours) == 2
    # the PNG draws both missing classes in their colours inside the axes, and no third colour
    img = _axes_columns(_png(info["path"]))
    from fedalign.plot import _missing_palette

    assert set(_missing_palette(3)[:2]) == colours
    assert all(_hue_pixels(img, c) > 100 for c in colours), [_hue_pixels(img, c) for c in colours]
    assert _hue_pixels(img, _missing_palette(3)[2]) == 0
    with pytest.raises(FedalignError, match="no labels"):
        plot_reconstruction(X, np.full(len(y), -1), Xs, ys, [2], tmp_path / "x.png", "pca")
    with pytest.raises(FedalignError, match="d="):
        plot_reconstruction(X, y, Xs[:, :3], ys, [2], tmp_path / "x.png", "pca")
    with pytest.raises(FedalignError, match="pca or tsne"):
        plot_reconstruction(X, y, Xs, ys, [2], tmp_path / "x.png", "umap")
    assert not (tmp_path / "x.png").exists()


@pytest.fixture
def recon_files(tmp_path):
    """A dictionary (atoms + a target state holding it), a report α and labelled features."""
    from test_dadil_envelope import ALPHA, sample_gmm, target, two_atoms

    from fedalign.files import sha256_file, write_features
    from fedalign.dadil.state import PublishedAtoms, init_client, save_atoms, save_state

    a = two_atoms()
    save_atoms(tmp_path / "a.atoms.npz", PublishedAtoms(a.means, a.variances, a.label_logits,
                                                        3, "amazon"))
    st = init_client("webcam", target(), n_atoms=2, n_classes=3)
    st.means, st.variances, st.label_logits, st.alpha = a.means, a.variances, a.label_logits, ALPHA
    save_state(tmp_path / "w.state.npz", st)
    X, y = sample_gmm(target(labeled=True), 60, np.random.default_rng(0))
    write_features(tmp_path / "t.h5", X, y, [str(i) for i in range(len(y))],
                   class_names=["bike", "car", "mug"])
    write_report(tmp_path / "env.json", {
        "producer": "fedalign dadil-envelope",
        "source": {"sha256": sha256_file(tmp_path / "a.atoms.npz")},
        "targets": {"reduced": {"alpha": [0.25, 0.75], "missing_classes": [2]},
                    "full": {"alpha": [0.3, 0.7], "missing_classes": None}}})
    return tmp_path


def test_reconstruction_cli(recon_files):
    p = recon_files
    r = CliRunner().invoke(app, ["plot", "reconstruction", "--state", str(p / "w.state.npz"),
                                 str(p / "t.h5"), "--missing", "mug", "--method", "pca",
                                 "--n-per-class", "20", "-o", str(p / "s.png")])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "0.30/0.70" in said and "2: 21 real / 20 reconstructed" in said, said
    r = CliRunner().invoke(app, ["plot", "reconstruction", "--atoms", str(p / "a.atoms.npz"),
                                 "--alpha", f"{p / 'env.json'}:reduced", str(p / "t.h5"),
                                 "--method", "pca", "--n-per-class", "20", "-o", str(p / "e.png")])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "0.25/0.75" in said and "missing classes: 2:" in said, said
    # both pictures: the one missing class (mug) in the first colour inside the axes, no other
    from fedalign.plot import _missing_palette

    first, second = _missing_palette(2)
    for png in (p / "s.png", p / "e.png"):
        img = _axes_columns(_png(png))
        assert _hue_pixels(img, first) > 100 and _hue_pixels(img, second) == 0, png


@pytest.mark.parametrize("args, words", [
    (["--state", "w.state.npz", "--atoms", "a.atoms.npz"], "either --state"),
    (["--atoms", "a.atoms.npz", "--missing", "2"], "give the target's --alpha"),
    (["--atoms", "a.atoms.npz", "--alpha", "0.5,0.6", "--missing", "2"], "summing to 1"),
    (["--atoms", "a.atoms.npz", "--alpha", "0.2,0.3,0.5", "--missing", "2"], "3 weights"),
    (["--atoms", "a.atoms.npz", "--alpha", "env.json", "--missing", "2"], "several fitted"),
    (["--atoms", "w.state.npz", "--alpha", "env.json:full", "--missing", "2"], "other atoms"),
    (["--state", "w.state.npz", "--missing", "boat"], "unknown class"),
    (["--state", "w.state.npz"], "give --missing"),
    (["--state", "nope.state.npz", "--missing", "2"], "no such file"),
    (["--state", "w.state.npz", "--missing", "2", "-o", "t.h5"], "refusing to overwrite"),
])
def test_reconstruction_cli_bad_input(recon_files, args, words):
    p = recon_files
    args = [str(p / a) if a.endswith((".npz", ".h5")) or a.startswith("env.json") else a
            for a in args]                                          # file names → tmp paths
    before = {f: f.read_bytes() for f in p.iterdir()}
    r = CliRunner().invoke(app, ["plot", "reconstruction", str(p / "t.h5"), "--method", "pca",
                                 *(args if "-o" in args else args + ["-o", str(p / "x.png")])])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.output
    assert {f: f.read_bytes() for f in p.iterdir()} == before


def _history(mean, rounds=None):
    mean = np.asarray(mean, dtype=float)
    return {"rounds": np.arange(len(mean)) if rounds is None else np.asarray(rounds),
            "mean": mean, "max": mean * 1.5}


def test_consensus_plot_integer_ticks_labels_and_log_scale(tmp_path):
    import matplotlib.pyplot as plt

    from fedalign.dadil.consensus import consensus_figure, plot_consensus

    for h, scale in ((_history([3.0, 2.0, 1.5]), "linear"),
                     (_history([300.0, 5.0, 0.5, 0.01]), "log"),
                     (_history([300.0, 1.0, 0.0], rounds=[0, 5, 10]), "symlog")):
        fig = consensus_figure({"aggregation": h})
        try:
            ax = fig.axes[0]
            fig.canvas.draw()
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
            assert ax.get_xlabel() == "round"
            assert ax.get_ylabel().startswith("M(t) = max over weights of W2")
            assert ax.get_yscale() == scale
        finally:
            plt.close(fig)
    # two runs: one colour each (C0, C1), its mean solid and its max dashed, in the figure…
    import matplotlib.colors as mcolors

    runs = {"a": _history([2.0, 1.0, 0.5]), "b": _history([1.0, 0.8, 0.2], rounds=[0, 2, 4])}
    fig = consensus_figure(runs)
    try:
        got = [(ln.get_label(), mcolors.to_hex(ln.get_color()), ln.get_linestyle(),
                list(ln.get_xdata()), list(ln.get_ydata())) for ln in fig.axes[0].get_lines()]
    finally:
        plt.close(fig)
    want = []
    for i, (name, h) in enumerate(runs.items()):
        col = mcolors.to_hex(f"C{i}")
        want += [(f"{name} (mean over pairs)", col, "-", list(h["rounds"]), list(h["mean"])),
                 (f"{name} (max)", col, "--", list(h["rounds"]), list(h["max"]))]
    assert got == want
    # …and in the PNG
    img = _axes_columns(_png(plot_consensus(runs, tmp_path / "c.png")))
    assert _hue_pixels(img, "C0") > 300 and _hue_pixels(img, "C1") > 300
    assert _hue_pixels(img, "C2") == 0

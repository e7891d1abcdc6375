"""Progress of long work: a bar on a terminal, plain lines every few seconds otherwise
(fedalign.progress), used by barycenter, align, stats and extract; output that is not a
terminal is not folded at 80 columns."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.progress import Progress, format_seconds

runner = CliRunner()


def _plain_console():
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, soft_wrap=True, width=300), buf


def test_plain_lines_while_running_and_a_closing_line():
    console, buf = _plain_console()
    with Progress(100, "align c3.h5", unit="rows", console=console, every=0.02) as bar:
        assert bar.plain
        for _ in range(10):
            time.sleep(0.01)
            bar(10)
        time.sleep(0.05)
    lines = buf.getvalue().splitlines()
    assert len(lines) >= 2 and bar.lines == len(lines)
    assert all(line.startswith("align c3.h5: ") for line in lines)
    assert lines[-1].startswith("align c3.h5: 100/100 rows (100 %)") and "elapsed" in lines[-1]


def test_plain_lines_also_when_nothing_advances():
    """A model loading or a slow first batch still prints lines (the heartbeat)."""
    console, buf = _plain_console()
    with Progress(50, "extract x.h5", unit="img", console=console, every=0.02):
        time.sleep(0.12)
    lines = buf.getvalue().splitlines()
    assert len(lines) >= 3 and "0/50 img (0 %)" in lines[0]


def test_short_steps_print_nothing_and_errors_no_closing_line():
    console, buf = _plain_console()
    with Progress(3, "stats s.h5", console=console, every=10) as bar:
        bar(3)
    assert buf.getvalue() == ""
    with pytest.raises(RuntimeError):
        with Progress(3, "stats s.h5", console=console, every=0.01):
            time.sleep(0.05)
            raise RuntimeError("boom")
    lines = buf.getvalue().splitlines()
    assert lines and all("0/3 rows" in line for line in lines)  # no closing line after an error


def test_unknown_total_with_a_note():
    console, buf = _plain_console()
    bar = Progress(None, "barycenter K=3 d=8", unit="iterations", console=console)
    bar._t0 = time.perf_counter() - 2.0
    bar.update(completed=7, note="residual 3.2e-06 (tol 1e-10)")
    line = bar.line()
    assert line.startswith("barycenter K=3 d=8: 7 iterations, residual 3.2e-06 (tol 1e-10), ")
    assert "elapsed" in line and "left" not in line


def test_a_bar_on_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with Progress(20, "align t.h5", console=console) as bar:
        assert not bar.plain
        bar.log("a message [not markup]")
        bar(20)
    text = buf.getvalue()
    assert "align t.h5" in text and "20/20" in text and "a message [not markup]" in text


def test_format_seconds():
    assert format_seconds(3.21) == "3.2 s"
    assert format_seconds(125) == "2 min 05 s"
    assert format_seconds(3 * 3600 + 120) == "3 h 02 min"


def test_env_sets_the_interval(monkeypatch):
    monkeypatch.setenv("FEDALIGN_PROGRESS_EVERY", "0.5")
    assert Progress(1, "x", console=_plain_console()[0]).every == 0.5
    monkeypatch.setenv("FEDALIGN_PROGRESS_EVERY", "soon")
    assert Progress(1, "x", console=_plain_console()[0]).every == 5.0


# --------------------------------------------------------------------------------------------
# the commands
# --------------------------------------------------------------------------------------------


def _stats(feature_file, tmp_path, k=3, d=24):
    paths = []
    for i in range(k):
        p, _, _ = feature_file(f"c{i}.h5", n=150, d=d, seed=i, shift=i)
        s = tmp_path / f"c{i}.stats.npz"
        r = runner.invoke(app, ["stats", str(p), "-o", str(s)])
        assert r.exit_code == 0, r.output
        paths.append(s)
    return paths


def test_barycenter_reports_iterations(feature_file, tmp_path, monkeypatch):
    stats = _stats(feature_file, tmp_path)
    import fedalign.gaussian as g

    seen = []
    real = g._iterate

    def slow_iterate(S, covs, weights, tol, max_iter, anderson, workers, cb=None, *rest):
        # a slow fixed point: every iteration takes a while

        def progress(it, rel, res):
            seen.append(it)
            time.sleep(0.02)
            cb(it, rel, res)

        return real(S, covs, weights, tol, max_iter, anderson, workers, progress, *rest)

    monkeypatch.setattr(g, "_iterate", slow_iterate)
    monkeypatch.setenv("FEDALIGN_PROGRESS_EVERY", "0.01")
    r = runner.invoke(app, ["barycenter", *map(str, stats), "-o", str(tmp_path / "ref.npz")])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("barycenter K=3 d=24: ")]
    assert seen and lines, r.output
    assert f"{seen[-1]} iterations, residual" in lines[-1] and "(tol 1e-10)" in lines[-1]


def test_align_checks_its_output_folder_before_the_map(feature_file, tmp_path, monkeypatch):
    stats = _stats(feature_file, tmp_path, k=2, d=6)
    r = runner.invoke(app, ["barycenter", *map(str, stats), "-o", str(tmp_path / "ref.npz")])
    assert r.exit_code == 0, r.output
    import fedalign.align
    import fedalign.stats

    calls = []
    monkeypatch.setattr(fedalign.stats, "compute_stats", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(fedalign.align, "client_map", lambda *a, **k: calls.append(a))
    r = runner.invoke(app, ["align", str(tmp_path / "c0.h5"), str(tmp_path / "ref.npz"),
                            "-o", str(tmp_path / "aligned" / "c0.h5")])
    assert r.exit_code == 2 and "output folder does not exist" in r.output
    assert calls == []  # refused before any statistics or map were computed


def test_align_reports_its_whole_time(feature_file, tmp_path, monkeypatch):
    stats = _stats(feature_file, tmp_path, k=2, d=6)
    runner.invoke(app, ["barycenter", *map(str, stats), "-o", str(tmp_path / "ref.npz")])
    import fedalign.align

    real = fedalign.align.client_map

    def slow_map(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(fedalign.align, "client_map", slow_map)
    r = runner.invoke(app, ["align", str(tmp_path / "c0.h5"), str(tmp_path / "ref.npz"),
                            "-o", str(tmp_path / "c0.al.h5")])
    assert r.exit_code == 0, r.output
    import re

    m = re.search(r"\((\d+\.\d+)s in all, (\d+\.\d+)s for the map\)", r.output)
    assert m and float(m.group(1)) >= 0.3 and float(m.group(2)) >= 0.3, r.output


def _images(root):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        for i in range(2):
            (root / f"c{c}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(
                root / f"c{c}" / f"i{i}.png")
    return root


@pytest.mark.slow  # imports torch and timm (~6 s on its own)
def test_extract_says_it_loads_the_model_and_prints_plain_lines(tmp_path, monkeypatch):
    import fedalign.progress as fp

    monkeypatch.setattr(fp, "_every", lambda: 0.001)  # 4 tiny images take less than the 0.05 s floor
    tree = _images(tmp_path / "imgs")
    r = runner.invoke(app, ["extract", str(tree), "-o", str(tmp_path / "x.h5"), "--model",
                            "test_efficientnet", "--weights", "random", "--image-size", "32",
                            "--device", "cpu", "--threads", "1", "--workers", "0",
                            "--batch-size", "2"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "loading test_efficientnet (random weights) on cpu" in out
    assert "model ready: d=" in out
    assert out.index("loading test_efficientnet") < out.index("model ready")
    assert any(line.startswith("extract x.h5: ") and " img " in line for line in out.splitlines())


# --------------------------------------------------------------------------------------------
# output that is not a terminal
# --------------------------------------------------------------------------------------------


def test_non_terminal_output_is_not_folded(monkeypatch):
    from fedalign.cli.app import _console

    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    c = _console(stderr=True)
    assert not c.is_terminal and c.width == 200 and _console().width == 200
    c.file = buf
    long = "align: n=100 τ=0.4 (1.00s) → " + "out/" * 30 + "slot-baseline.json"
    c.print(long)
    assert buf.getvalue() == long + "\n"


def test_cli_message_with_a_long_path_is_one_line(feature_file, tmp_path):
    deep = tmp_path / ("a-rather-long-folder-name-" * 4)
    deep.mkdir()
    p, _, _ = feature_file("f.h5", n=40, d=4)
    out = deep / "f.stats.npz"
    r = runner.invoke(app, ["stats", str(p), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert any(line.startswith("stats: ") and line.endswith(str(out)) for line in r.output.splitlines())

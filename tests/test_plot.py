"""Plots are written, non-empty PNGs; bad input is a clean error."""

import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.errors import FedalignError
from fedalign.files import write_report
from fedalign.plot import accuracy_series_from_reports, plot_accuracy, plot_embedding

PNG = b"\x89PNG\r\n\x1a\n"


def test_embedding_before_after(feature_file, tmp_path):
    a, _, _ = feature_file("a.h5", n=60, d=6, seed=0)
    b, _, _ = feature_file("b.h5", n=50, d=6, seed=1, shift=3)
    out = plot_embedding([a, b], [a, b], tmp_path / "e.png", max_points=40)
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 5000


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
    out = plot_accuracy(series, tmp_path / "acc.png")
    assert out.read_bytes()[:8] == PNG
    r = CliRunner().invoke(app, ["plot", "accuracy", str(tmp_path / "b.json"), "--method", "nope",
                                 "-o", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "no results for method" in r.output


def test_demo_data_cli(tmp_path):
    r = CliRunner().invoke(app, ["demo-data", str(tmp_path / "img"), "--per-domain", "12", "--size", "16"])
    assert r.exit_code == 0, r.output
    files = sorted((tmp_path / "img").rglob("*.png"))
    assert len(files) == 36 and {f.parts[-3] for f in files} == {"ink", "neon", "blocky"}
    r = CliRunner().invoke(app, ["demo-data", str(tmp_path / "img")])
    assert r.exit_code == 2 and "not empty" in r.output

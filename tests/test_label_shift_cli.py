"""`fedalign target-reference` through real processes (bad input in process): the completed reference of a shifted
target that lacks a class, `align --tau 1` onto it, and bad input (exit 2, nothing written)."""

import subprocess
import sys

import numpy as np
import pytest

from fedalign.align import load_reference
from fedalign.files import read_features, write_features
from fedalign.label_shift import reference_from_files

MEANS = np.array([[0.0, 0.0, 0.0], [4.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
DELTA = np.array([1.5, -1.0, 2.0])


def fedalign(*args):
    return subprocess.run([sys.executable, "-m", "fedalign", *map(str, args)],
                          capture_output=True, text=True)


def _write(path, rng, counts, shift=0.0, d=3):
    X = np.concatenate([rng.normal(np.resize(MEANS[c], d) + shift, 1.0, size=(n, d))
                        for c, n in enumerate(counts)]).astype(np.float32)
    y = np.repeat(np.arange(len(counts)), counts)
    write_features(path, X, y, np.arange(len(y)), class_names=["a", "b", "c"])
    return path


@pytest.fixture
def federation(tmp_path):
    rng = np.random.default_rng(0)
    srcs = [_write(tmp_path / f"s{k}.h5", rng, [200, 200, 200]) for k in range(2)]
    target = _write(tmp_path / "t.h5", rng, [200, 200, 0], shift=DELTA)
    stats = []
    for p in srcs:
        s = p.with_suffix(".stats.npz")
        r = fedalign("stats", p, "-o", s, "--per-class")
        assert r.returncode == 0, r.stderr
        stats.append(s)
    return tmp_path, srcs, target, stats


def test_target_reference_then_align_puts_the_missing_class_in_place(federation):
    tmp, srcs, target, stats = federation
    r = fedalign("target-reference", target, *stats, "-o", tmp / "ref.npz")
    assert r.returncode == 0, r.stderr
    assert "classes absent from the target: 2" in r.stderr
    ref = load_reference(tmp / "ref.npz")
    lib, rec = reference_from_files(target, stats)
    np.testing.assert_array_equal(ref.mean, lib.mean)
    assert ref.meta["label_shift"]["absent"] == [2] == rec["absent"]
    assert ref.meta["producer"] == "fedalign target-reference"
    r = fedalign("align", srcs[0], tmp / "ref.npz", "--tau", "1", "-o", tmp / "s0.to_t.h5")
    assert r.returncode == 0, r.stderr
    Z, y, _ = read_features(tmp / "s0.to_t.h5")
    assert np.linalg.norm(Z[y == 2].mean(0) - (MEANS[2] + DELTA)) < 0.5


def in_process(*args):
    """The same command through typer's CliRunner (bad inputs: no process start each)."""
    from typer.testing import CliRunner

    from fedalign.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.output)


def _one_error(r, *words):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_inputs_write_nothing(federation):
    tmp, srcs, target, stats = federation
    plain = tmp / "plain.stats.npz"
    assert in_process("stats", srcs[0], "-o", plain).returncode == 0
    _one_error(in_process("target-reference", target, plain, "-o", tmp / "r1.npz"), "--per-class")
    wide = _write(tmp / "wide.h5", np.random.default_rng(1), [50, 50, 50], d=4)
    assert in_process("stats", wide, "-o", tmp / "wide.stats.npz", "--per-class").returncode == 0
    _one_error(in_process("target-reference", target, stats[0], tmp / "wide.stats.npz", "-o",
                        tmp / "r2.npz"), "dimension mismatch")
    _one_error(in_process("target-reference", target, stats[0], "-o", stats[0]))
    bad = tmp / "bad.stats.npz"
    bad.write_bytes(b"not a stats file")
    _one_error(in_process("target-reference", target, bad, "-o", tmp / "r3.npz"))
    assert not any((tmp / n).exists() for n in ("r1.npz", "r2.npz", "r3.npz"))
    assert not list(tmp.glob("*.tmp*"))

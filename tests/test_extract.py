"""Tests for fedalign.extract and ``fedalign extract``: tiny random timm models, generated images."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.errors import FedalignError
from fedalign.extract import extract_features, list_images, partial_path, read_list_file
from fedalign.files import read_features

MODEL = "test_efficientnet"  # ~0.1 M parameters, random init
SIZE = 48  # small inputs keep every forward pass cheap
FAST = dict(model=MODEL, weights="random", image_size=SIZE, device="cpu", workers=0, threads=1)
CLI_FAST = ["--model", MODEL, "--weights", "random", "--image-size", str(SIZE), "--device", "cpu",
            "--threads", "1"]


def _image(path: Path, seed: int, mode="RGB", size=None):
    rng = np.random.default_rng(seed)
    w, h = size or (int(rng.integers(30, 70)), int(rng.integers(30, 70)))
    if mode == "L":
        arr = rng.integers(0, 256, (h, w), dtype=np.uint8)
    else:
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    img = Image.fromarray(arr, mode="L" if mode == "L" else "RGB")
    if mode == "RGBA":
        img = img.convert("RGBA")
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def make_tree(root: Path, per_class=(3, 2, 4), seed=0) -> Path:
    """ImageFolder tree ``root/c{k}/img{i}.{png,jpg}`` with gray, RGBA and JPEG images."""
    k = seed * 1000
    for c, m in enumerate(per_class):
        for i in range(m):
            ext = "jpg" if i % 2 else "png"
            mode = ["RGB", "L", "RGBA"][(c + i) % 3] if ext == "png" else ["RGB", "L"][(c + i) % 2]
            _image(root / f"c{c}" / f"img{i:02d}.{ext}", k, mode)
            k += 1
    return root


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "imgs")


# --------------------------------------------------------------------------------------------
# Listing
# --------------------------------------------------------------------------------------------


def test_imagefolder_listing_sorted_with_labels(tree):
    _image(tree / "c1" / ".ipynb_checkpoints" / "x.png", 99)  # hidden entries are skipped
    (tree / "c2" / "notes.txt").write_text("not an image")
    lst = list_images(tree)
    assert lst.class_names == ["c0", "c1", "c2"]
    assert lst.ids == sorted(lst.ids)
    assert lst.ids[:3] == ["c0/img00.png", "c0/img01.jpg", "c0/img02.png"]
    np.testing.assert_array_equal(lst.labels, [0, 0, 0, 1, 1, 2, 2, 2, 2])
    assert all(p.is_file() for p in lst.paths)


def test_unlabeled_folder_and_errors(tree, tmp_path):
    lst = list_images(tree, unlabeled=True)
    assert len(lst) == 9 and lst.class_names == [] and set(lst.labels) == {-1}
    flat = tmp_path / "flat"
    _image(flat / "a.png", 1)
    with pytest.raises(FedalignError, match="unlabeled=True"):
        list_images(flat)
    assert list_images(flat, unlabeled=True).ids == ["a.png"]
    with pytest.raises(FedalignError, match="no such input"):
        list_images(tmp_path / "nope")


def test_list_files_csv_names_txt_ints_and_unlabeled(tree, tmp_path):
    csv = tmp_path / "l.csv"
    csv.write_text("path,label\nc2/img00.png,zebra\nc0/img01.jpg,ant\nc1/img00.png,zebra\n")
    lst = read_list_file(csv, root=tree)
    assert lst.ids == ["c2/img00.png", "c0/img01.jpg", "c1/img00.png"]  # list order kept
    assert lst.class_names == ["ant", "zebra"]
    np.testing.assert_array_equal(lst.labels, [1, 0, 1])
    txt = tree / "l.txt"
    txt.write_text("# a comment\nc0/img00.png 3\n\nc1/img01.jpg\t0\n")
    lst = list_images(txt)  # relative to the list's folder
    np.testing.assert_array_equal(lst.labels, [3, 0])
    assert lst.class_names == ["0", "1", "2", "3"]
    assert set(list_images(txt, unlabeled=True).labels) == {-1}
    nolab = tree / "n.txt"
    nolab.write_text(f"{tree / 'c0/img00.png'}\nc0/img01.jpg\n")
    lst = list_images(nolab)
    assert set(lst.labels) == {-1} and lst.paths[0].is_absolute()
    for text, msg in [("a.png,1\nb.png\n", "every row"), ("a.png\na.png\n", "twice"),
                      ("path,label\n", "empty")]:
        (tmp_path / "bad.csv").write_text(text)
        with pytest.raises(FedalignError, match=msg):
            read_list_file(tmp_path / "bad.csv")


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------


def _direct_features(paths, image_size=SIZE, seed=0):
    """Independent oracle: timm transform + the same randomly initialised model, one image at a time."""
    import timm
    import torch
    from timm.data import create_transform, resolve_data_config

    torch.manual_seed(seed)
    m = timm.create_model(MODEL, pretrained=False, num_classes=0).eval()
    cfg = resolve_data_config({}, model=m)
    cfg["input_size"] = (3, image_size, image_size)
    t = create_transform(**cfg)
    with torch.no_grad():
        return np.concatenate([m(t(Image.open(p).convert("RGB"))[None]).numpy() for p in paths])


def test_extract_matches_direct_forward_and_records_provenance(tree, tmp_path):
    out = tmp_path / "f.h5"
    lst = list_images(tree)
    res = extract_features(lst, out, batch_size=4, **FAST)
    X, y, info = read_features(out)
    assert (res.n, res.d) == X.shape == (9, 256)
    np.testing.assert_allclose(X, _direct_features(lst.paths), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(y, lst.labels)
    assert list(info["ids"]) == lst.ids and info["class_names"] == ["c0", "c1", "c2"]
    prov = info["provenance"]
    assert prov["model"] == MODEL and prov["weights"]["weights"] == "random"
    assert prov["data_config"]["input_size"] == [3, SIZE, SIZE]
    assert prov["listing_sha256"] == lst.sha256() and prov["n_inputs"] == 9
    assert len(prov["inputs_sha256"]) == 64
    assert not partial_path(out).exists()
    with h5py.File(out) as h5:
        assert json.loads(h5.attrs["skipped"]) == []


def test_output_deterministic_across_workers(tree, tmp_path):
    lst = list_images(tree)
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    extract_features(lst, a, batch_size=4, **FAST)
    extract_features(lst, b, batch_size=4, **{**FAST, "workers": 2})
    assert a.read_bytes() == b.read_bytes()


def test_interrupted_run_resumes_to_identical_file(tree, tmp_path):
    lst = list_images(tree)
    full, out = tmp_path / "full.h5", tmp_path / "resumed.h5"
    extract_features(lst, full, batch_size=2, **FAST)

    def interrupt_after_two_batches(k, seen=[]):  # noqa: B006 - counts calls
        seen.append(k)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract_features(lst, out, batch_size=2, progress=interrupt_after_two_batches, **FAST)
    assert not out.exists() and partial_path(out).exists()
    msgs = []
    res = extract_features(lst, out, batch_size=2, log=msgs.append, **FAST)
    assert res.resumed_from == 4 and any("resuming" in m for m in msgs)
    assert out.read_bytes() == full.read_bytes()
    assert not partial_path(out).exists()


def test_changed_settings_start_over(tree, tmp_path):
    lst = list_images(tree)
    out = tmp_path / "o.h5"

    def stop(k):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract_features(lst, out, batch_size=2, progress=stop, **FAST)
    msgs = []
    res = extract_features(lst, out, batch_size=3, log=msgs.append, **FAST)
    assert res.resumed_from == 0 and any("over" in m for m in msgs)
    with h5py.File(out) as h5:
        assert json.loads(h5.attrs["provenance"])["batch_size"] == 3


@pytest.mark.slow  # a real process killed mid-run (like tests/test_faults.py): ~3 s of torch start-ups
def test_kill_subprocess_mid_run_then_resume(tree, tmp_path):
    """SIGKILL a real extraction process after 2 committed batches; the rerun finishes it."""
    out, full = tmp_path / "k.h5", tmp_path / "full.h5"
    script = textwrap.dedent(f"""
        import os, signal
        from fedalign.extract import extract_features, list_images
        calls = []
        def progress(k):
            calls.append(k)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        extract_features(list_images({str(tree)!r}), {str(out)!r}, batch_size=2,
                         progress=progress, **{FAST!r})
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == -9, r.stderr
    assert partial_path(out).exists() and not out.exists()
    r = CliRunner().invoke(app, ["extract", str(tree), "-o", str(out), "--batch-size", "2",
                                 "--workers", "0", *CLI_FAST])
    assert r.exit_code == 0, r.output
    assert "resuming" in r.output and "at image 4" in r.output
    extract_features(list_images(tree), full, batch_size=2, **FAST)
    assert out.read_bytes() == full.read_bytes()


def test_corrupt_image_is_named_and_no_output(tree, tmp_path):
    bad = tree / "c1" / "img01.jpg"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated JPEG
    out = tmp_path / "x.h5"
    # in process (a subprocess would import torch again); the decoding worker is still a
    # separate process, whose error the main process reports
    r = CliRunner().invoke(app, ["extract", str(tree), "-o", str(out), "--batch-size", "4",
                                 "--workers", "1", *CLI_FAST])
    assert r.exit_code == 2, r.output
    assert "error:" in r.stderr and "c1/img01.jpg" in r.stderr and "--skip-bad" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() and not partial_path(out).exists()


def test_skip_bad_lists_the_file(tree, tmp_path):
    (tree / "c0" / "img02.png").write_bytes(b"not an image")
    out = tmp_path / "s.h5"
    r = CliRunner().invoke(app, ["extract", str(tree), "-o", str(out), "--batch-size", "4",
                                 "--workers", "0", "--skip-bad", *CLI_FAST])
    assert r.exit_code == 0, r.output
    X, y, info = read_features(out)
    assert X.shape[0] == 8 and "c0/img02.png" not in list(info["ids"])
    with h5py.File(out) as h5:
        skipped = json.loads(h5.attrs["skipped"])
    assert [s["id"] for s in skipped] == ["c0/img02.png"] and "Error" in skipped[0]["error"]
    good = [p for p in list_images(tree).paths if p.name != "img02.png" or p.parent.name != "c0"]
    np.testing.assert_allclose(X, _direct_features(good), rtol=1e-4, atol=1e-5)


def test_cli_list_input_unlabeled(tree, tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text("c2/img02.png,2\nc0/img00.png,0\n")
    out = tmp_path / "l.h5"
    r = CliRunner().invoke(app, ["extract", str(lst), "--root", str(tree), "-o", str(out),
                                 "--unlabeled", "--workers", "0", *CLI_FAST])
    assert r.exit_code == 0, r.output
    assert "n=2 d=256" in r.output
    X, y, info = read_features(out)
    assert list(info["ids"]) == ["c2/img02.png", "c0/img00.png"] and list(y) == [-1, -1]


def test_bad_options_are_one_line_errors(tree, tmp_path):
    runner = CliRunner()
    for extra, msg in [(["--precision", "fp8"], "precision"), (["--device", "tpu"], "device"),
                       (["--model", "no_such_model"], "unknown timm model")]:
        args = ["extract", str(tree), "-o", str(tmp_path / "e.h5"), *CLI_FAST, *extra]
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and msg in r.output, r.output
    r = runner.invoke(app, ["extract", str(tree), "-o", str(tmp_path / "e.h5"), "--model", MODEL])
    assert r.exit_code == 2 and "builtin" in r.output  # builtin weights are for lite0 only
    assert not (tmp_path / "e.h5").exists()


# --------------------------------------------------------------------------------------------
# Several inputs in one process (--out-dir)
# --------------------------------------------------------------------------------------------


def _two_inputs(tmp_path):
    """An ImageFolder tree ``ink/`` and a list file ``other/neon.csv`` (→ ink.h5, neon.h5)."""
    ink = make_tree(tmp_path / "ink")
    other = make_tree(tmp_path / "other", per_class=(2, 3), seed=1)
    neon = other / "neon.csv"
    neon.write_text("c1/img02.png,b\nc0/img00.png,a\nc1/img00.png,b\nc0/img01.jpg,a\n"
                    "c1/img01.jpg,b\n")
    return ink, neon


def _multi(inputs, out_dir, *extra):
    return CliRunner().invoke(app, ["extract", *map(str, inputs), "--out-dir", str(out_dir),
                                    "--batch-size", "4", "--workers", "0", *CLI_FAST, *extra])


def test_out_dir_equals_one_call_per_input_and_loads_once(tmp_path):
    ink, neon = _two_inputs(tmp_path)
    out = tmp_path / "feats" / "new"  # created, parents too
    r = _multi([ink, neon], out)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["ink.h5", "neon.h5"]  # no resume file left
    assert r.output.count("loading test_efficientnet") == 1
    assert r.output.count("extract: n=") == 2 and "n=5 d=256" in r.output
    for src in (ink, neon):
        ref = tmp_path / f"ref.{src.stem}.h5"
        extract_features(list_images(src), ref, batch_size=4, **FAST)  # a fresh encoder each
        X, y, info = read_features(out / f"{src.stem}.h5")
        Xr, yr, ir = read_features(ref)
        assert X.dtype == Xr.dtype and X.tobytes() == Xr.tobytes()
        np.testing.assert_array_equal(y, yr)
        assert list(info["ids"]) == list(ir["ids"]) and info["provenance"] == ir["provenance"]
        assert (out / f"{src.stem}.h5").read_bytes() == ref.read_bytes()


def test_out_dir_argument_errors(tmp_path):
    ink, neon = _two_inputs(tmp_path)
    twin = make_tree(tmp_path / "b" / "ink", per_class=(1, 1))
    runner = CliRunner()
    r = _multi([ink, twin], tmp_path / "o")
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output
    assert str(ink) in r.output and str(twin) in r.output
    r = runner.invoke(app, ["extract", str(ink), str(neon), "-o", str(tmp_path / "x.h5"), *CLI_FAST])
    assert r.exit_code == 2 and "error:" in r.output and "--out-dir" in r.output, r.output
    r = runner.invoke(app, ["extract", str(ink), *CLI_FAST])
    assert r.exit_code == 2 and "-o FILE" in r.output and "--out-dir" in r.output, r.output
    r = runner.invoke(app, ["extract", str(ink), "-o", str(tmp_path / "x.h5"), "--out-dir",
                            str(tmp_path / "o"), *CLI_FAST])
    assert r.exit_code == 2 and "not both" in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "ink", "other"]


def test_out_dir_output_onto_an_input_is_refused_before_any_work(tmp_path):
    ink, neon = _two_inputs(tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    (out / "neon.h5").symlink_to(neon)  # the derived output names the list file
    before = neon.read_bytes()
    r = _multi([ink, neon], out)
    assert r.exit_code == 2 and "also an input" in r.output, r.output
    assert "loading" not in r.output  # refused before the model loads
    assert [p.name for p in out.iterdir()] == ["neon.h5"] and neon.read_bytes() == before


def test_out_dir_bad_second_input_writes_nothing(tmp_path):
    ink, neon = _two_inputs(tmp_path)
    bad = tmp_path / "other" / "c0" / "img01.jpg"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated JPEG, in the second input
    out = tmp_path / "o"
    r = _multi([ink, neon], out)
    assert r.exit_code == 2 and "c0/img01.jpg" in r.output and "Traceback" not in r.output
    assert "n=9 d=256" in r.output  # the first input was extracted …
    assert not out.exists()  # … and its file, resume file and the created folder are gone
    out.mkdir()
    r = _multi([ink, neon], out)
    assert r.exit_code == 2 and list(out.iterdir()) == []


def test_out_dir_interrupted_in_second_input_resumes_to_same_files(tmp_path, monkeypatch):
    from fedalign.extract import PartialStore

    ink, neon = _two_inputs(tmp_path)
    full, out = tmp_path / "full", tmp_path / "o"
    assert _multi([ink, neon], full).exit_code == 0
    commit = PartialStore.commit

    def commit_then_stop(self, *a, seen=[]):  # noqa: B006 - counts calls
        commit(self, *a)
        seen.append(1)
        if len(seen) == 4:  # ink: batches of 4, 4, 1; then the first of neon (4, 1)
            raise KeyboardInterrupt

    monkeypatch.setattr(PartialStore, "commit", commit_then_stop)
    r = _multi([ink, neon], out)
    assert r.exit_code == 130, r.output
    assert sorted(p.name for p in out.iterdir()) == [".ink.h5.partial.h5", ".neon.h5.partial.h5"]
    monkeypatch.setattr(PartialStore, "commit", commit)
    r = _multi([ink, neon], out)
    assert r.exit_code == 0, r.output
    assert "resumed at 9" in r.output and "resumed at 4" in r.output
    assert sorted(p.name for p in out.iterdir()) == ["ink.h5", "neon.h5"]
    for name in ("ink.h5", "neon.h5"):
        assert (out / name).read_bytes() == (full / name).read_bytes()


# ------------------------------------------------ what a fuzzer found: hangs, an overwritten image
def test_list_labels_beyond_the_class_bound_are_refused(tmp_path):
    """A label of 10⁹ made a list of 10⁹ class names (it hung); 10²⁰ raised OverflowError."""
    for label in ("1000000000", "99999999999999999999"):
        (tmp_path / "l.txt").write_text(f"a.png,0\nb.png,{label}\n")
        with pytest.raises(FedalignError, match=f"label {label} is beyond the 100,000 classes"):
            read_list_file(tmp_path / "l.txt")


def test_batch_and_image_sizes_are_bounded_before_any_work(tree, tmp_path):
    from fedalign.encoders import check_image_size

    for size in (0, 8, 4096):
        check_image_size(size)
    for size in (7, 4097, 100_000):
        with pytest.raises(FedalignError, match="image_size must be between 8 and 4096 pixels"):
            check_image_size(size)
    for bs in (65_537, 10**20, -1):
        with pytest.raises(FedalignError, match="batch_size must be between 1 and 65,536"):
            extract_features(list_images(tree), tmp_path / "o.h5", model="test_efficientnet",
                             weights="random", batch_size=bs)
    assert not (tmp_path / "o.h5").exists() and not partial_path(tmp_path / "o.h5").exists()


def test_an_image_read_is_never_the_output(tree, tmp_path):
    lst = list_images(tree)
    target = lst.paths[1]
    before = target.read_bytes()
    (tmp_path / "link.png").symlink_to(target)
    for out in (target, tmp_path / "link.png"):
        with pytest.raises(FedalignError, match=r"is also an input image .*refusing to overwrite"):
            extract_features(lst, out, model="test_efficientnet", weights="random")
    assert target.read_bytes() == before


def test_a_list_file_with_a_byte_order_mark_reads_as_without(tmp_path):
    (tmp_path / "l.txt").write_text("a.png,0\nb.png,1\n", encoding="utf-8-sig")
    lst = read_list_file(tmp_path / "l.txt")
    assert lst.ids == ["a.png", "b.png"] and list(lst.labels) == [0, 1]

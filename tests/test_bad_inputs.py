"""Generated bad inputs for every subcommand (issue 13, "nothing lost, ever").

Every case runs in process (typer's CliRunner) inside a fresh copy of one small valid
"world" of files, and asserts: exit code 2 (130/143 for signals), exactly one ``error:`` line
on stderr, no traceback, and the folder byte-for-byte as before (no input changed, no new
file, no temporary left). The cases are grouped by the eight failure classes of the issue:

1. an output that is an input (property test over every command, input and spelling);
2. tracebacks: unwritable / missing / wrong-kind output paths, zero and negative counts,
   features with zero columns, unlabeled rows for labeled-only commands, malformed reports,
   parser errors;
3. partial results: a failure after some outputs were written leaves none;
4. killed runs: temporaries of dead processes are removed; a swallowed SIGINT still stops
   the command (the subprocess kill tests are in ``test_faults.py``, marked slow);
5. invalid input accepted silently (asymmetric / non-SPD covariances, labels beyond the class
   names, class-count mismatches, unlabeled test files, negative epochs);
6. misleading messages (negative chunk sizes, constant features);
7. foreign but reasonable HDF5 files (read, or refused naming the attribute);
8. concurrency (a second ``dadil-round`` on a locked state);
9. what a fuzzer found: hand-edited npz metadata (bad JSON, not an object, a text version,
   values of the wrong type, missing state settings), ``align --stats`` on broken files,
   infinite and negative option values, one file given twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.files import read_npz, write_features

from conftest import make_features

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------------
# The world: small valid inputs of every kind, built once
# --------------------------------------------------------------------------------------------


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _ok(*args):
    r = invoke(*args)
    assert r.exit_code == 0, (args, r.output, r.exception)
    return r


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("world")
    cwd = os.getcwd()
    os.chdir(w)
    try:
        make_features("a.h5", n=40, d=4, seed=0)
        make_features("b.h5", n=40, d=4, seed=1, shift=1.0)
        make_features("a.test.h5", n=30, d=4, seed=2)
        make_features("u.h5", n=40, d=4, seed=3, unlabeled=True)
        _ok("stats", "a.h5", "-o", "a.stats.npz")
        _ok("stats", "b.h5", "-o", "b.stats.npz")
        _ok("barycenter", "a.stats.npz", "b.stats.npz", "-o", "ref.npz")
        _ok("align", "a.h5", "ref.npz", "-o", "a.al.h5", "--save-map", "a.map.npz")
        _ok("fit-gmm", "a.h5", "-o", "a.gmm.npz", "-k", "1")
        _ok("fit-gmm", "u.h5", "-o", "u.gmm.npz", "-k", "1", "--n-classes", "3")
        os.mkdir("fed")
        _ok("dadil-round", "--init", "--client", "c0", "--gmm", "a.gmm.npz", "--state",
            "c0.state.npz", "-o", "fed/c0.atoms.npz", "--n-atoms", "2")
        _ok("dadil-round", "--init", "--client", "c1", "--gmm", "u.gmm.npz", "--state",
            "c1.state.npz", "-o", "fed/c1.atoms.npz", "--n-atoms", "2")
        _ok("dadil-round", "--state", "c0.state.npz", "--local-steps", "2", "-o", "c0.r1.atoms.npz",
            "fed/c1.atoms.npz")
        _ok("evaluate", "-m", "fedcgs", "--train", "a.h5", "--test", "a.test.h5", "--json", "r.json")
        os.mkdir("imgs")
        from PIL import Image

        rng = np.random.default_rng(0)
        for i in range(2):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(f"imgs/x{i}.png")
        Path("list.txt").write_text("imgs/x0.png,0\nimgs/x1.png,1\n")
        os.mkdir("somedir")
    finally:
        os.chdir(cwd)
    return w


@pytest.fixture
def here(world, tmp_path, monkeypatch):
    """A fresh copy of the world as the working directory."""
    d = tmp_path / "w"
    shutil.copytree(world, d, symlinks=True)
    monkeypatch.chdir(d)
    return d


def snapshot(folder) -> dict:
    """Every entry under ``folder`` (hidden ones too): file hash, link target or 'dir'."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif not p.is_file():
                out[rel] = "special"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def error_line(r) -> str:
    """The one error line of a failed run (asserting there is exactly one and no traceback)."""
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    return lines[0]


def refused(here, *args, match=None, code=2):
    """Run a command that must fail cleanly and leave the folder exactly as it was."""
    before = snapshot(here)
    r = invoke(*args)
    assert r.exit_code == code, (args, r.output, r.exception)
    line = error_line(r)
    if os.environ.get("FEDALIGN_SHOW_ERRORS"):  # eyeball the messages: pytest -s
        print(f"{' '.join(map(str, args))[:80]}\n    {line}")
    if match is not None:
        assert re.search(match, line, re.I), line
    assert snapshot(here) == before, "the folder changed"
    return line


# --------------------------------------------------------------------------------------------
# Command specs: a valid command line per writing command, its outputs and its inputs
# --------------------------------------------------------------------------------------------

#: name: (argv with {slot} placeholders, {slot: default new output}, inputs)
SPECS = {
    "stats": (["stats", "a.h5", "-o", "{out}"], {"out": "new.npz"}, ["a.h5"]),
    "barycenter": (["barycenter", "a.stats.npz", "b.stats.npz", "-o", "{out}"], {"out": "new.npz"},
                   ["a.stats.npz", "b.stats.npz"]),
    "align": (["align", "a.h5", "ref.npz", "--stats", "a.stats.npz", "-o", "{out}", "--save-map",
               "{map}"], {"out": "new.h5", "map": "new.map.npz"}, ["a.h5", "ref.npz", "a.stats.npz"]),
    "align-map": (["align", "--map", "a.map.npz", "a.test.h5", "-o", "{out}"], {"out": "new.h5"},
                  ["a.map.npz", "a.test.h5"]),
    "evaluate": (["evaluate", "-m", "fedcgs", "--train", "a.h5", "--test", "a.test.h5", "--json",
                  "{out}"], {"out": "new.json"}, ["a.h5", "a.test.h5"]),
    "fit-gmm": (["fit-gmm", "a.h5", "-k", "1", "-o", "{out}"], {"out": "new.npz"}, ["a.h5"]),
    "dadil-init": (["dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--n-atoms",
                    "2", "--state", "{state}", "-o", "{out}"],
                   {"out": "new.atoms.npz", "state": "new.state.npz"}, ["a.gmm.npz"]),
    "dadil-round": (["dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o", "{out}",
                     "fed/c0.atoms.npz", "fed/c1.atoms.npz"], {"out": "new.atoms.npz"},
                    ["c0.state.npz", "fed/c0.atoms.npz", "fed/c1.atoms.npz", "a.gmm.npz"]),
    "consensus": (["consensus", "fed", "-L", "2", "-o", "{out}", "--plot", "{png}"],
                  {"out": "new.json", "png": "new.png"}, ["fed/c0.atoms.npz", "fed/c1.atoms.npz"]),
    "dadil-evaluate": (["dadil-evaluate", "--test", "a.test.h5", "--source", "a.h5", "--state",
                        "c0.state.npz", "--json", "{out}"], {"out": "new.json"},
                       ["a.test.h5", "a.h5", "c0.state.npz"]),
    "plot-embedding": (["plot", "embedding", "a.h5", "--after", "a.al.h5", "-o", "{out}"],
                       {"out": "new.png"}, ["a.h5", "a.al.h5"]),
    "plot-accuracy": (["plot", "accuracy", "r.json", "-o", "{out}"], {"out": "new.png"}, ["r.json"]),
    "extract": (["extract", "list.txt", "-o", "{out}", "--model", "test_efficientnet", "--weights",
                 "random", "--image-size", "32", "--device", "cpu", "--workers", "0"],
                {"out": "new.h5"}, ["list.txt"]),
}


def argv(spec: str, **slots) -> list:
    template, defaults, _ = SPECS[spec]
    values = {**defaults, **slots}
    return [a.format(**values) for a in template]


PROPERTY_CASES = [(spec, slot, inp) for spec, (_, slots, inputs) in SPECS.items()
                  for slot in slots for inp in inputs]


@pytest.mark.parametrize("spec, slot, inp", PROPERTY_CASES,
                         ids=[f"{s}-{o}-{i}" for s, o, i in PROPERTY_CASES])
def test_class1_output_equal_to_an_input_is_refused(here, spec, slot, inp):
    """For every command, output slot and input: the input's path as the output — plainly,
    as ./PATH, through a symlink, absolute, and through a hard link — is refused."""
    (here / "link").symlink_to(here / inp)
    os.link(here / inp, here / "hard")
    for spelling in (inp, f"./{inp}", "link", str(here / inp), "hard"):
        refused(here, *argv(spec, **{slot: spelling}), match=r"input|same output")


def test_class1_two_outputs_the_same_file(here):
    refused(here, *argv("align", out="x.h5", map="./x.h5"), match="same output")
    refused(here, *argv("dadil-init", out="s.npz", state="s.npz"), match="same output")
    refused(here, *argv("dadil-round", out="c0.state.npz"), match="same output|input")
    refused(here, *argv("consensus", out="c.json", png="c.json"), match="same output")


def test_class1_partition_output_onto_an_input(here):
    """partition derives its output names: <domain>.test.h5 in OUT may not be an input."""
    shutil.copy("a.test.h5", "dom.test.h5")
    refused(here, "partition", "dom.test.h5", "b.h5", "-o", ".", "--alpha", "none", match="input")
    refused(here, "partition", "a.h5", "b.h5", "-o", "a.h5", match="existing file")


def test_class1_property_specs_are_valid_commands(here):
    """The property test is not vacuous: every spec's command line succeeds as given."""
    for spec in SPECS:
        if spec == "extract":
            continue  # a model forward pass: covered in test_extract.py
        r = invoke(*argv(spec))
        assert r.exit_code == 0, (spec, r.output, r.exception)


# --------------------------------------------------------------------------------------------
# Class 2: one line instead of a traceback
# --------------------------------------------------------------------------------------------

WRITERS = [s for s in SPECS]


def _unwritable_folder(here) -> str:
    """A folder that cannot be written: a read-only tmp folder, or /sys when running as root."""
    if os.geteuid() != 0:
        ro = here / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return "ro"
    if os.path.isdir("/sys") and not os.access("/sys", os.W_OK) or _probe_fails("/sys"):
        return "/sys"
    pytest.skip("no unwritable folder available as root")


def _probe_fails(folder) -> bool:
    try:
        open(os.path.join(folder, ".fedalign-probe"), "w").close()
    except OSError:
        return True
    os.unlink(os.path.join(folder, ".fedalign-probe"))
    return False


@pytest.mark.parametrize("spec", WRITERS)
def test_class2_bad_output_paths(here, spec):
    slots = SPECS[spec][1]
    ro = _unwritable_folder(here)
    for slot, default in slots.items():
        name = Path(default).name
        refused(here, *argv(spec, **{slot: f"missing/{name}"}), match="does not exist")
        refused(here, *argv(spec, **{slot: f"a.h5/{name}"}), match="not a folder")
        refused(here, *argv(spec, **{slot: "somedir"}), match="folder")
        refused(here, *argv(spec, **{slot: f"{ro}/{name}"}), match="writ|permission|denied")
        if not os.path.exists("fifo"):
            os.mkfifo("fifo")
        refused(here, *argv(spec, **{slot: "fifo"}), match="not a regular file")
    if ro == "ro":
        (here / "ro").chmod(0o755)


def test_class2_output_file_where_a_folder_is_expected(here):
    refused(here, "partition", "a.h5", "b.h5", "-o", "r.json", match="existing file")
    refused(here, "demo-data", "r.json", match="existing file|not empty")
    refused(here, "demo-data", "a.h5/x", match="not a folder")


COUNTS = [
    ("stats", ["stats", "a.h5", "-o", "s.npz", "--chunk-rows", "0"], "--chunk-rows"),
    ("stats", ["stats", "a.h5", "-o", "s.npz", "--chunk-rows", "-5"], "--chunk-rows"),
    ("barycenter", ["barycenter", "a.stats.npz", "-o", "r.npz", "--max-iter", "-2"], "--max-iter"),
    ("barycenter", ["barycenter", "a.stats.npz", "-o", "r.npz", "--max-iter", "0"], "--max-iter"),
    ("barycenter", ["barycenter", "a.stats.npz", "-o", "r.npz", "--tol", "-1"], "--tol"),
    ("align", ["align", "a.h5", "ref.npz", "-o", "x.h5", "--chunk-rows", "0"], "--chunk-rows"),
    ("align", ["align", "a.h5", "ref.npz", "-o", "x.h5", "--chunk-rows", "-1"], "--chunk-rows"),
    ("fit-gmm", ["fit-gmm", "a.h5", "-o", "g.npz", "-k", "0"], "--components-per-class"),
    ("fit-gmm", ["fit-gmm", "a.h5", "-o", "g.npz", "--max-iter", "-1"], "--max-iter"),
    ("fit-gmm", ["fit-gmm", "a.h5", "-o", "g.npz", "--n-classes", "0"], "--n-classes"),
    ("partition", ["partition", "a.h5", "-o", "p", "--clients-per-domain", "0"], "--clients-per-domain"),
    ("partition", ["partition", "a.h5", "-o", "p", "--min-client-size", "0"], "--min-client-size"),
    ("partition", ["partition", "a.h5", "-o", "p", "--max-redraws", "-1"], "--max-redraws"),
    ("partition", ["partition", "a.h5", "-o", "p", "--test-fraction", "-0.1"], "--test-fraction"),
    ("partition", ["partition", "a.h5", "-o", "p", "--test-fraction", "1"], "--test-fraction"),
    ("evaluate", ["evaluate", "-m", "ofedavg", "--train", "a.h5", "--test", "a.test.h5",
                  "--param", "ofedavg.epochs=-1"], "epochs"),
    ("evaluate", ["evaluate", "-m", "centralized", "--train", "a.h5", "--test", "a.test.h5",
                  "--param", "centralized.batch_size=0"], "batch_size"),
    ("evaluate", ["evaluate", "-m", "fedpft", "--train", "a.h5", "--test", "a.test.h5",
                  "--param", "fedpft.epochs=-1"], "epochs"),
    ("evaluate", ["evaluate", "-m", "ofedavg", "--train", "a.h5", "--test", "a.test.h5",
                  "--param", "ofedavg.lr=-0.1"], "lr"),
    ("consensus", ["consensus", "fed", "-L", "0"], "--n-weights"),
    ("consensus", ["consensus", "fed", "--every", "0"], "--every"),
    ("consensus", ["consensus", "fed", "--threads", "0"], "--threads"),
    ("dadil-round", ["dadil-round", "--state", "c0.state.npz", "-o", "n.npz", "--local-steps", "-1",
                     "fed/c1.atoms.npz"], "--local-steps"),
    ("dadil-round", ["dadil-round", "--state", "c0.state.npz", "-o", "n.npz", "--threads", "0"],
     "--threads"),
    ("dadil-init", ["dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--state",
                    "n.state.npz", "-o", "n.npz", "--n-atoms", "0"], "--n-atoms"),
    ("dadil-init", ["dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--state",
                    "n.state.npz", "-o", "n.npz", "--n-components", "-3"], "--n-components"),
    ("dadil-evaluate", ["dadil-evaluate", "--test", "a.test.h5", "--source", "a.h5",
                        "--n-per-class", "0"], "--n-per-class"),
    ("dadil-evaluate", ["dadil-evaluate", "--test", "a.test.h5", "--gmm", "a.gmm.npz",
                        "--target-gmm", "u.gmm.npz", "--central-iters", "-1"], "--central-iters"),
    ("plot", ["plot", "embedding", "a.h5", "-o", "e.png", "--max-points", "0"], "--max-points"),
    ("demo-data", ["demo-data", "demo", "--per-domain", "0"], "--per-domain"),
    ("demo-data", ["demo-data", "demo", "--per-domain", "-4"], "--per-domain"),
    ("demo-data", ["demo-data", "demo", "--size", "0"], "--size"),
    ("demo-data", ["demo-data", "demo", "--per-domain", "100000"], "--per-domain"),
    ("extract", ["extract", "list.txt", "-o", "f.h5", "--batch-size", "-1"], "--batch-size"),
    ("extract", ["extract", "list.txt", "-o", "f.h5", "--workers", "-2"], "--workers"),
]


@pytest.mark.parametrize("cmd, args, flag", COUNTS, ids=[f"{c}{a[-2]}{a[-1]}" for c, a, _ in COUNTS])
def test_class2_zero_and_negative_counts_name_the_flag(here, cmd, args, flag):
    line = refused(here, *args)
    assert flag in line, line


def _zero_columns(path):
    with h5py.File(path, "w") as h:
        h.attrs["kind"] = "features"
        h.attrs["format_version"] = 1
        h.attrs["class_names"] = json.dumps(["c0", "c1", "c2"])
        h["features"] = np.zeros((5, 0), np.float32)
        h["labels"] = np.arange(5) % 3
        h["ids"] = [str(i) for i in range(5)]


def test_class2_features_with_zero_columns(here):
    _zero_columns("z.h5")
    for args in (["stats", "z.h5", "-o", "s.npz"], ["align", "z.h5", "ref.npz", "-o", "x.h5"],
                 ["fit-gmm", "z.h5", "-o", "g.npz"], ["partition", "z.h5", "-o", "p"],
                 ["evaluate", "-m", "fedcgs", "--train", "z.h5", "--test", "a.test.h5"],
                 ["plot", "embedding", "z.h5", "-o", "e.png"],
                 ["dadil-evaluate", "--test", "z.h5", "--source", "a.h5"]):
        refused(here, *args, match="no columns")


def test_class2_too_few_rows_or_dimensions(here):
    write_features("e.h5", np.zeros((0, 4), np.float32), np.zeros(0, int), [], ["c0", "c1", "c2"])
    write_features("one.h5", np.ones((1, 4), np.float32), [0], ["r0"], ["c0", "c1", "c2"])
    write_features("d1.h5", np.arange(6, dtype=np.float32)[:, None], np.arange(6) % 3,
                   [str(i) for i in range(6)], ["c0", "c1", "c2"])
    for f in ("e.h5", "one.h5"):
        refused(here, "stats", f, "-o", "s.npz", match="at least 2 samples")
        refused(here, "plot", "embedding", f, "-o", "e.png", match="at least 2 rows")
    refused(here, "plot", "embedding", "d1.h5", "-o", "e.png", match="2 feature dimensions")
    refused(here, "plot", "embedding", "a.h5", "-o", "e.png", "--method", "tsne", "--max-points",
            "3", match="t-SNE")
    refused(here, "fit-gmm", "e.h5", "-o", "g.npz", match="non-empty")
    refused(here, "partition", "e.h5", "-o", "p", match="no rows")


def test_class2_labeled_only_commands_given_unlabeled_rows(here):
    refused(here, "partition", "u.h5", "-o", "p", match="labeled")
    refused(here, "evaluate", "-m", "fedcgs", "--train", "u.h5", "--test", "a.test.h5",
            match="labeled")
    refused(here, "evaluate", "-m", "fedcgs", "--train", "a.h5", "--test", "u.h5", match="labeled")
    refused(here, "stats", "u.h5", "-o", "s.npz", "--per-class", match="labeled")
    refused(here, "dadil-evaluate", "--test", "a.test.h5", "--source", "u.h5", match="labeled")


def _report(path, **body):
    Path(path).write_text(json.dumps({"kind": "report", "format_version": 1, **body}))


@pytest.mark.parametrize("body", [
    {"methods": []},
    {"methods": {}},
    {"methods": {"fedcgs": 3}},
    {"methods": {"fedcgs": {"summary": {"a": {"mean": 0.5, "std": 0.1}}}}},
    {"methods": {"fedcgs": {"summary": {"macro": {"mean": "x", "std": 0}}}}},
    {"methods": {"fedcgs": {"summary": {"macro": 0.5}}}},
    {"methods": {"fedcgs": {"summary": {"macro": {"mean": 0.5, "std": 0.1}}}}, "alignment": "0.4"},
    {"summary": [1, 2]},
    {"summary": {"x": {"mean": None, "std": 0}}},
    {"runs": {}},
], ids=lambda b: json.dumps(b)[:40])
def test_class2_reports_of_the_wrong_shape(here, body):
    _report("bad.json", **body)
    refused(here, "report", "bad.json", match="bad.json")
    refused(here, "plot", "accuracy", "bad.json", "-o", "acc.png", match="bad.json")


@pytest.mark.parametrize("args", [
    ["align", "--tau", "abc", "a.h5", "ref.npz"],
    ["stats", "a.h5"],
    ["stats", "a.h5", "-o", "s.npz", "--no-such-option"],
    ["barycenter", "a.stats.npz", "-o", "r.npz", "--max-iter", "x"],
    ["evaluate", "-m", "fedcgs", "--train", "a.h5"],
    ["plot", "embedding", "a.h5", "--max-points", "1.5"],
    ["dadil-round", "--state"],
    ["no-such-command"],
    ["plot", "no-such-plot"],
], ids=lambda a: " ".join(a))
def test_class2_parser_errors_are_one_line(here, args):
    refused(here, *args)


# --------------------------------------------------------------------------------------------
# Class 3: all outputs or none
# --------------------------------------------------------------------------------------------


def test_class3_align_save_map_into_a_missing_folder_leaves_no_aligned_file(here):
    refused(here, "align", "a.h5", "ref.npz", "-o", "x.h5", "--save-map", "nope/m.npz",
            match="does not exist")


def test_class3_second_output_failing_late_removes_the_first(here, monkeypatch):
    import fedalign.align as al

    def boom(*a, **k):
        from fedalign.errors import FedalignError

        raise FedalignError("disk full (simulated)")

    monkeypatch.setattr(al, "save_map", boom)
    refused(here, "align", "a.h5", "ref.npz", "-o", "x.h5", "--save-map", "m.npz", match="simulated")


def test_class3_dadil_init_writes_state_and_atoms_or_neither(here, monkeypatch):
    refused(here, "dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--state",
            "nope/n.state.npz", "-o", "n.atoms.npz", match="does not exist")
    import fedalign.dadil.gossip as gossip

    real = gossip.save_state

    def failing(*a, **k):
        from fedalign.errors import FedalignError

        raise FedalignError("cannot write the state (simulated)")

    monkeypatch.setattr(gossip, "save_state", failing)
    refused(here, "dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--state",
            "n.state.npz", "-o", "n.atoms.npz", match="simulated")
    monkeypatch.setattr(gossip, "save_state", real)


def test_class3_partition_failing_midway_leaves_no_file_and_no_folder(here, monkeypatch):
    import fedalign.files as files

    real, calls = files.FeatureWriter.append, []

    def append(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            from fedalign.errors import FedalignError

            raise FedalignError("simulated write failure")
        return real(self, *a, **k)

    monkeypatch.setattr(files.FeatureWriter, "append", append)
    refused(here, "partition", "a.h5", "b.h5", "-o", "out/clients", "--alpha", "none",
            match="simulated")


def test_class3_demo_data_whole_tree_or_nothing(here, monkeypatch):
    import fedalign.demo as demo

    real, calls = demo._render, []

    def render(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(demo, "_render", render)
    refused(here, "demo-data", "demo", "--per-domain", "3", "--size", "8", code=130,
            match="interrupted")
    monkeypatch.setattr(demo, "_render", real)
    r = invoke("demo-data", "demo", "--per-domain", "3", "--size", "8")
    assert r.exit_code == 0, r.output
    assert len(list((here / "demo").rglob("*.png"))) == 9
    assert not [p for p in here.iterdir() if "fedalign-tmp" in p.name]


def test_class3_dadil_kill_between_state_and_atoms_is_repaired(here):
    """A kill after the state's rename but before the atoms' leaves the atoms missing or
    stale: the next run republishes them (the same bytes) before its own round."""
    os.mkdir("r1")
    os.mkdir("r2")
    _ok("dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o", "r1/c0.atoms.npz",
        "fed/c1.atoms.npz")
    published = Path("r1/c0.atoms.npz").read_bytes()
    for damage in ("missing", "stale"):
        state = Path("c0.state.npz").read_bytes()
        if damage == "missing":
            os.unlink("r1/c0.atoms.npz")
        else:
            shutil.copy("fed/c0.atoms.npz", "r1/c0.atoms.npz")  # the round-0 atoms
        r = _ok("dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o",
                "r2/c0.atoms.npz", "fed/c1.atoms.npz")
        assert "republished" in r.stderr
        assert Path("r1/c0.atoms.npz").read_bytes() == published
        _, meta = read_npz("c0.state.npz", "state")
        assert meta["published"]["path"] == "r2/c0.atoms.npz"
        Path("c0.state.npz").write_bytes(state)  # back to round 1 for the second damage
        os.unlink("r2/c0.atoms.npz")


# --------------------------------------------------------------------------------------------
# Class 4: interrupted and killed runs
# --------------------------------------------------------------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_class4_temporaries_of_dead_runs_are_removed_by_the_next_run(here):
    dead = here / f".s.npz.fedalign-tmp-{_dead_pid()}-0000.npz"
    live = here / ".s.npz.fedalign-tmp-1-0000.npz"  # pid 1 is alive: not ours to remove
    dead.write_bytes(b"x" * 1000)
    live.write_bytes(b"y")
    _ok("stats", "a.h5", "-o", "s.npz")
    assert not dead.exists() and live.exists()
    # a failing run cleans up too
    dead.write_bytes(b"x")
    refused_before = snapshot(here)
    r = invoke("stats", "a.h5", "-o", "s.npz", "--shrinkage", "7")
    assert r.exit_code == 2 and not dead.exists()
    refused_before.pop(dead.name)
    assert snapshot(here) == refused_before


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_class4_swallowed_signal_still_stops_the_command(here, monkeypatch, signum, code):
    """A signal whose exception is swallowed (as inside an h5py callback) is honoured at the
    next safe point: exit 130 / 143 and no output."""
    import fedalign.stats as stats

    real = stats.Moments.update

    def update(self, X, labels=None):
        try:
            os.kill(os.getpid(), signum)
            for _ in range(100):  # the handler runs between bytecodes
                pass
        except KeyboardInterrupt:
            pass  # swallowed
        return real(self, X, labels)

    monkeypatch.setattr(stats.Moments, "update", update)
    refused(here, "stats", "a.h5", "-o", "s.npz", "--chunk-rows", "7", code=code,
            match="interrupted")
    refused(here, "align", "a.h5", "ref.npz", "-o", "x.h5", "--save-map", "m.npz", code=code,
            match="interrupted")


# --------------------------------------------------------------------------------------------
# Class 5: invalid input refused, once, in the file-kind module and the option parsing
# --------------------------------------------------------------------------------------------


def _npz_with(src, dst, **changes):
    a = dict(np.load(src))
    a.update({k: np.asarray(v) for k, v in changes.items()})
    np.savez(dst, **a)


def test_class5_asymmetric_and_non_spd_covariances(here):
    C = np.load("a.stats.npz")["covariance"]
    asym = C.copy()
    asym[0, 1] += 0.3 * abs(C).max()
    w, V = np.linalg.eigh(C)
    indefinite = (V * np.r_[-w[0], w[1:]]) @ V.T
    _npz_with("a.stats.npz", "asym.stats.npz", covariance=asym)
    _npz_with("a.stats.npz", "neg.stats.npz", covariance=indefinite)
    _npz_with("a.stats.npz", "zero.stats.npz", covariance=np.zeros_like(C))
    for bad in ("asym", "neg", "zero"):
        msg = "not symmetric" if bad == "asym" else "positive definite"
        refused(here, "barycenter", f"{bad}.stats.npz", "b.stats.npz", "-o", "r.npz", match=msg)
        refused(here, "align", "a.h5", "ref.npz", "--stats", f"{bad}.stats.npz", "-o", "x.h5",
                match=msg)
    R = np.load("ref.npz")["covariance"]
    _npz_with("ref.npz", "asym.ref.npz", covariance=R + np.triu(np.ones_like(R), 1))
    _npz_with("ref.npz", "neg.ref.npz", covariance=-R)
    refused(here, "align", "a.h5", "asym.ref.npz", "-o", "x.h5", match="not symmetric")
    refused(here, "align", "a.h5", "neg.ref.npz", "-o", "x.h5", match="positive definite")
    A = np.load("a.map.npz")["A"]
    _npz_with("a.map.npz", "asym.map.npz", A=A + np.triu(np.ones_like(A), 1))
    refused(here, "align", "--map", "asym.map.npz", "a.h5", "-o", "x.h5", match="not symmetric")


def test_class5_rounding_asymmetry_is_accepted(here):
    C = np.load("a.stats.npz")["covariance"]
    _npz_with("a.stats.npz", "r.stats.npz", covariance=C + 1e-13 * np.triu(np.ones_like(C), 1))
    _ok("barycenter", "r.stats.npz", "b.stats.npz", "-o", "r2.npz")


def _relabel(src, dst, labels):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as h:
        h["labels"][...] = labels


def test_class5_labels_beyond_the_class_names(here):
    y = np.arange(40) % 3
    y[5] = 3  # three class names
    _relabel("a.h5", "big.h5", y)
    y2 = y.copy()
    y2[5] = -2
    _relabel("a.h5", "neg.h5", y2)
    for f in ("big.h5", "neg.h5"):
        for args in (["stats", f, "-o", "s.npz", "--per-class"], ["partition", f, "-o", "p"],
                     ["evaluate", "-m", "fedcgs", "--train", f, "--test", "a.test.h5"],
                     ["fit-gmm", f, "-o", "g.npz"], ["align", f, "ref.npz", "-o", "x.h5"]):
            refused(here, *args, match="label")


def test_class5_dadil_class_count_and_unlabeled_test(here):
    make_features("c4.test.h5", n=20, d=4, n_classes=4, seed=5)
    refused(here, "dadil-evaluate", "--test", "c4.test.h5", "--state", "c1.state.npz",
            match="C=3|3 classes|classes")
    refused(here, "evaluate", "-m", "dadil", "--test", "c4.test.h5", "--input", "c1.state.npz",
            match="classes|C=")
    refused(here, "dadil-evaluate", "--test", "u.h5", "--state", "c1.state.npz", match="labeled")
    refused(here, "evaluate", "-m", "dadil", "--test", "u.h5", "--input", "c1.state.npz",
            match="labeled")


# --------------------------------------------------------------------------------------------
# Class 6: messages name the real cause
# --------------------------------------------------------------------------------------------


def test_class6_library_chunk_size_message(world):
    from fedalign.errors import FedalignError
    from fedalign.stats import compute_stats

    with pytest.raises(FedalignError, match="chunk_rows must be ≥ 1, got -3"):
        compute_stats(world / "a.h5", chunk_rows=-3)


def test_class6_constant_and_zero_variance_features(here):
    write_features("const.h5", np.full((20, 4), 2.5, np.float32), np.arange(20) % 3,
                   [str(i) for i in range(20)], ["c0", "c1", "c2"])
    for args in (["stats", "const.h5", "-o", "s.npz"],
                 ["align", "const.h5", "ref.npz", "-o", "x.h5"]):
        line = refused(here, *args, match="constant")
        assert "NaN" not in line
    X = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    X[:, 1] = 7.0  # one zero-variance column: shrinkage keeps the covariance definite
    write_features("zv.h5", X, np.arange(30) % 3, [str(i) for i in range(30)], ["c0", "c1", "c2"])
    r = _ok("align", "zv.h5", "ref.npz", "-o", "zv.al.h5")
    assert "Warning" not in r.output
    from fedalign.files import read_features

    assert np.all(np.isfinite(read_features("zv.al.h5")[0]))
    refused(here, "stats", "zv.h5", "-o", "s.npz", "--shrinkage", "none", match="zero variance")


# --------------------------------------------------------------------------------------------
# Class 7: features files written by hand
# --------------------------------------------------------------------------------------------


def _foreign(path, class_names=("x", "y", "z"), ids="int", labels=np.int32, features=np.float64,
             n=30, d=4, **attrs):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as h:
        h.attrs["kind"] = "features"
        h.attrs["format_version"] = 1
        if class_names is not None:
            h.attrs["class_names"] = class_names
        for k, v in attrs.items():
            h.attrs[k] = v
        h["features"] = rng.normal(size=(n, d)).astype(features)
        h["labels"] = (np.arange(n) % 3).astype(labels)
        h["ids"] = np.arange(n) if ids == "int" else [f"r{i}" for i in range(n)]


@pytest.mark.parametrize("names", [["x", "y", "z"], [b"x", b"y", b"z"], json.dumps(["x", "y", "z"]),
                                   np.array(["x", "y", "z"], dtype="S")],
                         ids=["str-list", "bytes-list", "json", "S-array"])
def test_class7_natural_h5py_forms_are_read(here, names):
    _foreign("f.h5", class_names=names)
    _foreign("g.h5", class_names=names, ids="str", labels=np.int64, features=np.float32)
    _ok("stats", "f.h5", "-o", "f.stats.npz", "--per-class")
    _ok("align", "f.h5", "ref.npz", "-o", "f.al.h5")
    _ok("fit-gmm", "f.h5", "-o", "f.gmm.npz", "-k", "1")
    _ok("partition", "f.h5", "g.h5", "-o", "parts", "--alpha", "none")
    from fedalign.files import read_features

    X, y, info = read_features("f.al.h5")
    assert info["class_names"] == ["x", "y", "z"] and info["ids"][3] == "3"
    assert y.dtype == np.int64 and X.dtype == np.float32


@pytest.mark.parametrize("build, attribute", [
    (dict(class_names="x,y,z"), "class_names"),
    (dict(class_names=np.array([1.0, 2.0])), "class_names"),
    (dict(class_names=["x", "x", "y"]), "class_names"),
    (dict(provenance="not json"), "provenance"),
    (dict(provenance=json.dumps([1, 2])), "provenance"),
    (dict(labels=np.float32), "labels"),
    (dict(features=np.bytes_), "features"),
], ids=["csv-names", "float-names", "dup-names", "prov-text", "prov-list", "float-labels",
        "string-features"])
def test_class7_unreadable_forms_name_the_attribute(here, build, attribute):
    kw = dict(build)
    if kw.get("features") is np.bytes_:
        kw["features"] = "S8"
    _foreign("f.h5", **kw)
    for args in (["stats", "f.h5", "-o", "s.npz"], ["fit-gmm", "f.h5", "-o", "g.npz"]):
        line = refused(here, *args)
        assert f"'{attribute}'" in line, line


def test_class7_structure_errors_name_what_is_missing(here):
    with h5py.File("nokind.h5", "w") as h:
        h["features"] = np.zeros((3, 2))
    refused(here, "stats", "nokind.h5", "-o", "s.npz", match="'kind'")
    with h5py.File("group.h5", "w") as h:
        h.attrs["kind"], h.attrs["format_version"] = "features", 1
        h.create_group("features")
        h["labels"], h["ids"] = np.zeros(3, int), np.arange(3)
    refused(here, "stats", "group.h5", "-o", "s.npz", match="'features'")
    with h5py.File("ver.h5", "w") as h:
        h.attrs["kind"], h.attrs["format_version"] = "features", "one"
    refused(here, "stats", "ver.h5", "-o", "s.npz", match="format_version")
    with h5py.File("floatids.h5", "w") as h:
        h.attrs["kind"], h.attrs["format_version"] = "features", 1
        h["features"], h["labels"], h["ids"] = np.zeros((3, 2)), np.zeros(3, int), np.zeros(3)
    refused(here, "stats", "floatids.h5", "-o", "s.npz", match="'ids'")


# --------------------------------------------------------------------------------------------
# Class 8: one dadil-round per state at a time
# --------------------------------------------------------------------------------------------


def test_class8_a_locked_state_is_refused(here):
    from fedalign.files import locked

    with locked("c0.state.npz", "test"):
        refused(here, "dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o",
                "n.atoms.npz", "fed/c1.atoms.npz", match="locked by another dadil-round")
        refused(here, "dadil-round", "--init", "--force", "--client", "c0", "--gmm", "a.gmm.npz",
                "--state", "c0.state.npz", "-o", "n.atoms.npz", match="locked")
    _ok("dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o", "n.atoms.npz",
        "fed/c1.atoms.npz")


# --------------------------------------------------------------------------------------------
# Class 9: what a fuzzer found (hand-edited files, non-finite and negative option values)
# --------------------------------------------------------------------------------------------


def _edit_npz(src, dst, **entries):
    """A copy of ``src`` with raw npz entries replaced (``__meta__`` etc.), by hand."""
    d = dict(np.load(src))
    d.update({k: np.array(v) for k, v in entries.items()})
    np.savez(dst, **d)


_DROP = object()  # a metadata field to remove (_edit_meta)


def _edit_meta(src, dst, **fields):
    d = dict(np.load(src))
    meta = json.loads(str(d["__meta__"]))
    meta.update(fields)
    for k in [k for k, v in fields.items() if v is _DROP]:
        del meta[k]
    d["__meta__"] = np.array(json.dumps(meta))
    np.savez(dst, **d)


#: file of the world → a command line reading it as x.npz
NPZ_READERS = {
    "a.stats.npz": ["barycenter", "x.npz", "b.stats.npz", "-o", "o.npz"],
    "ref.npz": ["align", "a.h5", "x.npz", "-o", "o.h5"],
    "a.map.npz": ["align", "--map", "x.npz", "a.test.h5", "-o", "o.h5"],
    "a.gmm.npz": ["dadil-round", "--init", "--client", "n", "--gmm", "x.npz", "--state", "s.npz",
                  "-o", "o.npz"],
    "c0.state.npz": ["dadil-round", "--state", "x.npz", "-o", "o.npz", "fed/c1.atoms.npz"],
}


@pytest.mark.parametrize("entries, match", [
    (dict(__meta__="{bad"), "metadata is not valid JSON"),
    (dict(__meta__="[1, 2]"), "metadata must be a JSON object, got list"),
    (dict(__format_version__="1"), "format_version must be one integer, got '1'"),
    (dict(__format_version__=[1, 1]), "format_version must be one integer"),
    (dict(__format_version__=[[1, 2], [3, 4]]),     # errors.short_array: one line, not two
     re.escape("format_version must be one integer, got [[1 2] [3 4]] (int64)")),
], ids=["bad-json", "list", "version-text", "version-list", "version-table"])
@pytest.mark.parametrize("src", list(NPZ_READERS))
def test_class9_broken_npz_metadata_is_one_error_for_every_kind(here, src, entries, match):
    _edit_npz(src, "x.npz", **entries)
    refused(here, *NPZ_READERS[src], match=match)


@pytest.mark.parametrize("src, fields, match", [
    ("a.stats.npz", dict(class_names=5), "metadata 'class_names' must be a list of strings"),
    ("a.map.npz", dict(client=5), "metadata 'client' must be a string, got int"),
    ("a.map.npz", dict(reference_sha256=["x"]), "metadata 'reference_sha256' must be a string"),
    ("c0.state.npz", dict(settings=3), "metadata 'settings' must be a JSON object, got int"),
    ("c0.state.npz", dict(settings=_DROP), "client c0's state: settings lack 'optimizer'"),
    ("c0.state.npz", dict(settings=dict(lr="zz", lr_alpha=0.5, optimizer="gd",
                                        alpha_rule="newton")),
     "setting 'lr' must be a number, got 'zz'"),
    ("c0.state.npz", dict(settings=dict(lr=0.5, lr_alpha=0.5, optimizer="sgd",
                                        alpha_rule="newton")),
     "client c0's state: optimizer must be one of gd, adam, got 'sgd'"),
])
def test_class9_metadata_values_of_the_wrong_type_are_named(here, src, fields, match):
    _edit_meta(src, "x.npz", **fields)
    refused(here, *NPZ_READERS[src], match=re.escape(match))


def test_class9_align_stats_is_read_like_every_other_stats_file(here):
    Path("t.npz").write_bytes(Path("a.stats.npz").read_bytes()[:200])
    Path("e.npz").write_bytes(b"")
    for bad, match in (("t.npz", "not a readable .npz file"), ("e.npz", "not a readable .npz"),
                       ("a.h5", "is an HDF5 file"), ("r.json", "not a readable .npz")):
        refused(here, "align", "a.h5", "ref.npz", "--stats", bad, "-o", "o.h5", match=match)


@pytest.mark.parametrize("args, match", [
    (["fit-gmm", "a.h5", "-o", "o.npz", "--tol", "inf"], "--tol must be a finite number, got inf"),
    (["dadil-round", "--init", "--client", "n", "--gmm", "a.gmm.npz", "--state", "s.npz", "-o",
      "o.npz", "--lr", "inf"], "--lr must be a finite number, got inf"),
    (["align", "a.h5", "ref.npz", "-o", "o.h5", "--tau", "-inf"], "Invalid value for '--tau'"),
    (["fit-gmm", "a.h5", "-o", "o.npz", "--seed", "-1"], "Invalid value for '--seed'"),
    (["evaluate", "-m", "fedcgs", "--train", "a.h5", "--test", "a.test.h5", "--seeds", "-1"],
     "--seeds: each seed must be an integer in [0, 2**32 − 1 = 4294967295]"),
    (["dadil-evaluate", "--test", "a.test.h5", "--state", "c0.state.npz", "--seeds", "2-0"],
     "the range '2-0' is empty"),
    (["barycenter", "a.stats.npz", "./a.stats.npz", "-o", "o.npz"],
     "stats file a.stats.npz is given twice"),
    (["evaluate", "-m", "fedcgs", "--train", "a.h5", "--train", "a.h5", "--test", "a.test.h5"],
     "--train file a.h5 is given twice"),
], ids=["tol-inf", "lr-inf", "tau-inf", "seed", "seeds", "seed-range", "twice", "train-twice"])
def test_class9_non_finite_negative_and_repeated_values_are_refused(here, args, match):
    refused(here, *args, match=re.escape(match))


# --------------------------------------------------------------------------------------------
# Class 9 (continued): bounds — 32-bit seeds, and the values no writer of fedalign writes
# --------------------------------------------------------------------------------------------

SEED_OVER = str(2**32)   # MAX_SEED + 1: scikit-learn's random_state refused it with a traceback


def _process_env() -> dict:
    """The environment of a ``fedalign`` process that runs the fedalign this test imported
    (its folder first on PYTHONPATH, whatever an installed copy points at)."""
    import fedalign

    root = str(Path(fedalign.__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))


def refused_by_process(here, *args, match):
    """``refused`` through a real ``python -m fedalign`` process (its own parser and exit)."""
    before = snapshot(here)
    r = subprocess.run([sys.executable, "-m", "fedalign", *map(str, args)], env=_process_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and not r.stdout.strip(), r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert re.search(match, lines[0]), lines[0]
    assert snapshot(here) == before, "the folder changed"
    return lines[0]


def test_class9_a_seed_of_2_32_is_refused_by_a_fedalign_process(here):
    import fedalign

    r = subprocess.run([sys.executable, "-c", "import fedalign; print(fedalign.__file__)"],
                       env=_process_env(), capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == fedalign.__file__             # the code under test runs
    refused_by_process(here, "fit-gmm", "a.h5", "-o", "g.npz", "--seed", SEED_OVER,
                       # typer's wording (click's, under the older typer flwr pins, second)
                       match=r"Invalid value for '--seed'.*(less than or equal to 4294967295"
                             r"|not in the range 0<=x<=4294967295)")
    refused_by_process(here, "evaluate", "-m", "fedcgs", "--train", "a.h5", "--test",
                       "a.test.h5", "--json", "r2.json", "--seeds", f"0,{SEED_OVER}",
                       match=re.escape("--seeds: each seed must be an integer in [0, 2**32 − 1 = "
                                       "4294967295] (numpy's legacy generators and scikit-learn "
                                       "take 32-bit seeds), got 4294967296"))


@pytest.mark.parametrize("args, match", [
    (["dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--state", "n.state.npz",
      "-o", "n.npz", "--seed", SEED_OVER], "'--seed'"),
    (["consensus", "fed", "-o", "c.json", "--seed", SEED_OVER], "'--seed'"),
    (["partition", "a.h5", "-o", "p", "--seed", SEED_OVER], "'--seed'"),
    (["plot", "embedding", "a.h5", "-o", "e.png", "--seed", SEED_OVER], "'--seed'"),
    (["stats", "a.h5", "-o", "s.npz", "--dp-epsilon", "1", "--dp-delta", "1e-5", "--clip", "1",
      "--seed", SEED_OVER], "'--seed'"),
    (["demo-data", "demo", "--seed", SEED_OVER], "'--seed'"),
    (["dadil-evaluate", "--test", "a.test.h5", "--state", "c0.state.npz", "--json", "e.json",
      "--seeds", "4294967295-4294967296"],
     re.escape("--seeds: each seed must be an integer in [0, 2**32 − 1 = 4294967295]")),
], ids=["dadil-init", "consensus", "partition", "plot", "stats-dp", "demo-data", "seeds-range"])
def test_class9_seeds_beyond_32_bits_are_refused_by_every_command(here, args, match):
    refused(here, *args, match=match)


def test_class9_the_largest_seed_is_taken(here):
    _ok("fit-gmm", "a.h5", "-o", "g.npz", "-k", "1", "--seed", str(2**32 - 1))
    _ok("evaluate", "-m", "fedcgs", "--train", "a.h5", "--test", "a.test.h5", "--seeds",
        str(2**32 - 1))
    assert Path("g.npz").exists()


def _edit_arrays(src, dst, **arrays):
    """A copy of ``src`` with arrays replaced (None removes one), by hand."""
    d = dict(np.load(src))
    for k, v in arrays.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = np.asarray(v)
    np.savez(dst, **d)


@pytest.mark.parametrize("src, arrays, match", [
    ("a.gmm.npz", dict(weights=np.zeros(0), means=np.zeros((0, 4)), variances=np.ones((0, 4)),
                       labels=np.zeros((0, 3))),
     r"array 'weights' has shape \(0,\): K must be at least 1$"),
    ("ref.npz", dict(weights=np.zeros(0), n=np.zeros(0, np.int64)),
     r"array 'weights' has shape \(0,\): K must be at least 1$"),
    ("a.stats.npz", dict(n=np.int64(2**53 + 1)),
     r"array 'n' holds the integer 9007199254740993, beyond ±2\*\*53"),
    ("c0.state.npz", dict(round=np.int64(2**60)),
     r"array 'round' holds the integer 1152921504606846976, beyond ±2\*\*53"),
    ("c0.state.npz", dict(rng_state=np.array([-1, 0, 0, 1, 0, 0], np.int64)),
     r"array 'rng_state' must hold unsigned words, got -1$"),
    ("ref.npz", dict(weights=np.array([0.25, 0.25])),
     r"reference 'weights' \(the clients' w_k\) must be ≥ 0 and sum to 1, got \[0.25 0.25\] "
     r"\(sum 0.5\)$"),
    ("ref.npz", dict(weights=np.array([1.5, -0.5])), r"must be ≥ 0 and sum to 1, got \[ 1.5 -0.5\]"),
    ("ref.npz", dict(n=np.array([40, 0])),
     r"reference 'n' \(the clients' row counts\) must be ≥ 1, got \[40 0\]$"),
], ids=["gmm-K0", "reference-K0", "stats-n-2^53", "state-round-2^60", "state-rng-negative",
        "reference-weights-0.5", "reference-weights-negative", "reference-n-0"])
def test_class9_npz_values_no_writer_writes_are_refused(here, src, arrays, match):
    """Hand-edited files: a zero-size dimension, an integer beyond 2**53, negative generator
    words, reference weights that are not a distribution or a client of no rows."""
    _edit_arrays(src, "x.npz", **arrays)
    refused(here, *NPZ_READERS[src], match=match)


@pytest.mark.parametrize("counts, match", [
    ([-1, 20, 21], r"got \[-1 20 21\] \(sum 40\)$"),
    ([20, 20, 1], r"got \[20 20 1\] \(sum 41\)$"),
], ids=["negative", "sum-past-n"])
def test_class9_per_class_stats_with_impossible_class_counts_are_refused(here, counts, match):
    _ok("stats", "a.h5", "-o", "pc.stats.npz", "--per-class")
    _edit_arrays("pc.stats.npz", "x.npz", class_counts=np.array(counts, np.int64))
    for args in (["target-reference", "u.h5", "x.npz", "-o", "t.ref.npz"],
                 ["barycenter", "x.npz", "b.stats.npz", "-o", "o.npz"]):
        line = refused(here, *args, match=match)
        assert "'class_counts' must be ≥ 0 and sum to at most n=40 (the labeled rows)" in line


@pytest.mark.parametrize("n_classes, match", [
    (0, r"metadata 'n_classes' must be an integer in \[1, 100,000\], got 0$"),
    (100_001, r"metadata 'n_classes' must be an integer in \[1, 100,000\], got 100001$"),
    (True, r"metadata 'n_classes' must be an integer, got bool true$"),
], ids=["0", "max+1", "bool"])
def test_class9_gmm_whose_recorded_class_count_is_impossible_is_refused(here, n_classes, match):
    """An unlabeled GMM's C is its fit record's n_classes (the DaDiL state's label columns)."""
    _edit_meta("u.gmm.npz", "x.npz", n_classes=n_classes)
    refused(here, "dadil-round", "--init", "--client", "n", "--gmm", "x.npz", "--state", "s.npz",
            "-o", "o.npz", match=match)
    refused(here, "dadil-evaluate", "--test", "a.test.h5", "--gmm", "a.gmm.npz", "--target-gmm",
            "x.npz", "--json", "e.json", match=match)


def test_class9_files_the_tool_writes_are_read_back(here):
    """Round trip: what the commands write passes the readers' new bounds — per-class stats
    (also of a partly labeled file: class counts below n), the barycenter and the target's
    reference, unlabeled GMMs, fresh and advanced DaDiL states (uint64 generator words)."""
    from fedalign.align import load_reference
    from fedalign.dadil.state import load_state
    from fedalign.files import read_features
    from fedalign.gmm import load_gmm
    from fedalign.stats import load_stats

    X, y, _ = read_features("a.h5")
    write_features("half.h5", X, np.where(np.arange(len(y)) % 2 == 0, y, -1),
                   [f"r{i}" for i in range(len(y))], ["c0", "c1", "c2"])
    _ok("stats", "a.h5", "-o", "pa.stats.npz", "--per-class")
    _ok("stats", "half.h5", "-o", "ph.stats.npz", "--per-class", "--compact")
    st = load_stats("ph.stats.npz")
    assert 0 < st.moments.class_counts.sum() < st.n == 40
    _ok("target-reference", "u.h5", "pa.stats.npz", "ph.stats.npz", "-o", "t.ref.npz")
    _ok("align", "b.h5", "t.ref.npz", "--tau", "1", "-o", "b.t.h5")
    _ok("barycenter", "pa.stats.npz", "ph.stats.npz", "-o", "u.ref.npz", "--weights", "uniform")
    _ok("align", "a.h5", "u.ref.npz", "-o", "a.u.h5")
    for ref, n in (("t.ref.npz", [40]), ("u.ref.npz", [40, 40]), ("ref.npz", [40, 40])):
        r = load_reference(ref)
        assert r.n.tolist() == n and abs(r.weights.sum() - 1) < 1e-12
    _ok("fit-gmm", "u.h5", "-o", "u2.gmm.npz", "-k", "1", "--n-classes", "3", "--seed",
        str(2**32 - 1))
    assert load_gmm("u2.gmm.npz").meta["n_classes"] == 3
    _ok("dadil-round", "--init", "--client", "n0", "--gmm", "u2.gmm.npz", "--state",
        "n0.state.npz", "-o", "n0.atoms.npz", "--n-atoms", "2", "--seed", str(2**32 - 1))
    _ok("dadil-round", "--state", "n0.state.npz", "--local-steps", "1", "-o", "n0.r1.atoms.npz",
        "fed/c0.atoms.npz")
    for state, rounds in (("n0.state.npz", 1), ("c0.state.npz", 1), ("c1.state.npz", 0)):
        assert read_npz(state, "state")[0]["rng_state"].dtype == np.uint64
        assert load_state(state).round == rounds


# --------------------------------------------------------------------------------------------
# The mechanisms themselves (fedalign.files, fedalign.interrupt, the CLI's wording)
# --------------------------------------------------------------------------------------------


def test_atomic_outputs_all_or_nothing(tmp_path):
    from fedalign.files import atomic_output, atomic_outputs

    (tmp_path / "b.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_outputs():
            with atomic_output(tmp_path / "a.txt") as t:
                t.write_text("new a")
            with atomic_output(tmp_path / "b.txt") as t:
                t.write_text("new b")
            assert not (tmp_path / "a.txt").exists()  # nothing is renamed before the end
            raise RuntimeError("late failure")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt"]
    assert (tmp_path / "b.txt").read_text() == "old"
    with atomic_outputs() as tx:
        with atomic_output(tmp_path / "a.txt") as t:
            t.write_text("A")
        with atomic_output(tmp_path / "b.txt") as t:
            t.write_text("B")
        tx.commit_first(tmp_path / "b.txt")
        assert [e[1].name for e in tx.entries] == ["b.txt", "a.txt"]
    assert (tmp_path / "a.txt").read_text() == "A" and (tmp_path / "b.txt").read_text() == "B"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_atomic_output_of_a_folder_and_created_parents(tmp_path):
    from fedalign.errors import FedalignError
    from fedalign.files import atomic_output, atomic_outputs, make_output_folder

    with pytest.raises(FedalignError, match="boom"):
        with atomic_outputs():
            make_output_folder(tmp_path / "x" / "y")
            with atomic_output(tmp_path / "x" / "y" / "tree", directory=True) as d:
                (d / "f.txt").write_text("1")
                raise FedalignError("boom")
    assert list(tmp_path.iterdir()) == []
    with atomic_output(tmp_path / "tree", directory=True) as d:
        (d / "sub").mkdir()
        (d / "sub" / "f.txt").write_text("1")
    assert (tmp_path / "tree" / "sub" / "f.txt").read_text() == "1"


def test_same_file_spellings(tmp_path, monkeypatch):
    from fedalign.files import same_file

    monkeypatch.chdir(tmp_path)
    Path("a").write_text("x")
    Path("l").symlink_to("a")
    os.link("a", "h")
    os.mkdir("d")
    assert same_file("a", "./a") and same_file("a", "l") and same_file("a", "h")
    assert same_file("a", "d/../a") and same_file("a", tmp_path / "a")
    assert same_file("new", "./new") and not same_file("a", "b") and not same_file("new", "new2")


def test_check_spd():
    from fedalign.errors import FedalignError
    from fedalign.files import check_spd

    S = np.array([[2.0, 0.5], [0.5, 1.0]])
    np.testing.assert_array_equal(check_spd(S), S)
    check_spd(S + np.array([[0, 1e-12], [0, 0]]))  # rounding-level asymmetry
    for bad, msg in ((np.array([[2.0, 0.9], [0.1, 1.0]]), "symmetric"),
                     (np.array([[1.0, 2.0], [2.0, 1.0]]), "positive definite"),
                     (np.array([[1.0, 1.0], [1.0, 1.0]]), "positive definite"),
                     (np.zeros((2, 2)), "positive definite")):
        with pytest.raises(FedalignError, match=msg):
            check_spd(bad)


def test_deferred_signals_are_raised_at_the_end(monkeypatch):
    from fedalign import interrupt

    before = signal.getsignal(signal.SIGTERM)
    with interrupt.handlers():
        with pytest.raises(interrupt.Terminated):
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):
                    pass
                done = True  # the block finished despite the signal
        assert done and interrupt.exit_code(interrupt.Terminated()) == 143
    assert interrupt.pending() is None and signal.getsignal(signal.SIGTERM) == before


def test_an_error_names_its_parameter_by_the_commands_flag_not_in_paths():
    """The CLI shows an error's ``param`` as its flag; nothing else of the message changes."""
    from fedalign.cli.runtime import error_message
    from fedalign.errors import FedalignError

    flags = {"chunk_rows": "--chunk-rows", "drop": "--drop-classes", "lr": "--lr"}
    e = FedalignError("chunk_rows must be ≥ 1, got 0", param="chunk_rows")
    assert str(e) == "chunk_rows must be ≥ 1, got 0" and e.param == "chunk_rows"
    assert error_message(e, flags) == "--chunk-rows must be ≥ 1, got 0"
    assert error_message(FedalignError("drop: unknown class 'x'", param="drop"), flags) == \
        "--drop-classes: unknown class 'x'"
    assert error_message(FedalignError("learning rate must be > 0", param="lr"), flags) == \
        "--lr: learning rate must be > 0"
    for message in ("/data/chunk_rows/x.h5: bad", "chunk_rows_dir/x.h5: bad"):
        assert error_message(FedalignError(message), flags) == message
        assert error_message(FedalignError(message, param="chunk_rows"), flags) == \
            "--chunk-rows: " + message
    # a parameter the command does not have: the library's words
    assert error_message(FedalignError("tau must be in [0, 1]", param="tau"), flags) == \
        "tau must be in [0, 1]"


def test_spell_names_parameters_as_the_running_command_does():
    from fedalign.cli.runtime import flag_speller
    from fedalign.errors import spell, spelling

    assert (spell("skip_bad", True), spell("label_base", 1), spell("fmt")) == \
        ("skip_bad=True", "label_base 1", "fmt")
    speller = flag_speller({"skip_bad": "--skip-bad", "label_base": "--label-base",
                            "fmt": "--format"}, switches={"skip_bad"})
    with spelling(speller):
        assert (spell("skip_bad", True), spell("label_base", 1), spell("fmt")) == \
            ("--skip-bad", "--label-base 1", "--format")
        assert spell("n_classes") == "n_classes"   # not an option of this command
    assert spell("skip_bad", True) == "skip_bad=True"


def test_declared_ranges_are_one_error_line(here):
    """Ranges are declared with the options (the parser's check, before any file is read):
    one ``error:`` line naming the flag, exit 2, nothing written."""
    for args, flag in (
            (["align", "a.h5", "ref.npz", "-o", "x.h5", "--tau", "1.5"], "--tau"),
            (["align", "a.h5", "ref.npz", "-o", "x.h5", "--tau", "-0.1"], "--tau"),
            (["fit-gmm", "a.h5", "-o", "g.npz", "--seed", "-3"], "--seed"),
            (["dadil-envelope", "--atoms", "c0.state.npz", "--gmm", "a=a.gmm.npz", "--test",
              "a.test.h5", "--steps", "0"], "--steps"),
            (["plot", "reconstruction", "a.test.h5", "--state", "c0.state.npz", "--missing",
              "1", "-o", "r.png", "--n-per-class", "0"], "--n-per-class"),
            (["dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--state",
              "n.state.npz", "-o", "n.npz", "--lr-decay", "-1"], "--lr-decay")):
        line = refused(here, *args)
        assert flag in line and "Traceback" not in line, line
    # an open range (> 0) is the library's one check, named by the flag
    refused(here, "dadil-round", "--init", "--client", "n0", "--gmm", "a.gmm.npz", "--state",
            "n.state.npz", "-o", "n.npz", "--lr", "0", match=re.escape("--lr must be > 0, got 0"))

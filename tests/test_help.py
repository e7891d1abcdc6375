"""Every command's ``--help`` says what its source says: no text rewritten by a formatter
(``OUT/<domain>.c<k>.train.h5`` → ``OUT/.c.train.h5``, ``clients/*.train.h5`` →
``clients/.train.h5``, ``OUTPUT/<domain>/<digit>/<i>.png`` → ``OUTPUT///.png``), no type
labels (``<bool>``, ``<list[Path]>``), hyphenated names never split, and an example line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign import defaults
from fedalign.cli.app import PlainHelp, fold_notes

runner = CliRunner()

#: What the markdown/rich formatters and typer's type labels produced before.
MANGLED = [r"OUT/\.c", r"clients/\.train", r"clients/\.test", r"///", r"<bool>", r"<list\[",
           r"<(?:str|int|float|path|Path|int range|float range|text)>", r"\(default: \.aligned"]


def _commands():
    """(path, click command) of the root, every group and every subcommand."""
    found = []

    def walk(path, cmd):
        found.append((path, cmd))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(path + (name,), sub)

    walk((), get_command(app))
    return found


COMMANDS = _commands()
IDS = [" ".join(p) or "fedalign" for p, _ in COMMANDS]


def _help(path, width):
    r = runner.invoke(app, [*path, "--help"], terminal_width=width)
    assert r.exit_code == 0, r.output
    return r.output


def _squash(text: str) -> str:
    """Text without any whitespace (re-wrapping moves line breaks, nothing else)."""
    return "".join(text.split())


def test_every_command_is_found():
    names = {p[-1] for p, _ in COMMANDS if p}
    assert {"stats", "barycenter", "align", "extract", "partition", "evaluate", "import",
            "fit-gmm", "dadil-round", "dadil-simulate", "dadil-evaluate", "dadil-envelope", "consensus",
            "report", "demo-data", "plot", "embedding", "accuracy", "reconstruction"} <= names
    # every command renders through fedalign's plain help (a new command module cannot
    # bypass the `command` decorator's formatter unnoticed)
    assert all(isinstance(c, PlainHelp) for _, c in COMMANDS), \
        [p for p, c in COMMANDS if not isinstance(c, PlainHelp)]


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=IDS)
def test_help_is_the_source_text(path, cmd):
    for width in (200, 60):
        text = _help(path, width)
        for pattern in MANGLED:
            assert not re.search(pattern, text), f"{pattern!r} in help of {path} at width {width}"
        squashed = _squash(text)
        # every parameter's help and every docstring paragraph, exactly as written
        for p in cmd.params:
            if p.help:
                assert _squash(p.help) in squashed, (path, p.name, width)
        for para in (cmd.help or "").split("\n\n"):
            assert _squash(para) in squashed, (path, para[:40], width)
        # the examples verbatim, one command per line, whatever the width
        lines = [line.strip() for line in text.splitlines()]
        for line in (cmd.epilog or "").strip().splitlines():
            assert line.strip() in lines, (path, line, width)
        # hyphenated words (--var-floor-rel, SLOT-Align, 0-4) are never split across lines
        words = set(text.split())
        for source in [p.help or "" for p in cmd.params] + [cmd.help or ""]:
            for w in re.findall(r"\S+-\S+", source):
                assert w in words or w in text, (path, w, width)


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=IDS)
def test_help_has_an_example(path, cmd):
    text = _help(path, 200)
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith("Example:")]
    assert examples, f"no 'Example:' line in the help of {' '.join(path) or 'fedalign'}"
    assert any(("fedalign " + " ".join(path)).strip() in e for e in examples), (path, examples)


@pytest.mark.parametrize("path,cmd", [c for c in COMMANDS if c[0]], ids=IDS[1:])
def test_options_show_metavars_and_flags_none(path, cmd):
    text = _help(path, 200)
    for p in cmd.params:
        if p.param_type_name != "option" or getattr(p, "hidden", False):
            continue
        opts = ", ".join(p.opts)
        options = text[text.index("\nOptions:\n"):].splitlines()
        row = next(line for line in options if re.match(rf"  {re.escape(opts)}( |$)", line))
        head = row[2 + len(opts):].split("  ")[0].strip()
        if getattr(p, "is_flag", False):
            assert head == "", (path, p.opts, row)
        else:
            assert re.fullmatch(r"[A-Z][A-Z_|]*(\.\.\.)?", head), (path, p.opts, row)


def test_specific_texts():
    assert "OUT/<domain>.c<k>.train.h5" in _help(("partition",), 200)
    ev = _help(("evaluate",), 200)
    assert "--train clients/*.train.h5 --test clients/*.test.h5" in ev
    assert "--train PATH..." in ev  # the greedy options take several values
    assert "(default: <input>.aligned.h5)" in _help(("align",), 200)
    assert "OUTPUT/<domain>/<digit>/<i>.png" in _help(("demo-data",), 200)
    st = _help(("stats",), 200)
    assert re.search(r"^\s+--per-class\s+Also store", st, re.M)
    assert re.search(r"--chunk-rows INT .*\[default: 8192; ≥ 1\]", st)
    assert re.search(r"^Usage: fedalign partition \[OPTIONS\] DOMAINS\.\.\.$", _help(("partition",), 200), re.M)


def test_help_in_a_real_process_wide_terminal():
    """The entry point, not CliRunner: COLUMNS=200 as a wide terminal would set it."""
    import os

    env = dict(os.environ, COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "fedalign", "partition", "--help"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "OUT/<domain>.c<k>.train.h5" in r.stdout and "<list[" not in r.stdout
    assert "Example: fedalign partition amazon.h5 caltech10.h5 dslr.h5 webcam.h5 -o clients/ " \
           "--alpha 0.1 --seed 0" in r.stdout


def test_fit_gmm_message_says_K_is_C_times_k(feature_file, tmp_path):
    p, _, _ = feature_file("c.h5", n=120, d=4, n_classes=3)
    r = runner.invoke(app, ["fit-gmm", str(p), "-o", str(tmp_path / "g.npz"), "-k", "2"])
    assert r.exit_code == 0, r.output
    assert "K=6 components = C·k = 3·2" in r.output


def test_fold_notes_one_line_per_message():
    notes = [f"client {k} class {c}: a single sample, no GMM fitted (count sent)"
             for k, c in [(0, 3), (1, 5), (2, 7)]] + ["something else"]
    lines = fold_notes("fedpft", notes)
    assert lines == ["fedpft: a single sample, no GMM fitted (count sent) (3): client 0 class 3, "
                     "client 1 class 5, client 2 class 7", "fedpft: something else"]
    assert fold_notes("fedpft", notes[:1]) == ["fedpft: " + notes[0]]


def test_help_numbers_come_from_the_code():
    """Defaults and the presets' values in the help are the code's (``--lr`` said "gd …
    default 0.5" while the preset stepped 0.2)."""
    from fedalign.dadil.optim import PRESETS

    assert PRESETS is defaults.DADIL_PRESETS
    fed, ref = PRESETS["fedalign"], PRESETS["reference"]
    for cmd in ("dadil-round", "dadil-simulate"):
        text = " ".join(_help((cmd,), 200).split())
        assert f"(fedalign {fed['optimizer']} {fed['lr']:g}, reference {ref['optimizer']} " \
               f"{ref['lr']:g})" in text and "default 0.5" not in text
        assert f"Adam lr {ref['lr']:g}, α projected, min_var {ref['min_var']:g}" in text
        assert f"fedalign {fed['lr_alpha']:g}, reference {ref['lr_alpha']:g}" in text
        assert re.search(rf"--n-atoms INT .*\[default: {defaults.N_ATOMS}; ≥ 1\]", text)
        assert re.search(rf"--local-steps, -E INT .*\[default: {defaults.LOCAL_STEPS}; ≥ 0\]", text)
    ev = " ".join(_help(("dadil-evaluate",), 200).split())
    assert re.search(rf"--n-atoms INT .*\[default: {defaults.N_ATOMS}; ≥ 1\]", ev)
    assert f"[default: {defaults.TAU}; 0 ≤ x ≤ 1]" in _help(("align",), 200)


@pytest.mark.parametrize("path", [[], ["align"], ["dadil-round"]])
def test_help_imports_neither_numpy_nor_torch(path):
    code = ("import sys; from fedalign.cli import app\n"
            f"sys.argv = ['fedalign', *{path!r}, '--help']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', [m for m in ('numpy', 'torch', 'h5py') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr

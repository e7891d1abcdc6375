"""README.md works when pasted: the "SLOT-Align by hand" block runs as written (on generated
features files named as the README names them), every command it uses exists with the
options it gives, and the subcommand table lists every command."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

from fedalign.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert m, f"README has no section '## {title}'"
    return m.group(1)


def by_hand_block(title: str = "SLOT-Align by hand") -> str:
    m = re.search(r"```bash\n(.*?)```", section(title), re.S)
    assert m, f"no ```bash block in '{title}'"
    return m.group(1)


def commands_in(block: str) -> list:
    """Every ``fedalign ...`` invocation of a shell block, continuation lines joined and
    comments dropped, as argument lists."""
    text = block.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split(" #")[0]
        for part in re.split(r";|&&|\bdo\b", line):
            words = shlex.split(part)
            if words and words[0] == "fedalign":
                out.append(words[1:])
    return out


ROOT_CMD = get_command(app)


def resolve(words):
    cmd, rest = ROOT_CMD, list(words)
    while rest and rest[0] in getattr(cmd, "commands", {}):
        cmd = cmd.commands[rest.pop(0)]
    return cmd, rest


@pytest.mark.parametrize("title", ["SLOT-Align by hand",
                                   "DeFed-GMM-DaDiL by hand, next to the DA peers"])
def test_by_hand_block_uses_real_commands_and_options(title):
    block = by_hand_block(title)
    used = commands_in(block)
    assert len(used) >= 6
    for words in used:
        cmd, rest = resolve(words)
        assert not getattr(cmd, "commands", None), f"not a command: fedalign {' '.join(words)}"
        opts = {o for p in cmd.params for o in list(p.opts) + list(p.secondary_opts)
                if p.param_type_name == "option"}
        for w in rest:
            if w.startswith("-") and not re.fullmatch(r"-?\d[\d.,-]*", w):
                assert w in opts, f"fedalign {words[0]}: no option {w}"


def test_by_hand_block_creates_its_output_folders_first():
    block = by_hand_block()
    for folder in sorted(set(re.findall(r"-o (\w+)/", block))):
        if folder == "clients":  # partition creates its output folder itself
            continue
        first_use = block.index(f"-o {folder}/")
        assert re.search(rf"mkdir -p [^\n]*\b{folder}\b", block[:first_use]), \
            f"'{folder}/' is written before any 'mkdir -p {folder}'"


def test_subcommand_table_lists_every_command():
    table = section("Subcommands")
    listed = set(re.findall(r"^\| `fedalign ([a-z][a-z0-9-]*)", table, re.M))
    registered = set(ROOT_CMD.commands)
    assert registered - listed == set(), f"missing from the README table: {sorted(registered - listed)}"
    assert listed - registered == set(), f"the README lists unknown commands: {sorted(listed - registered)}"
    # the table renders: no unescaped | inside a cell
    for row in re.findall(r"^\|.*\|$", table, re.M):
        assert len(re.split(r"(?<!\\)\|", row)) == 4, row


def test_install_note_names_the_cpu_only_torch():
    assert "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in README
    assert "6 GB" in README


def _fedalign_on_path(tmp_path) -> dict:
    """A ``fedalign`` on PATH that runs this checkout with this interpreter."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "fedalign"
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m fedalign "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", POT_BACKEND_DISABLE_PYTORCH="1")
    return env


@pytest.mark.slow  # ~20 subprocesses (about 30 s on 2 busy cores)
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_by_hand_block_runs_as_written(tmp_path):
    from conftest import make_features

    block = by_hand_block()
    domains = re.findall(r"(\w+)\.h5", block.splitlines()[0])
    assert domains == ["amazon", "caltech10", "dslr", "webcam"]
    work = tmp_path / "work"
    work.mkdir()
    for i, dom in enumerate(domains):  # the four files the text says to start from
        make_features(work / f"{dom}.h5", n=240, d=8, n_classes=4, seed=10 + i, shift=0.5 * i)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=_fedalign_on_path(tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "error:" not in r.stderr
    for dom in domains:
        assert (work / "aligned" / f"{dom}.c0.train.h5").is_file()
        assert (work / "aligned" / f"{dom}.test.h5").is_file()
    assert (work / "slot.json").is_file() and (work / "base.json").is_file()
    assert "accuracy (%)" in r.stdout and "+SLOT τ=0.4" in r.stdout

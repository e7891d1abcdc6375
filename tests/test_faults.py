"""Killed runs leave nothing (issue 13, class 4; and the dadil-round pair, classes 3 and 8).

Every writing command runs in a real subprocess whose commit is stalled by a driver (it
replaces :func:`fedalign.files.transactions._before_commit`, the seam just before the renames,
or a writer's append); the test then sends SIGTERM, SIGINT or SIGKILL:

- SIGTERM → exit 143, SIGINT → exit 130, one ``error:`` line, the folder exactly as before;
- SIGKILL → the temporaries stay (nothing can run), and the next run of the same command
  removes them (or, for ``extract``, resumes from its resume file) and succeeds.

Slow (a Python start per run): ``pytest -m slow tests/test_faults.py``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_bad_inputs import SPECS, argv, snapshot, world  # noqa: F401  (world: fixture)

pytestmark = pytest.mark.slow

DRIVER = textwrap.dedent("""
    import os, sys, time
    import fedalign.files as F
    import fedalign.files.transactions as T

    def stall(*a, **k):
        sys.stderr.write("READY\\n")
        sys.stderr.flush()
        time.sleep(120)

    mode = os.environ.get("FEDALIGN_STALL", "commit")
    if mode == "commit":
        T._before_commit = stall
    elif mode == "append":  # stall in the middle of writing (after the first block)
        real, calls = F.FeatureWriter.append, []

        def append(self, *a, **k):
            real(self, *a, **k)
            calls.append(1)
            if len(calls) == 1:
                stall()
        F.FeatureWriter.append = append
    elif mode == "between-renames":  # die after the first rename of a commit
        real_replace, done = os.replace, []

        def replace(a, b):
            real_replace(a, b)
            done.append(b)
            if len(done) == 1 and ".fedalign-tmp-" in str(a):
                os.kill(os.getpid(), 9)
        T.os.replace = replace
    from fedalign.cli import main
    sys.argv = ["fedalign"] + sys.argv[1:]
    main()
""")

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


@pytest.fixture
def here(world, tmp_path, monkeypatch):  # noqa: F811
    import shutil

    d = tmp_path / "w"
    shutil.copytree(world, d, symlinks=True)
    monkeypatch.chdir(d)
    return d


def start(args, stall="commit"):
    env = dict(ENV, FEDALIGN_STALL=stall)
    return subprocess.Popen([sys.executable, "-c", DRIVER, *map(str, args)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=0)


def wait_ready(p, timeout=120.0) -> str:
    """Read stderr (unbuffered) until the driver says READY: the command is stalled mid-write."""
    fd, seen, t0 = p.stderr.fileno(), b"", time.monotonic()
    while time.monotonic() - t0 < timeout:
        r, _, _ = select.select([fd], [], [], 1.0)
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk
            if b"READY\n" in seen:
                return seen.decode(errors="replace")
    p.kill()
    raise AssertionError(f"never stalled (rc {p.poll()}): {seen.decode(errors='replace')}")


def finish(p, timeout=60) -> str:
    """Wait for the process; its stderr after READY."""
    _, err = p.communicate(timeout=timeout)
    return err.decode(errors="replace")


def run(args):
    return subprocess.run([sys.executable, "-m", "fedalign", *map(str, args)], env=ENV,
                          capture_output=True, text=True)


#: Every writing command: a valid command line (from test_bad_inputs.SPECS, plus folders).
COMMANDS = {name: argv(name) for name in SPECS}
COMMANDS["partition"] = ["partition", "a.h5", "b.h5", "-o", "clients", "--alpha", "none"]
COMMANDS["demo-data"] = ["demo-data", "demo", "--per-domain", "3", "--size", "8"]


@pytest.mark.parametrize("name", list(COMMANDS))
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_mid_write_exits_and_leaves_nothing(here, name, signum, code):
    before = snapshot(here)
    p = start(COMMANDS[name])
    wait_ready(p)
    p.send_signal(signum)
    err = finish(p)
    assert p.returncode == code, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: interrupted") and "Traceback" not in err, err
    after = snapshot(here)
    if name == "extract":  # the documented exception: the resume file stays, nothing else
        assert [k for k in after if k not in before] == [".new.h5.partial.h5"]
        after.pop(".new.h5.partial.h5")
    assert after == before


@pytest.mark.parametrize("name", list(COMMANDS))
def test_sigkill_leaves_temporaries_that_the_next_run_removes(here, name):
    before = snapshot(here)
    p = start(COMMANDS[name])
    wait_ready(p)
    p.send_signal(signal.SIGKILL)
    finish(p)
    assert p.returncode == -signal.SIGKILL
    after = snapshot(here)
    new = {n for n in set(after) - set(before) if after[n] != "dir"}  # (a folder it created)
    assert new and all("fedalign-tmp" in n or n.endswith(".partial.h5") for n in new), new
    r = run(COMMANDS[name])
    assert r.returncode == 0, r.stderr
    assert not [n for n in snapshot(here) if "fedalign-tmp" in n or n.endswith(".partial.h5")]


@pytest.mark.parametrize("args", [COMMANDS["align"], COMMANDS["partition"]],
                         ids=["align", "partition"])
def test_kill_in_the_middle_of_writing_rows(here, args):
    before = snapshot(here)
    for signum, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        p = start(args + (["--chunk-rows", "8"] if args[0] == "align" else []), stall="append")
        wait_ready(p)
        p.send_signal(signum)
        finish(p)
        assert p.returncode == code
        assert snapshot(here) == before


def test_dadil_round_killed_between_state_and_atoms_is_repaired(here):
    from fedalign.files import read_npz

    os.mkdir("r1")
    os.mkdir("r2")
    t = read_npz("c0.state.npz", "state")[1]["published"]["round"]
    p = start(["dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o",
               "r1/c0.atoms.npz", "fed/c1.atoms.npz"], stall="between-renames")
    finish(p, timeout=120)
    assert p.returncode == -signal.SIGKILL
    _, meta = read_npz("c0.state.npz", "state")  # the state was renamed first: round t + 1
    assert meta["published"]["round"] == t + 1 and not Path("r1/c0.atoms.npz").exists()
    r = run(["dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o",
             "r2/c0.atoms.npz", "fed/c1.atoms.npz"])
    assert r.returncode == 0 and "republished" in r.stderr, r.stderr
    from fedalign.files import sha256_file

    assert sha256_file("r1/c0.atoms.npz") == meta["published"]["sha256"]
    assert not [n for n in snapshot(here) if "fedalign-tmp" in n]


def test_two_dadil_rounds_on_one_state(here):
    """The second process fails cleanly on the lock; the state stays valid."""
    from fedalign.dadil.state import load_state

    args = ["dadil-round", "--state", "c0.state.npz", "--local-steps", "1", "-o", "{}",
            "fed/c1.atoms.npz"]
    state = Path("c0.state.npz").read_bytes()
    p = start([a.format("x.atoms.npz") for a in args])
    wait_ready(p)  # holds the lock, stalled before its commit
    r = run([a.format("y.atoms.npz") for a in args])
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith("error:") and "locked by another dadil-round" in r.stderr
    p.send_signal(signal.SIGTERM)
    finish(p)
    assert p.returncode == 143
    assert Path("c0.state.npz").read_bytes() == state
    load_state("c0.state.npz")
    assert run([a.format("y.atoms.npz") for a in args]).returncode == 0

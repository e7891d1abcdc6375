"""``examples/flower/launch.py`` through real subprocesses: bad input is one ``error:`` line and
exit 2 with nothing started; a launch stopped by Ctrl-C leaves no process behind; a small
launch equals the file pipeline (slow). Skipped without Flower."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedalign.files import write_features  # noqa: E402

LAUNCH = Path(__file__).resolve().parents[1] / "examples" / "flower" / "launch.py"


def features(root: Path, d: int = 4, rows: int = 120, domains=("a", "b"), seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for i, dom in enumerate(domains):
        y = rng.integers(0, 2, rows)
        X = (rng.normal(size=(rows, d)) + 3 * y[:, None] + i).astype(np.float32)
        p = root / f"{dom}.h5"
        write_features(p, X, y, [f"{dom}{j}" for j in range(rows)], ["x", "y"], dict(domain=dom))
        out.append(p)
    return out


def launch(*args, cwd=None, **kw) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.Popen([sys.executable, str(LAUNCH), *map(str, args)], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def marked(pid: int) -> list:
    """Running processes carrying the token of launcher ``pid``."""
    tok = f"FEDALIGN_FLOWER_TOKEN=fedalign-launch-{pid}-".encode()
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                env = Path(f"/proc/{d}/environ").read_bytes()
                state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if tok in env and state != "Z":
                out.append(int(d))
    return out


def bad(tmp_path, *args, match: str) -> None:
    p = launch(*args, "-o", tmp_path / "out")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    assert "Traceback" not in out + err
    assert not (tmp_path / "out" / "logs").exists()  # nothing started
    assert marked(p.pid) == []


def test_bad_input_is_one_error_line_and_nothing_starts(tmp_path):
    a, b = features(tmp_path)
    bad(tmp_path, "-n", 1, a, b, match="N must be ≥ 2")
    (tmp_path / "odd").mkdir()
    odd = features(tmp_path / "odd", d=5, domains=("c",))
    bad(tmp_path, "-n", 2, a, *odd, match="features of different dimensions")
    bad(tmp_path, "-n", 30, a, b, match="N=30 is more sites than the rows allow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        bad(tmp_path, "-n", 2, a, b, "--port", s.getsockname()[1], match="is in use")


SMALL = ("--heads", "fedcgs", "--seeds", "0", "--rounds", "2", "--local-steps", "2",
         "--n-components", "6", "--min-rows", "5", "--timeout", "150", "--alpha", "5")


@pytest.mark.slow
def test_ctrl_c_stops_every_process(tmp_path):
    files = features(tmp_path)
    p = launch("-n", 3, *files, "-o", tmp_path / "out", *SMALL)
    # both pipes drained by threads: the wait below is bounded even when the launcher prints
    # nothing, and a full stderr pipe cannot block it
    outq, errq = queue.Queue(), queue.Queue()
    readers = [threading.Thread(target=lambda f=f, q=q: [q.put(ln) for ln in f], daemon=True)
               for f, q in ((p.stdout, outq), (p.stderr, errq))]
    for t in readers:
        t.start()
    t_end = time.monotonic() + 300
    seen = ""
    try:
        while "Flower run 1" not in seen:  # the SuperLink and the SuperNodes are up
            alive = p.poll() is None or not outq.empty()  # or its last lines still queued
            assert time.monotonic() < t_end and alive, seen + "".join(errq.queue)
            try:
                seen += outq.get(timeout=1.0)
            except queue.Empty:
                pass
        assert len(marked(p.pid)) >= 4
    finally:  # also when the wait failed: the launcher stops what it started
        p.send_signal(signal.SIGINT)
        p.wait(120)
    for t in readers:
        t.join(10)
    out, err = seen + "".join(outq.queue), "".join(errq.queue)
    assert p.returncode == 130, out + err
    assert "stopped the SuperLink and 3 SuperNodes" in out
    assert marked(p.pid) == []


@pytest.mark.slow
def test_small_launch_equals_the_file_pipeline(tmp_path):
    files = features(tmp_path, domains=("a", "b", "c"))
    p = launch("-n", 4, *files, "-o", tmp_path / "out", "--target", "b", *SMALL)
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, out[-3000:] + err[-3000:]
    assert "sites: a.c0, a.c1, b.c0, c.c0" in out
    assert out.count("\nequal   ") == 3 + 4 and "DIFFER" not in out
    assert (tmp_path / "out" / "metrics.json").is_file()
    assert marked(p.pid) == []


@pytest.mark.slow
def test_small_launch_with_premap_equals_the_file_pipeline(tmp_path):
    """``--premap``: the DeFed run maps the sources onto the target's completed Gaussian as
    exchanges; the comparison adds the reference and every site's GMM."""
    files = features(tmp_path, domains=("a", "b", "c"))
    p = launch("-n", 3, *files, "-o", tmp_path / "out", "--target", "b", "--premap", *SMALL)
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, out[-3000:] + err[-3000:]
    assert "sites: a.c0, b.c0, c.c0" in out
    assert out.count("\nequal   ") == 3 + 1 + 3 + 3 and "DIFFER" not in out
    assert "equal   GMM b.c0.gmm.npz" in out
    assert marked(p.pid) == []

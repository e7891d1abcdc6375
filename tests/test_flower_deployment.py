"""End to end on Flower's deployment engine: a real SuperLink and 3 SuperNodes on loopback.

Free ports on 127.0.0.1, ``FLWR_HOME`` in a temporary folder, ``flwr run`` of
``examples/flower``; both methods, compared with the file pipeline. Every process started
here is stopped by the test, also when it fails. Skipped without Flower; marked slow (each
exchange waits for the SuperNodes' polling, a few seconds).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedalign.flower import compare  # noqa: E402

from test_flower_app import SITES, file_defed, file_slot, make_sites, node_fed  # noqa: E402

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[1] / "examples" / "flower"


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not found")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc, seconds: float = 60.0) -> None:
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds:g} s")


class Deployment:
    """A SuperLink and one SuperNode per node config, each in its own process group."""

    def __init__(self, root: Path, nodes: list):
        self.root, self.nodes, self.procs, self.runs = root, nodes, [], 0
        # Flower starts flower-superexec, flwr-serverapp and flwr-clientapp by name: the bin
        # folder of this Python goes first on PATH. Every process carries TOKEN in its
        # environment, so the ones Flower detached from their parent are found and stopped too.
        self.token = f"fedalign-test-{os.getpid()}-{time.monotonic_ns()}"
        path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
        self.env = dict(os.environ, FLWR_HOME=str(root / "flwr-home"), OMP_NUM_THREADS="1",
                        PATH=path, FEDALIGN_FLOWER_TOKEN=self.token)
        (root / "flwr-home").mkdir(parents=True, exist_ok=True)

    def _start(self, args, log):
        f = open(self.root / log, "w")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=self.env, cwd=self.root,
                             start_new_session=True, stdin=subprocess.DEVNULL)  # nothing in the repo
        self.procs.append((p, f))
        return p

    def __enter__(self):
        try:
            port = free_port()
            link = self._start([_tool("flower-superlink"), "--insecure", "--host", "127.0.0.1",
                                "--port", str(port), "--disable-runtime-dependency-installation"],
                               "superlink.log")
            wait_port(port, link)
            for n in self.nodes:
                cfg = " ".join(f'{k}="{v}"' for k, v in n.items())
                self._start([_tool("flower-supernode"), "--insecure", "--superlink",
                             f"127.0.0.1:{port}", "--host", "127.0.0.1", "--port", str(free_port()),
                             "--node-config", cfg], f"supernode-{n['name']}.log")
            (self.root / "flwr-home" / "config.toml").write_text(
                f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                f'address = "127.0.0.1:{port}"\ninsecure = true\n')
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def run(self, config: dict, report: Path, timeout: float = 400.0) -> None:
        over = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in config.items())
        r = subprocess.run([_tool("flwr"), "run", str(APP), "local", "--stream", "--run-config", over],
                           env=self.env, cwd=self.root, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        self.runs += 1
        (self.root / f"flwr-run-{self.runs}.log").write_text(r.stdout + r.stderr)
        if not report.is_file():
            raise AssertionError(f"no {report.name}; flwr run said:\n{r.stdout[-3000:]}\n"
                                 f"{r.stderr[-2000:]}\nsuperlink:\n{self.tail('superlink.log')}")

    def tail(self, log: str, n: int = 3000) -> str:
        p = self.root / log
        return p.read_text(errors="replace")[-n:] if p.is_file() else ""

    def marked(self) -> list:
        """Processes whose environment carries this deployment's token."""
        out, tok = [], f"FEDALIGN_FLOWER_TOKEN={self.token}".encode()
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                try:
                    if tok in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                        out.append(int(d))
                except OSError:
                    pass
        return out

    def __exit__(self, *exc):
        for p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for pid in self.marked():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        t_end = time.monotonic() + 15
        for p, f in self.procs:
            try:
                p.wait(max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            f.close()
        while self.marked() and time.monotonic() < t_end:
            time.sleep(0.2)
        for pid in self.marked():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p, _ in self.procs:
            if p.poll() is None:
                p.wait(5)
        return False


def test_both_methods_on_a_local_superlink_equal_the_file_pipeline(tmp_path, one_thread):
    nodes = make_sites(tmp_path)
    out = tmp_path / "flower"
    with Deployment(tmp_path, nodes) as dep:
        dep.run({"method": "slot", "out": str(out), "heads": "fedcgs,fed3r", "seeds": "0-1",
                 "clients": 3, "timeout": 120.0}, out / "slot.json")
        dep.run({"method": "defed", "out": str(out), "rounds": 2, "local-steps": 2,
                 "n-components": 6, "clients": 3, "timeout": 120.0}, out / "defed-aggregation.json")
        assert len(dep.marked()) > len(dep.procs)  # Flower's own subprocesses carry the token
    # every process of the deployment is gone (zombies that PID 1 has not reaped yet excepted)
    assert all(p.poll() is not None for p, _ in dep.procs) and dep.marked() == []
    file_slot(tmp_path, nodes, tmp_path / "files", ("fedcgs", "fed3r"), "0-1")
    file_defed(nodes, tmp_path / "files" / "aggregation", 2, "aggregation")
    checks = [compare.compare_references(out / "ref.npz", tmp_path / "files" / "ref.npz"),
              compare.compare_reports(out / "slot.json", tmp_path / "files" / "slot.json")]
    checks += [compare.compare_federations(node_fed(nodes, c, "aggregation"),
                                           tmp_path / "files" / "aggregation") for c in SITES]
    for ok, line in checks:
        assert ok, line


def test_processes_are_stopped_when_the_run_fails(tmp_path):
    nodes = make_sites(tmp_path)
    with pytest.raises(AssertionError, match="no slot.json"):
        with Deployment(tmp_path, nodes) as dep:
            # a head the app refuses: the ServerApp stops with one error line
            dep.run({"method": "slot", "out": str(tmp_path / "o"), "heads": "centralized"},
                    tmp_path / "o" / "slot.json", timeout=120)
    assert all(p.poll() is not None for p, _ in dep.procs) and dep.marked() == []
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))
    assert "error: head centralized is not available across sites" in logs

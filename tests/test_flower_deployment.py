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

from test_flower_app import (SITES, defed_lost_files, file_defed, file_slot, make_sites,  # noqa: E402
                             node_fed)

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


def send(pids, sig) -> list:
    """``sig`` to each of ``pids`` → the pids it reached (one that has ended is skipped)."""
    reached = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            reached.append(pid)
        except ProcessLookupError:
            pass
    return reached


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

    def _start(self, args, log, site=""):
        f = open(self.root / log, "a")
        # each process marked with its site too: a lost site's ClientApp dies with it
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=self.root,
                             env=dict(self.env, FEDALIGN_FLOWER_SITE=site),
                             start_new_session=True, stdin=subprocess.DEVNULL)  # nothing in the repo
        self.procs.append((p, f))
        return p

    def start_node(self, n: dict):
        cfg = " ".join(f'{k}="{v}"' for k, v in n.items())
        return self._start([_tool("flower-supernode"), "--insecure", "--superlink",
                            f"127.0.0.1:{self.port}", "--host", "127.0.0.1", "--port",
                            str(free_port()), "--node-config", cfg],
                           f"supernode-{n['name']}.log", site=n["name"])

    def kill_site(self, name: str) -> None:
        """SIGKILL one SuperNode's process group and every process of its site (a site lost);
        returns when none is left."""
        for p, _ in self.procs:
            if p.poll() is None and p.args[0].endswith("flower-supernode") and \
                    f'name="{name}"' in p.args[-1]:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        send(self.marked(name), signal.SIGKILL)
        t_end = time.monotonic() + 10
        while self.marked(name) and time.monotonic() < t_end:
            time.sleep(0.1)
        assert self.marked(name) == [], f"processes of {name} survived SIGKILL"

    def start_run(self, config: dict) -> subprocess.Popen:
        """``flwr run --stream`` in the background; its output in flwr-run-K.log."""
        over = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={str(v).lower()}"
                        if isinstance(v, bool) else f"{k}={v}" for k, v in config.items())
        self.runs += 1
        return self._start([_tool("flwr"), "run", str(APP), "local", "--stream", "--run-config",
                            over], f"flwr-run-{self.runs}.log")

    def wait_for(self, text: str, proc, seconds: float = 400.0) -> None:
        """Until the running ``flwr run`` has streamed ``text``."""
        log = self.root / f"flwr-run-{self.runs}.log"
        t_end = time.monotonic() + seconds
        while text not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > t_end:
                raise AssertionError(f"no {text!r} in the run's output:\n{self.tail(log.name)}")
            time.sleep(0.2)

    def finish(self, proc, report: Path | None, seconds: float = 400.0) -> None:
        proc.wait(seconds)
        if report is not None and not report.is_file():
            raise AssertionError(f"no {report.name}; flwr run said:\n"
                                 f"{self.tail(f'flwr-run-{self.runs}.log')}")

    def __enter__(self):
        try:
            self.port = port = free_port()
            link = self._start([_tool("flower-superlink"), "--insecure", "--host", "127.0.0.1",
                                "--port", str(port), "--disable-runtime-dependency-installation"],
                               "superlink.log")
            wait_port(port, link)
            for n in self.nodes:
                self.start_node(n)
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

    def settle_clientapps(self, quiet: float = 8.0, seconds: float = 180.0) -> list:
        """Until no ``flwr-clientapp`` of this deployment has run for ``quiet`` seconds: the
        nodes finish the tasks of a run whose ServerApp died. Bounded, never for ever (a CI run
        once hung in an unbounded form of this wait): ClientApps still running after
        ``seconds`` (Flower serving a dead run's tasks on) are killed, as an operator would,
        for at most ``quiet`` seconds more; the nodes' states are what they left, and a resumed
        run starts from them. Returns the pids killed."""
        t_end, killed = time.monotonic() + seconds, []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet and time.monotonic() < t_end + quiet:
            apps = self.marked(program="flwr-clientapp")
            if apps:
                quiet_since = time.monotonic()
            if apps and time.monotonic() > t_end:
                print(f"killing flwr-clientapp {apps}: still running after {seconds:g} s",
                      file=sys.stderr)
                killed += send(apps, signal.SIGKILL)
            time.sleep(0.5)
        return killed

    def tail(self, log: str, n: int = 3000) -> str:
        p = self.root / log
        return p.read_text(errors="replace")[-n:] if p.is_file() else ""

    def marked(self, site: str | None = None, program: str | None = None) -> list:
        """Running processes whose environment carries this deployment's token (and, given
        ``site``, that site's mark; given ``program``, with that name on their command line)."""
        out, tok = [], f"FEDALIGN_FLOWER_TOKEN={self.token}".encode()
        mark = None if site is None else f"FEDALIGN_FLOWER_SITE={site}".encode()
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                try:
                    env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
                    zombie = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
                    argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")[:3]
                except (OSError, IndexError):
                    continue
                if tok in env and (mark is None or mark in env) and not zombie and (
                        program is None or any(Path(a.decode()).name == program for a in argv)):
                    out.append(int(d))
        return out

    def __exit__(self, *exc):
        for p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        send(self.marked(), signal.SIGTERM)
        t_end = time.monotonic() + 15
        for p, f in self.procs:
            try:
                p.wait(max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            f.close()
        while self.marked() and time.monotonic() < t_end:
            time.sleep(0.2)
        send(self.marked(), signal.SIGKILL)
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


# --------------------------------------------------------------------------------------------
# Sites that fail, on the real engine: one deployment for the three cases (its start-up and
# the SuperLink's 60 s to declare a killed node offline are the cost). Tiny data, few rounds.
# --------------------------------------------------------------------------------------------

LOST = "neon"
RUN = {"clients": 3, "timeout": 150.0, "wait": 150.0}
DEFED = dict(RUN, method="defed", rounds=3, **{"local-steps": 2, "n-components": 6})


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossy")
    nodes = make_sites(root)
    with Deployment(root, nodes) as dep:
        yield dep
    # every process of the deployment is gone, the killed and restarted ones included
    assert all(p.poll() is not None for p, _ in dep.procs) and dep.marked() == []


def _report(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


def test_slot_completes_when_a_supernode_is_killed_mid_run(lossy, one_thread):
    dep, root, nodes = lossy, lossy.root, lossy.nodes
    out = root / "slot-lost"
    run = dep.start_run(dict(RUN, method="slot", out=str(out), heads="fedcgs,fed3r", seeds="0-1"))
    dep.wait_for("barycenter of 3 clients", run)
    dep.kill_site(LOST)  # after its statistics, before (or during) its heads
    dep.finish(run, out / "slot.json")
    rep = _report(out / "slot.json")
    (lost,) = rep["dropped"]
    labels = [e["label"] for e in rep["exchanges"]]
    assert lost["client"] == LOST and lost["lost_at"] in ("heads round 0", "evaluate")
    assert lost["missed"] == labels[labels.index(lost["lost_at"]):]
    assert [c["name"] for c in rep["clients"]] == ["blocky", "ink"]
    assert rep["domains"] == ["blocky", "ink"]  # its domain's accuracy is what it missed last
    assert any(LOST in w and "dropped" in w for w in rep["warnings"])
    comm = rep["communication"]["per_client"]
    assert all(comm[c]["evaluate"]["sent"] > 0 for c in ("blocky", "ink"))
    assert "evaluate" not in comm[LOST] or comm[LOST]["evaluate"]["received"] == 0
    assert sorted(p.name for p in out.iterdir()) == ["ref.npz", "slot.json"]  # nothing partial
    # what the remaining sites received equals the file pipeline: the barycenter of all three
    # (their statistics arrived), heads from the clients whose messages arrived
    from test_flower_app import cli

    f = root / "files-slot-lost"
    f.mkdir()
    train = ["blocky", "ink"] + ([LOST] if lost["lost_at"] == "evaluate" else [])
    for n in nodes:
        cli("stats", n["train"], "-o", f / f"{n['name']}.stats.npz")
    cli("barycenter", *[f / f"{n['name']}.stats.npz" for n in nodes], "-o", f / "ref.npz")
    for n in nodes:
        if n["name"] in train:
            c = n["name"]
            cli("align", "--tau", 0.4, n["train"], f / "ref.npz", "--stats", f / f"{c}.stats.npz",
                "-o", f / f"{c}.c0.train.h5", "--save-map", f / f"{c}.map.npz")
            cli("align", "--tau", 0.4, "--map", f / f"{c}.map.npz", n["test"], "-o", f / f"{c}.test.h5")
    cli("evaluate", "-m", "fedcgs", "-m", "fed3r", "--seeds", "0-1",
        "--train", *[f / f"{c}.c0.train.h5" for c in train],
        "--test", *[f / f"{c}.test.h5" for c in ("blocky", "ink")], "--json", f / "slot.json")
    for ok, line in (compare.compare_references(out / "ref.npz", f / "ref.npz"),
                     compare.compare_reports(out / "slot.json", f / "slot.json")):
        assert ok, line
    dep.start_node(next(n for n in nodes if n["name"] == LOST))  # back for the next case


def test_defed_goes_on_without_a_killed_supernode_and_takes_it_back(lossy, one_thread):
    from fedalign.dadil import load_state

    dep, root, nodes = lossy, lossy.root, lossy.nodes
    out = root / "defed-lost"
    run = dep.start_run(dict(DEFED, out=str(out), federation="lost", fresh=True))
    dep.wait_for("DeFed lost round 1:", run)
    dep.kill_site(LOST)
    dep.finish(run, out / "defed-lost.json")
    rep = _report(out / "defed-lost.json")
    (lost,) = rep["dropped"]
    labels = [e["label"] for e in rep["exchanges"]]
    t = int(lost["lost_at"].split()[-1])
    assert lost["client"] == LOST and lost["lost_at"] == f"round {t}" and t >= 2
    assert lost["missed"] == labels[labels.index(lost["lost_at"]):]
    assert rep["clients"] == ["blocky", "ink"] and sorted(p.name for p in out.iterdir()) == [
        "defed-lost.json"]
    for rec in rep["rounds_record"][t - 1:]:  # rounds t…: only the others took part
        assert sorted(rec) == ["blocky", "ink"]
    for rec in rep["rounds_record"][t:]:  # and after round t none got atoms from it
        assert all(LOST not in (r["peers"] or []) for r in rec.values())
    if t < 3:  # the peers that had named it for round t + 1 drew again
        assert f"redraw before round {t + 1}" in labels
    state = node_fed(nodes, LOST, "lost") / "state" / f"{LOST}.state.npz"
    k = load_state(state).round  # intact: it loads, with the rounds it had done
    assert k in (t - 1, t)

    # the lost SuperNode restarts; the next run takes it back: it catches up from its own state
    dep.start_node(next(n for n in nodes if n["name"] == LOST))
    run = dep.start_run(dict(DEFED, out=str(out), federation="lost", rounds=4))
    dep.finish(run, out / "defed-lost.json")
    rep = _report(out / "defed-lost.json")
    assert rep["resumed"] and rep["started_at_round"] == k and rep["dropped"] == []
    assert rep["clients"] == ["blocky", "ink", LOST]
    assert all(LOST in rec for rec in rep["rounds_record"])
    fed = root / "files-lost"
    defed_lost_files(nodes, fed, LOST, k, t, 3, 4)
    for n in nodes:
        ok, line = compare.compare_federations(node_fed(nodes, n["name"], "lost"), fed)
        assert ok, line


def test_defed_resumes_after_the_serverapp_is_killed(lossy, one_thread):
    dep, root, nodes = lossy, lossy.root, lossy.nodes
    out = root / "defed-crash"
    run = dep.start_run(dict(DEFED, out=str(out), federation="crash", fresh=True))
    dep.wait_for("DeFed crash round 1:", run)
    apps = dep.marked(program="flwr-serverapp")
    assert apps, "no flwr-serverapp process found"
    for pid in apps:
        os.kill(pid, signal.SIGKILL)
    try:
        run.wait(120)
    except subprocess.TimeoutExpired:  # flwr run may stream on: the run is lost either way
        os.killpg(run.pid, signal.SIGKILL)
    assert dep.marked(program="flwr-serverapp") == []
    assert not out.exists() or list(out.iterdir()) == []  # no report, nothing partial
    # the nodes finish what they had received; then a new ServerApp resumes from their states
    killed = dep.settle_clientapps()
    run = dep.start_run(dict(DEFED, out=str(out), federation="crash"))
    dep.finish(run, out / "defed-crash.json")
    rep = _report(out / "defed-crash.json")
    # a ClientApp killed before its round-1 state was written leaves that node at round 0
    assert rep["resumed"] and rep["started_at_round"] in ((0, 1, 2) if killed else (1, 2))
    assert rep["dropped"] == []
    assert rep["clients"] == list(SITES)
    file_defed(nodes, root / "files-crash", 3, "aggregation")
    for n in nodes:  # equal to the federation that was never interrupted
        ok, line = compare.compare_federations(node_fed(nodes, n["name"], "crash"),
                                               root / "files-crash")
        assert ok, line


def test_defed_premap_on_a_local_superlink_equals_the_file_pipeline(tmp_path, one_thread):
    """premap='target' on the real engine: the class statistics, the target's completed
    reference and every node's GMM as exchanges, then the rounds; equal to the file pipeline
    (stats --per-class, target-reference, align --tau 1, fit-gmm, dadil-round)."""
    from test_flower_app import PREMAP, assert_premap_equal, file_premap

    nodes = [{k: v for k, v in n.items() if k != "gmm"} for n in make_sites(tmp_path)]
    out = tmp_path / "flower-defed"
    with Deployment(tmp_path, nodes) as dep:
        dep.run({"method": "defed", "out": str(out), "rounds": 2, "local-steps": 2,
                 "n-components": 6, "clients": 3, "timeout": 120.0,
                 **{k.replace("_", "-"): v for k, v in PREMAP.items()}},
                out / "defed-aggregation.json")
    assert all(p.poll() is not None for p, _ in dep.procs) and dep.marked() == []
    rep = _report(out / "defed-aggregation.json")
    assert [e["label"] for e in rep["exchanges"]][:4] == ["hello", "class stats",
                                                          "target reference", "premap"]
    fed_nodes = file_premap(nodes, tmp_path / "files")
    file_defed(fed_nodes, tmp_path / "files" / "aggregation", 2, "aggregation")
    assert_premap_equal(tmp_path, nodes, rep, tmp_path / "files")

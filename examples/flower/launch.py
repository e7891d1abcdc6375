#!/usr/bin/env python
"""Both methods across N sites on Flower's deployment engine, all on this machine.

Partitions features files into N sites with ``fedalign partition`` (several clients per domain,
Dirichlet label shift), starts a SuperLink and N SuperNodes on 127.0.0.1 (free ports), runs
SLOT-Align and DeFed-GMM-DaDiL through ``flwr run``, runs the same federation through the file
pipeline (fedalign's subcommands, in this process), compares the two
(:mod:`fedalign.flower.compare`: reference to 1e-8, equal accuracies, equal DaDiL states and
atoms) and stops every process it started — at the end, on an error and on Ctrl-C — and checks
that none survives::

    python examples/flower/launch.py -n 10 a.h5 b.h5 c.h5 -o out/ --target b
    python examples/flower/launch.py -n 3                # the quick start's demo data

Sites: with D domains, each domain is split into M = ⌈N / D⌉ clients; the sites are
``DOMAIN.cK``, taken K = 0, 1, … across the domains until there are N (with N < D, the target
and the first N − 1 other domains). The site ``DOMAIN.c0`` holds its domain's test split. The
DeFed target is ``TARGET.c0``: its GMM is fitted without labels and it scores the DeFed
classifier on its domain's test split. With ``--premap`` the DeFed run maps every source onto
the target's completed Gaussian as Flower exchanges (run config ``premap='target'``) and the
file pipeline runs the same recipe with the subcommands (``stats --per-class``,
``target-reference``, ``align --tau 1``, ``fit-gmm``); the comparison adds the reference and
every site's GMM.

Bad input (N < 2, N larger than the rows allow, features of different dimensions, a port in
use, a missing tool): one ``error:`` line, exit 2, nothing started. Exit 0 when both pipelines
agree, 1 when they differ or a run failed (every process stopped), 130/143 on SIGINT/SIGTERM.

Outputs under OUT: ``data/`` (partition, GMMs), ``files/`` (file pipeline; ``files/premap/``
with ``--premap``), ``flower/`` (the ServerApp's ref.npz, slot.json, defed-STRATEGY.json,
defed-STRATEGY.ref.npz with ``--premap``), ``nodes/SITE/`` (each SuperNode's private folder),
``logs/``, ``metrics.json`` (times, bytes, RSS, machine load: read by ``cost_table.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = ("flwr", "flower-superlink", "flower-supernode")


class LaunchError(Exception):
    """Bad input: one ``error:`` line, exit 2."""


# --------------------------------------------------------------------------------------------
# The file pipeline (fedalign's subcommands, in process)
# --------------------------------------------------------------------------------------------


def fedalign(*args) -> None:
    """Run one fedalign subcommand in this process (what the command line does); a failure
    stops the launch with the command's own error line."""
    import typer

    from fedalign.cli import app

    code = typer.main.get_command(app).main([str(a) for a in args], prog_name="fedalign",
                                            standalone_mode=False)
    if code not in (None, 0):
        raise LaunchError(f"fedalign {args[0]} failed (exit {code})")


def quiet(*args) -> None:
    """:func:`fedalign` with its output swallowed; a failure → LaunchError with its error line."""
    import contextlib
    import io

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            fedalign(*args)
    except LaunchError as e:
        lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("error:")]
        raise LaunchError(f"fedalign {args[0]}: {lines[-1][len('error:'):].strip()}" if lines
                          else str(e)) from None


# --------------------------------------------------------------------------------------------
# Input checks and the sites
# --------------------------------------------------------------------------------------------


def check_features(paths: list) -> dict:
    """{domain: (rows, d)} of labeled features files; refuses other dimensions and repeats."""
    from fedalign.errors import FedalignError
    from fedalign.files import read_features

    out, dims = {}, {}
    for p in paths:
        try:
            X, y, _ = read_features(p)
        except FedalignError as e:
            raise LaunchError(str(e)) from None
        dom = Path(p).name.split(".")[0]
        if dom in out:
            raise LaunchError(f"two features files of domain {dom!r} ({dims[dom][0]} and {p})")
        out[dom] = (int((y >= 0).sum()), int(X.shape[1]))
        dims[dom] = (p, int(X.shape[1]))
    d = {v[1] for v in dims.values()}
    if len(d) > 1:
        first = next(iter(dims.values()))
        odd = next(v for v in dims.values() if v[1] != first[1])
        raise LaunchError(f"features of different dimensions: {first[0]} has d={first[1]}, "
                          f"{odd[0]} has d={odd[1]}")
    return out


def plan_sites(domains: list, target: str, n: int) -> tuple[list, int]:
    """(domains to partition, clients per domain M) for N sites."""
    others = [d for d in domains if d != target]
    use = sorted([target] + others[:max(0, n - 1)]) if n < len(domains) else sorted(domains)
    return use, math.ceil(n / len(use))


def pick_sites(clients_dir: Path, domains: list, m: int, n: int) -> list:
    """The N sites: DOMAIN.cK for K = 0, 1, … across the domains (sorted names)."""
    sites = []
    for k in range(m):
        for dom in domains:
            if len(sites) < n and (clients_dir / f"{dom}.c{k}.train.h5").is_file():
                sites.append(f"{dom}.c{k}")
    if len(sites) < n:
        raise LaunchError(f"the partition gave {len(sites)} sites with rows, fewer than N={n}")
    return sorted(sites)


def check_port(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise LaunchError(f"port {port} on 127.0.0.1 is in use ({e.strerror})") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Processes: each in its own session, each marked with a token in its environment
# --------------------------------------------------------------------------------------------


class Processes:
    """The SuperLink and SuperNodes (and the subprocesses Flower starts from them).

    Every process runs in its own session (process group) and carries ``TOKEN`` (and its site in
    ``FEDALIGN_FLOWER_SITE``) in its environment; Flower's own subprocesses (flower-superexec,
    flwr-serverapp, flwr-clientapp) inherit both, so :meth:`stop` finds them even where Flower
    detached them from their parent. A thread samples the resident memory of each kind.
    """

    def __init__(self, logs: Path, env: dict, min_free: int = 0):
        self.logs, self.procs = logs, []
        self.token = f"fedalign-launch-{os.getpid()}-{time.monotonic_ns()}"
        self.env = dict(env, FEDALIGN_FLOWER_TOKEN=self.token)
        self.peak: dict = {}
        self.peak_total: dict = {}
        self.min_free, self.out_of_memory = min_free, False
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def start(self, log: str, args: list, site: str = "") -> subprocess.Popen:
        f = open(self.logs / log, "w")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(self.env, FEDALIGN_FLOWER_SITE=site), start_new_session=True)
        self.procs.append((p, f, site))
        return p

    def marked(self, site: str | None = None) -> list:
        """Process ids carrying the token (and, given ``site``, that site's mark)."""
        tok = f"FEDALIGN_FLOWER_TOKEN={self.token}".encode()
        mark = f"FEDALIGN_FLOWER_SITE={site}".encode() if site is not None else None
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                try:
                    env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if tok in env and (mark is None or mark in env) and _alive(int(d)):
                    out.append(int(d))
        return out

    def _sample(self) -> None:
        """Every 0.5 s: the largest RSS of one process of each kind (``peak``) and the largest
        sum over the processes of a kind and over all of them (``peak_total``; RSS counts the
        pages of shared libraries in every process, ``pss`` shares them out: the memory the
        processes take together)."""
        while not self._stop.wait(0.5):
            total: dict = {}
            for pid in self.marked():
                kind, rss, pss = _kind_and_rss(pid)
                if kind:
                    self.peak[kind] = max(self.peak.get(kind, 0), rss)
                    total[kind] = total.get(kind, 0) + rss
                    total["pss"] = total.get("pss", 0) + pss
            total["all"] = sum(v for k, v in total.items() if k != "pss")
            if _mem_available() < self.min_free:  # stop before the machine runs out
                self.out_of_memory = True
                for p, _, _ in self.procs:
                    _signal_group(p.pid, signal.SIGKILL)
                return
            for k, v in total.items():
                self.peak_total[k] = max(self.peak_total.get(k, 0), v)

    def kill_site(self, site: str, sig=signal.SIGKILL) -> None:
        """Kill one SuperNode and every process of its site (a site lost)."""
        for p, _, s in self.procs:
            if s == site and p.poll() is None:
                _signal_group(p.pid, sig)
        for pid in self.marked(site):
            _signal(pid, sig)

    def stop(self) -> list:
        """TERM every group and marked process, KILL what is left after 15 s; the survivors."""
        self._stop.set()
        for p, _, _ in self.procs:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
        for pid in self.marked():
            _signal(pid, signal.SIGTERM)
        t_end = time.monotonic() + 15
        for p, f, _ in self.procs:
            try:
                p.wait(max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while self.marked() and time.monotonic() < t_end:
            time.sleep(0.2)
        for p, _, _ in self.procs:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGKILL)
        for pid in self.marked():
            _signal(pid, signal.SIGKILL)
        for p, f, _ in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
            f.close()
        time.sleep(0.2)
        return self.marked()


def _mem_available() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _alive(pid: int) -> bool:
    """Running (a zombie that its parent has not reaped yet does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


#: Process kinds by the program named on their command line.
KINDS = ("flower-superlink", "flower-supernode", "flwr-serverapp", "flwr-clientapp",
         "flower-superexec")


def _kind_and_rss(pid: int) -> tuple:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None, 0, 0
    names = [Path(a.decode(errors="replace")).name for a in argv[:3]]
    kind = next((k for k in KINDS if k in names), None)

    def field(text, key):
        return next((int(line.split()[1]) * 1024 for line in text.splitlines()
                     if line.startswith(key)), 0)
    try:
        pss = field(Path(f"/proc/{pid}/smaps_rollup").read_text(), "Pss:")
    except OSError:
        pss = 0
    return kind, field(status, "VmRSS:"), pss


# --------------------------------------------------------------------------------------------
# The launch
# --------------------------------------------------------------------------------------------


def say(text: str, t0: float) -> None:
    print(f"\n== {text} ({time.monotonic() - t0:.0f} s)", flush=True)


def prepare_data(args, out: Path, t0: float) -> tuple[list, str]:
    """The features files (given, or the quick start's demo data rendered and extracted)."""
    if args.features:
        return [Path(p).resolve() for p in args.features], args.target
    feat = out / "data" / "features"
    feat.mkdir(parents=True, exist_ok=True)
    doms = ("blocky", "ink", "neon")
    if not all((feat / f"{c}.h5").is_file() for c in doms):
        say("quick-start demo data: rendering and extracting (once)", t0)
        images = out / "data" / "images"
        if not (images / ".done").is_file():
            quiet("demo-data", images, "--per-domain", 150, "--size", 32)
            (images / ".done").touch()
        for c in doms:
            if not (feat / f"{c}.h5").is_file():
                quiet("extract", images / c, "-o", feat / f"{c}.h5", "--weights", "builtin",
                      "--image-size", 96)
    return [feat / f"{c}.h5" for c in doms], args.target or "ink"


def partition(args, files: list, target: str, out: Path) -> tuple[list, dict]:
    """Partition into N sites; the node configs {site: config}."""
    info = check_features(files)
    doms = sorted(info)
    target = target or doms[0]
    if target not in info:
        raise LaunchError(f"--target {target!r} is none of the domains ({', '.join(doms)})")
    use, m = plan_sites(doms, target, args.n)
    for dom in use:  # the rows a site gets on average: a class's fractions are drawn over
        # all D·M clients, each keeps its share of its own domain's pool (fedalign partition)
        per_site = int(info[dom][0] * (1 - args.test_fraction)) // (m * len(use))
        if per_site < args.min_rows:
            raise LaunchError(f"N={args.n} is more sites than the rows allow: {m} clients of "
                              f"domain {dom} would get {per_site} rows each "
                              f"({info[dom][0]} labeled rows, test fraction "
                              f"{args.test_fraction:g}): fewer than --min-rows={args.min_rows}")
    data = out / "data"
    clients = data / "clients"
    shutil.rmtree(clients, ignore_errors=True)
    shutil.rmtree(data / "gmm", ignore_errors=True)
    (data / "gmm").mkdir(parents=True)
    by_dom = {Path(p).name.split(".")[0]: p for p in files}
    try:
        quiet("partition", *[by_dom[d] for d in use], "-o", clients, "--alpha", args.alpha,
              "--seed", args.seed, "--clients-per-domain", m, "--test-fraction", args.test_fraction,
              "--min-client-size", args.min_rows, "--max-redraws", 1000)
    except LaunchError as e:
        raise LaunchError(f"N={args.n} is more sites than the rows allow: {m} clients per domain "
                          f"of at least --min-rows={args.min_rows} rows each ({e})") from None
    sites = pick_sites(clients, use, m, args.n)
    nodes = {}
    for s in sites:
        dom = s.split(".")[0]
        gmm = data / "gmm" / f"{s}.gmm.npz"
        unl = ["--unlabeled"] if s == f"{target}.c0" else []
        quiet("fit-gmm", clients / f"{s}.train.h5", *unl, "-k", args.gmm_k, "-o", gmm)
        cfg = dict(name=s, dir=str(out / "nodes" / s), train=str(clients / f"{s}.train.h5"),
                   gmm=str(gmm))
        if s.endswith(".c0"):
            cfg["test"] = str(clients / f"{dom}.test.h5")
        if s == f"{target}.c0":
            cfg["dadil-test"] = str(clients / f"{dom}.test.h5")
        nodes[s] = cfg
    return sites, nodes


def target_site(sites: list, nodes: dict) -> str:
    """The DeFed target: the site that holds the DeFed test split."""
    return next(s for s in sites if "dadil-test" in nodes[s])


def file_premap(args, sites: list, nodes: dict, f: Path) -> dict:
    """The ``fedalign`` pipeline's first half through the subcommands (README, "DeFed-GMM-DaDiL
    by hand"), in ``f/premap/``: {site: its GMM}. The sources in site order, as the ServerApp
    forwards their statistics."""
    p = f / "premap"
    p.mkdir(parents=True)
    target = target_site(sites, nodes)
    sources = [s for s in sites if s != target]
    for s in sources:
        quiet("stats", nodes[s]["train"], "--per-class", "-o", p / f"{s}.stats.npz")
    ref = p / f"{target}.ref.npz"
    quiet("target-reference", nodes[target]["train"], *[p / f"{s}.stats.npz" for s in sources],
          "-o", ref)
    gmms = {s: p / f"{s}.gmm.npz" for s in sites}
    quiet("fit-gmm", nodes[target]["train"], "--unlabeled", "-k", args.gmm_k, "-o", gmms[target])
    for s in sources:
        quiet("align", "--tau", 1, nodes[s]["train"], ref, "-o", p / f"{s}.to_target.h5")
        quiet("fit-gmm", p / f"{s}.to_target.h5", "-k", args.gmm_k, "-o", gmms[s])
    return gmms


def file_pipeline(args, sites: list, nodes: dict, f: Path) -> None:
    """SLOT-Align and DeFed-GMM-DaDiL through fedalign's subcommands (the quick start's)."""
    shutil.rmtree(f, ignore_errors=True)
    f.mkdir(parents=True)
    for s in sites:
        quiet("stats", nodes[s]["train"], "-o", f / f"{s}.stats.npz")
    quiet("barycenter", *[f / f"{s}.stats.npz" for s in sites], "-o", f / "ref.npz")
    tests = []
    for s in sites:
        quiet("align", "--tau", args.tau, nodes[s]["train"], f / "ref.npz", "--stats",
              f / f"{s}.stats.npz", "-o", f / f"{s}.train.h5", "--save-map", f / f"{s}.map.npz")
        if "test" in nodes[s]:
            t = f / Path(nodes[s]["test"]).name
            quiet("align", "--tau", args.tau, "--map", f / f"{s}.map.npz", nodes[s]["test"], "-o", t)
            tests.append(t)
    quiet("evaluate", *[a for h in args.heads.split(",") for a in ("-m", h)],
          *[a for p in args.params.split() for a in ("--param", p)], "--seeds", args.seeds,
          "--train", *[f / f"{s}.train.h5" for s in sites], "--test", *tests,
          "--json", f / "slot.json")
    gmms = (file_premap(args, sites, nodes, f) if args.premap
            else {s: nodes[s]["gmm"] for s in sites})
    fed = f / args.strategy
    (fed / "state").mkdir(parents=True)
    (fed / "round_000").mkdir()
    for s in sites:
        quiet("dadil-round", "--init", "--client", s, "--gmm", gmms[s], "--n-components",
              args.n_components, "--state", fed / "state" / f"{s}.state.npz",
              "-o", fed / "round_000" / f"{s}.atoms.npz")
    for t in range(1, args.rounds + 1):
        prev = sorted((fed / f"round_{t - 1:03d}").glob("*.atoms.npz"))
        (fed / f"round_{t:03d}").mkdir()
        for s in sites:
            quiet("dadil-round", "--state", fed / "state" / f"{s}.state.npz", "--client", s,
                  "--strategy", args.strategy, "--local-steps", args.local_steps,
                  "-o", fed / f"round_{t:03d}" / f"{s}.atoms.npz", *prev)
    target = target_site(sites, nodes)
    quiet("dadil-evaluate", "--test", nodes[target]["dadil-test"], "--state",
          f"{args.strategy}={fed / 'state' / f'{target}.state.npz'}", "--seeds", args.seeds,
          "--json", f / f"defed-{args.strategy}.json")


def start_federation(procs: Processes, port: int, sites: list, nodes: dict, home: Path) -> None:
    link = procs.start("superlink.log", [shutil.which("flower-superlink"), "--insecure", "--host",
                                         "127.0.0.1", "--port", str(port),
                                         "--disable-runtime-dependency-installation"])
    wait_port(port, link, procs.logs / "superlink.log")
    for s in sites:
        cfg = " ".join(f"{k}='{v}'" for k, v in nodes[s].items())
        procs.start(f"supernode-{s}.log", [shutil.which("flower-supernode"), "--insecure",
                                           "--superlink", f"127.0.0.1:{port}", "--host",
                                           "127.0.0.1", "--port", str(free_port()),
                                           "--node-config", cfg], site=s)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                      f'address = "127.0.0.1:{port}"\ninsecure = true\n')


def wait_port(port: int, proc, log: Path, seconds: float = 120.0) -> None:
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-800:] if log.is_file() else ""
            raise RuntimeError(f"the SuperLink exited with {proc.returncode}; {log}:\n{tail}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds:g} s")


def flower_run(procs: Processes, name: str, config: dict, report: Path, timeout: float) -> float:
    """One ``flwr run`` of the app; the seconds it took. No report → RuntimeError."""
    over = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={str(v).lower()}"
                    if isinstance(v, bool) else f"{k}={v}" for k, v in config.items())
    t = time.monotonic()
    log = procs.logs / f"flwr-{name}.log"
    p = procs.start(log.name, [shutil.which("flwr"), "run", str(HERE), "local", "--stream",
                               "--run-config", over])
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal_group(p.pid, signal.SIGTERM)
        p.wait(10)
    for line in log.read_text(errors="replace").splitlines():
        if any(w in line for w in ("INFO", "WARNING", "ERROR")) and not any(
                w in line for w in ("Start", "logstream", "installed")):
            print("  " + line.split(":      ", 1)[-1].strip())
    if not report.is_file():
        raise RuntimeError(f"the {name} run wrote no {report.name}; see {log}")
    took = time.monotonic() - t
    print(f"  ({name} run: {took:.0f} s)")
    return took


def compare_all(args, sites: list, nodes: dict, fl: Path, f: Path) -> list:
    from fedalign.flower import compare

    checks = [compare.compare_references(fl / "ref.npz", f / "ref.npz"),
              compare.compare_reports(fl / "slot.json", f / "slot.json"),
              compare.compare_target_reports(fl / f"defed-{args.strategy}.json",
                                             f / f"defed-{args.strategy}.json")]
    if args.premap:
        target = target_site(sites, nodes)
        checks.append(compare.compare_references(fl / f"defed-{args.strategy}.ref.npz",
                                                 f / "premap" / f"{target}.ref.npz"))
        checks += [compare.compare_gmms(Path(nodes[s]["dir"]) / "dadil" / args.strategy / "premap"
                                        / f"{s}.gmm.npz", f / "premap" / f"{s}.gmm.npz")
                   for s in sites]
    checks += [compare.compare_federations(Path(nodes[s]["dir"]) / "dadil" / args.strategy,
                                           f / args.strategy, gmm_hash=not args.premap)
               for s in sites]
    return checks


def metrics(args, sites, fl: Path, procs: Processes, times: dict, loads: dict) -> dict:
    """The run's cost: times per exchange, bytes per site and through the SuperLink, RSS."""
    slot = json.loads((fl / "slot.json").read_text())
    defed = json.loads((fl / f"defed-{args.strategy}.json").read_text())

    def per_site(rep):
        out = {}
        for c, book in rep["communication"]["per_client"].items():
            out[c] = {k: sum(e[k] for e in book.values()) for k in ("sent", "received")}
        return out

    return dict(n=len(sites), sites=sites, rounds=args.rounds, heads=args.heads, seeds=args.seeds,
                d=slot["communication"].get("fedavg_linear_head", {}).get("shape", [None, None])[1],
                slot=dict(exchanges=slot.get("exchanges", []), timing_s=slot["timing_s"],
                          bytes_per_site=per_site(slot)),
                defed=dict(exchanges=defed.get("exchanges", []), timing_s=defed["timing_s"],
                           bytes_per_site=per_site(defed)),
                wall_s=times, peak_rss_bytes=dict(procs.peak),
                peak_rss_total_bytes=dict(procs.peak_total), load_average=loads,
                cpus=os.cpu_count())


def launch(args) -> int:
    t0 = time.monotonic()
    if args.n < 2:
        raise LaunchError(f"N must be ≥ 2 (a federation of one site is no federation), got {args.n}")
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        raise LaunchError(f"{', '.join(missing)} not found on PATH: pip install -e '.[flower]'")
    if args.port:
        check_port(args.port)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    files, target = prepare_data(args, out, t0)
    say(f"partition: {args.n} sites (α={args.alpha})", t0)
    sites, nodes = partition(args, files, target, out)
    print("  sites: " + ", ".join(sites))
    loads = {"start": os.getloadavg()}

    say("file pipeline", t0)
    t = time.monotonic()
    f, fl = out / "files", out / "flower"
    file_pipeline(args, sites, nodes, f)
    times = {"file_pipeline": time.monotonic() - t}

    for d in (fl, out / "nodes", out / "logs", out / "flwr-home"):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    path = os.pathsep.join([str(Path(shutil.which("flwr")).parent), os.environ.get("PATH", "")])
    env = dict(os.environ, FLWR_HOME=str(out / "flwr-home"), PATH=path,
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    procs = Processes(out / "logs", env, int(args.min_free_gib * 2 ** 30))
    status = 1
    try:
        say(f"Flower: a SuperLink and {len(sites)} SuperNodes on 127.0.0.1", t0)
        t = time.monotonic()
        port = args.port or free_port()
        check_port(port)  # again: the data and the file pipeline took a while
        start_federation(procs, port, sites, nodes, out / "flwr-home")
        common = dict(out=str(fl), clients=len(sites), timeout=args.timeout, wait=args.timeout)
        say(f"Flower run 1: SLOT-Align ({args.heads}, seeds {args.seeds})", t0)
        times["slot_run"] = flower_run(procs, "slot", dict(common, method="slot", heads=args.heads,
                                                           seeds=args.seeds, params=args.params,
                                                           tau=args.tau),
                                       fl / "slot.json", args.run_timeout)
        say(f"Flower run 2: DeFed-GMM-DaDiL ({args.strategy}, {args.rounds} rounds"
            + (", premap onto the target)" if args.premap else ")"), t0)
        premap = (dict(premap="target", target=target_site(sites, nodes),
                       **{"gmm-k": args.gmm_k}) if args.premap else {})
        times["defed_run"] = flower_run(
            procs, "defed", dict(common, method="defed", strategy=args.strategy, rounds=args.rounds,
                                 **{"local-steps": args.local_steps,
                                    "n-components": args.n_components, "eval-seeds": args.seeds,
                                    "fresh": True}, **premap),
            fl / f"defed-{args.strategy}.json", args.run_timeout)
        times["flower_total"] = time.monotonic() - t
        loads["end"] = os.getloadavg()
        say("comparison with the file pipeline", t0)
        checks = compare_all(args, sites, nodes, fl, f)
        for ok, line in checks:
            print(("equal   " if ok else "DIFFER  ") + line)
        (out / "metrics.json").write_text(json.dumps(
            metrics(args, sites, fl, procs, times, loads), indent=1) + "\n")
        status = 0 if all(ok for ok, _ in checks) else 1
    except RuntimeError:
        if procs.out_of_memory:
            raise RuntimeError(f"stopped: less than {args.min_free_gib:g} GiB of memory left "
                               f"with {len(sites)} sites (peak RSS of all processes "
                               f"{procs.peak_total.get('all', 0) / 2 ** 30:.1f} GiB)") from None
        raise
    finally:
        survivors = procs.stop()
        print(f"launch: stopped the SuperLink and {len(sites)} SuperNodes", flush=True)
        if survivors:
            print(f"error: processes {survivors} survived the stop", file=sys.stderr)
            status = 1
    print(f"launch: {time.monotonic() - t0:.0f} s in all; "
          + ("the Flower runs equal the file pipeline" if status == 0 else
             "the Flower runs DIFFER from the file pipeline"))
    return status


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="examples/flower/launch.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0],
        epilog="example: python examples/flower/launch.py -n 10 a.h5 b.h5 c.h5 -o out --target b")
    ap.add_argument("features", nargs="*", help="labeled features files, one per domain "
                    "(default: the quick start's demo data, rendered and extracted once)")
    ap.add_argument("-n", type=int, required=True, help="number of sites N (≥ 2)")
    ap.add_argument("-o", "--out", default=str(HERE / "out"), help="output folder")
    ap.add_argument("--target", default="", help="DeFed target domain (default: the first)")
    ap.add_argument("--port", type=int, default=0, help="SuperLink port (default: a free one)")
    ap.add_argument("--alpha", default="0.5", help="Dirichlet α of the label shift")
    ap.add_argument("--seed", type=int, default=0, help="partition seed")
    ap.add_argument("--test-fraction", type=float, default=0.3,
                    help="stratified test split per domain (fedalign partition's)")
    ap.add_argument("--min-rows", type=int, default=10, help="fewest rows a site may get")
    ap.add_argument("--gmm-k", type=int, default=2, help="GMM components per class")
    ap.add_argument("--tau", type=float, default=None, help="geodesic time (default: fedalign's)")
    ap.add_argument("--heads", default="fedcgs,fedpft,fed3r,ofedavg")
    ap.add_argument("--params", default="ofedavg.epochs=10 fedpft.epochs=10")
    ap.add_argument("--seeds", default="0-2")
    ap.add_argument("--strategy", default="aggregation")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--n-components", type=int, default=20)
    ap.add_argument("--premap", action="store_true",
                    help="DeFed: map every source onto the target's completed Gaussian as "
                    "Flower exchanges (premap='target'), the file pipeline with stats "
                    "--per-class, target-reference, align --tau 1, fit-gmm")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per exchange before a site counts as dropped")
    ap.add_argument("--run-timeout", type=float, default=3600.0, help="seconds per flwr run")
    ap.add_argument("--min-free-gib", type=float, default=2.0,
                    help="stop every process when the machine has less memory available")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    heads = set(args.heads.split(","))  # the quick start's options of the heads that run
    args.params = " ".join(p for p in args.params.split() if p.split(".")[0] in heads)
    if args.tau is None:
        from fedalign.defaults import TAU

        args.tau = TAU
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the same threads in both pipelines

    def stop(signum, _frame):
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(143)

    signal.signal(signal.SIGTERM, stop)
    # SIGINT too: a launcher started in the background of a script inherits SIGINT ignored
    # (POSIX, no job control), and Ctrl-C / kill -INT must still stop every process
    signal.signal(signal.SIGINT, stop)
    try:
        return launch(args)
    except LaunchError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("launch: interrupted; every process stopped", file=sys.stderr)
        return 130
    except RuntimeError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

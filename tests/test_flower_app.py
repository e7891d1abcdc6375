"""The Flower app's message handlers and ServerApp logic, without a network.

The ServerApp's own ``run`` drives the real ClientApp through an in-process grid
(:class:`fedalign.flower.loopback.LoopbackGrid`): real Flower messages and records, no
SuperLink. Results are compared with the file pipeline (the CLI, in process) on the same
files and seeds. Skipped where Flower is not installed (``pip install -e '.[flower]'``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from typer.testing import CliRunner  # noqa: E402

from fedalign.cli import app as cli_app  # noqa: E402
from fedalign.errors import FedalignError  # noqa: E402
from fedalign.files import write_features  # noqa: E402
from fedalign.flower import compare, handlers  # noqa: E402
from fedalign.flower import messages as m  # noqa: E402
from fedalign.flower.loopback import LoopbackGrid  # noqa: E402
from fedalign.flower.messages import Payload  # noqa: E402
from fedalign.flower.server_app import Settings, fedavg_bytes, run  # noqa: E402
from fedalign.gmm import fit_gmm, save_gmm  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

runner = CliRunner()
SITES = ("blocky", "ink", "neon")  # sorted: the order the server gives the clients
TARGET = "ink"
D, C = 6, 3


def cli(*args):
    r = runner.invoke(cli_app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def make_sites(root):
    """Three domains (one client each): train/test features, a GMM per site (the target's
    unlabeled), and the node configs."""
    rng = np.random.default_rng(0)
    names = ["a", "b", "c"]
    nodes = []
    for i, dom in enumerate(SITES):
        shift, scale = rng.normal(size=D) * 2, 1 + 0.5 * i
        mus = rng.normal(size=(C, D)) * 3

        def draw(n):
            y = rng.integers(0, C, n)
            return ((mus[y] + rng.normal(size=(n, D))) * scale + shift).astype(np.float32), y

        (Xtr, ytr), (Xte, yte) = draw(70 + 10 * i), draw(30)
        tr, te = root / f"{dom}.c0.train.h5", root / f"{dom}.test.h5"
        write_features(tr, Xtr, ytr, [f"{dom}{j}" for j in range(len(ytr))], names,
                       dict(domain=dom, client=f"{dom}.c0"))
        write_features(te, Xte, yte, [f"{dom}t{j}" for j in range(len(yte))], names,
                       dict(domain=dom))
        g = fit_gmm(Xtr, None if dom == TARGET else ytr, 2, C, seed=0, class_names=names)
        gp = root / f"{dom}.gmm.npz"
        save_gmm(gp, g, dict(producer="tests"))
        cfg = dict(name=dom, dir=str(root / "nodes" / dom), train=str(tr), test=str(te), gmm=str(gp))
        if dom == TARGET:
            cfg["dadil-test"] = str(te)
        nodes.append(cfg)
    return nodes


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("sites")
    return root, make_sites(root)


@pytest.fixture
def fresh_sites(tmp_path):
    return tmp_path, make_sites(tmp_path)


def file_slot(root, nodes, out, heads, seeds, params=()):
    """SLOT-Align through the file pipeline (the CLI), as the quick start's Makefile runs it."""
    out.mkdir(parents=True, exist_ok=True)
    for n in nodes:
        cli("stats", n["train"], "-o", out / f"{n['name']}.stats.npz")
    cli("barycenter", *[out / f"{n['name']}.stats.npz" for n in nodes], "-o", out / "ref.npz")
    for n in nodes:
        c = n["name"]
        cli("align", "--tau", 0.4, n["train"], out / "ref.npz", "--stats", out / f"{c}.stats.npz",
            "-o", out / f"{c}.c0.train.h5", "--save-map", out / f"{c}.map.npz")
        cli("align", "--tau", 0.4, "--map", out / f"{c}.map.npz", n["test"], "-o", out / f"{c}.test.h5")
    args = [a for h in heads for a in ("-m", h)] + [a for p in params for a in ("--param", p)]
    cli("evaluate", *args, "--seeds", seeds, "--train", *[out / f"{n['name']}.c0.train.h5" for n in nodes],
        "--test", *[out / f"{n['name']}.test.h5" for n in nodes], "--json", out / "slot.json")


def file_defed(nodes, fed, rounds, strategy, steps=2, K=6, skip=None):
    """DeFed-GMM-DaDiL through ``fedalign dadil-round`` (one federation folder).

    ``skip``: {round t: client} — that client's round-t atoms file is removed after the
    round and the client takes no further part (a dropped node)."""
    from fedalign.dadil import federation_paths

    gone = set()
    for n in nodes:
        sp, ap = federation_paths(fed, n["name"], 0)
        sp.parent.mkdir(parents=True, exist_ok=True)
        ap.parent.mkdir(parents=True, exist_ok=True)
        cli("dadil-round", "--init", "--client", n["name"], "--gmm", n["gmm"], "--state", sp,
            "-o", ap, "--n-components", K)
    for t in range(1, rounds + 1):
        (fed / f"round_{t:03d}").mkdir()
        prev = sorted((fed / f"round_{t - 1:03d}").glob("*.atoms.npz"))
        for n in nodes:
            if n["name"] in gone:
                continue
            sp, ap = federation_paths(fed, n["name"], t)
            cli("dadil-round", "--state", sp, "--strategy", strategy, "--local-steps", steps,
                "--client", n["name"], "-o", ap, *prev)
        if skip and t in skip:
            gone.add(skip[t])
            federation_paths(fed, skip[t], t)[1].unlink()


def defed_lost_files(nodes, fed: Path, lost: str, k: int, t: int, rounds: int, rejoin: int):
    """The file pipeline of a client lost in round t (its state has k ∈ {t−1, t} rounds: a
    round-t it did but never delivered is hidden from the others) that later catches up —
    late ``dadil-round`` runs on the round folders — and a federation that goes on to round
    ``rejoin`` with it."""
    from fedalign.dadil import federation_paths

    def one(n, r):
        sp, ap = federation_paths(fed, n["name"], r)
        ap.parent.mkdir(parents=True, exist_ok=True)
        cli("dadil-round", "--state", sp, "--strategy", "aggregation", "--local-steps", 2,
            "--client", n["name"], "-o", ap, *sorted((fed / f"round_{r - 1:03d}").glob("*.atoms.npz")))

    file_defed(nodes, fed, 0, "aggregation")
    x = next(n for n in nodes if n["name"] == lost)
    hidden = None
    for r in range(1, rounds + 1):
        for n in nodes:
            if n is not x or r <= k:
                one(n, r)
        if r == k == t:  # the round the lost node did but never delivered
            ap = federation_paths(fed, lost, r)[1]
            hidden = ap.with_suffix(".hidden")
            ap.rename(hidden)
    if hidden is not None:
        hidden.rename(hidden.with_suffix(".npz"))
    for r in range(k + 1, rejoin + 1):  # it catches up, then everyone goes on
        for n in ([x] if r <= rounds else nodes):
            one(n, r)


def node_fed(nodes, name, fed):
    return next(handlers.Node.from_config(n) for n in nodes if n["name"] == name).dir / "dadil" / fed


# --------------------------------------------------------------------------------------------
# Payloads and records
# --------------------------------------------------------------------------------------------


def test_payload_round_trip_is_exact_and_counted():
    rng = np.random.default_rng(1)
    p = Payload({"stats": {"mean": rng.normal(size=5), "covariance": rng.normal(size=(5, 5))},
                 "msg/fedpft/s0/r0": {"means": rng.normal(size=(3, 2)).astype(np.float16),
                                      "counts": np.arange(3), "n": np.int64(7)}},
                dict(client="ink", names=["a", "b"], nested={"x": [1, 2.5]}))
    rd = m.to_recorddict(p)
    q = m.from_recorddict(rd)
    assert q.config == p.config
    for g, arrays in p.arrays.items():
        for k, a in arrays.items():
            b = q.arrays[g][k]
            assert b.dtype == np.asarray(a).dtype and b.shape == np.asarray(a).shape
            assert np.array_equal(b, a)
    raw = sum(np.asarray(a).nbytes for g in p.arrays.values() for a in g.values())
    assert m.payload_bytes(rd) == sum(r.count_bytes() for r in rd.values())
    assert raw < m.payload_bytes(rd) < raw + 2000  # .npy headers and keys only


def test_check_arrays_names_the_node_and_the_problem():
    good = {"mean": np.zeros(3), "covariance": np.eye(3)}
    spec = {"mean": (3,), "covariance": (3, 3)}
    assert set(m.check_arrays("ink (node 7)", "stats", good, spec)) == set(spec)
    with pytest.raises(m.NodeReplyError, match=r"node ink \(node 7\): stats reply: 'covariance' has "
                                               r"shape \(2, 2\), expected \(3, 3\)"):
        m.check_arrays("ink (node 7)", "stats", dict(good, covariance=np.eye(2)), spec)
    with pytest.raises(m.NodeReplyError, match="'mean' has 1 NaN/Inf value$"):
        m.check_arrays("ink (node 7)", "stats", dict(good, mean=np.array([0, np.nan, 0])), spec)
    with pytest.raises(m.NodeReplyError, match="has no 'mean'"):
        m.check_arrays("ink", "stats", {"covariance": np.eye(3)}, spec)


def test_settings_from_run_config():
    s = Settings.from_run_config({"method": "defed", "out": "/tmp/x", "min-clients": "3",
                                  "local-steps": 2, "fresh": "true"})
    assert (s.method, s.min_clients, s.local_steps, s.fresh) == ("defed", 3, 2, True)
    with pytest.raises(FedalignError, match="unknown run config key 'bogus'"):
        Settings.from_run_config({"out": "/x", "bogus": 1})
    with pytest.raises(FedalignError, match="out='FOLDER'"):
        Settings.from_run_config({})
    with pytest.raises(FedalignError, match="method must be slot or defed"):
        Settings.from_run_config({"out": "/x", "method": "fedavg"})


def test_run_config_booleans_and_tau_follow_the_command_line():
    from fedalign.defaults import TAU
    from fedalign.grammar import BOOL_WORDS

    for word, value in BOOL_WORDS.items():
        assert Settings.from_run_config({"out": "/x", "fresh": word.upper()}).fresh is value
    assert Settings.from_run_config({"out": "/x", "fresh": True}).fresh is True
    for bad in ("ture", "", "2", "maybe"):  # an unknown word is an error, never False
        with pytest.raises(FedalignError, match="run config fresh: expected true or false"):
            Settings.from_run_config({"out": "/x", "fresh": bad})
    assert Settings(out="/x").tau == TAU


def test_run_config_defaults_and_shrinkage_follow_the_command_line():
    from fedalign import defaults
    from fedalign.grammar import parse_shrinkage

    s = Settings(out="/x")
    assert (s.tau, s.n_atoms, s.local_steps) == (defaults.TAU, defaults.N_ATOMS,
                                                 defaults.LOCAL_STEPS) == (0.4, 3, 5)
    # fedalign stats --shrinkage's words: a word travels as the word, a number as its text
    for text, sent in (("auto", "auto"), ("AUTO", "auto"), ("None", "none"), ("0.5", "0.5"),
                       (0.25, "0.25"), ("1", "1")):
        got = Settings.from_run_config({"out": "/x", "shrinkage": text}).shrinkage
        assert got == sent and parse_shrinkage(got) == parse_shrinkage(text)
    for bad in ("lw", "1.5", "-0.1", ""):
        with pytest.raises(FedalignError, match="run config shrinkage must be"):
            Settings.from_run_config({"out": "/x", "shrinkage": bad})
    with pytest.raises(FedalignError, match="run config min-clients: cannot read 'two' as int"):
        Settings.from_run_config({"out": "/x", "min-clients": "two"})


def test_project_config_lists_every_setting():
    import dataclasses
    import tomllib
    from pathlib import Path

    pp = Path(__file__).resolve().parents[1] / "examples" / "flower" / "pyproject.toml"
    cfg = tomllib.loads(pp.read_text())["tool"]["flwr"]
    assert cfg["app"]["components"] == {"serverapp": "fedalign.flower.server_app:app",
                                        "clientapp": "fedalign.flower.client_app:app"}
    keys = {k.replace("-", "_") for k in cfg["app"]["config"]}
    assert keys == {f.name for f in dataclasses.fields(Settings)}
    s = Settings.from_run_config(dict(cfg["app"]["config"], out="/x"))
    assert s == Settings(out="/x")


def test_run_config_reads_seeds_and_params_with_the_command_line_grammar():
    from fedalign.grammar import parse_params, parse_seeds

    assert Settings.seed_list("0-2, 5") == parse_seeds(["0-2,5"]) == [0, 1, 2, 5]
    assert Settings.seed_list("3 1") == [1, 3]
    with pytest.raises(FedalignError, match="run config eval-seeds: expected integers"):
        Settings.seed_list("0-x", "eval-seeds")
    s = Settings(out="/x", params="fedcgs.ridge=0.1 fed3r.lam=0.5")
    assert s.head_params(["fedcgs", "fed3r"]) == parse_params(["fedcgs.ridge=0.1", "fed3r.lam=0.5"])
    with pytest.raises(FedalignError, match="run config params must look like METHOD.KEY=VALUE"):
        Settings(out="/x", params="fedcgs.ridge").head_params(["fedcgs"])


# --------------------------------------------------------------------------------------------
# Handlers on one node
# --------------------------------------------------------------------------------------------


def test_stats_handler_sends_aggregates_only(sites):
    from fedalign.stats import compute_stats

    _, nodes = sites
    node = handlers.Node.from_config(nodes[0])
    r = handlers.stats(Payload({}, {}), node)
    st = compute_stats(nodes[0]["train"])
    assert set(r.arrays) == {"stats"} and set(r.arrays["stats"]) == {"mean", "covariance"}
    assert np.array_equal(r.arrays["stats"]["mean"], st.mean)
    assert np.array_equal(r.arrays["stats"]["covariance"], st.covariance)
    assert r.config["n"] == st.n and r.config["d"] == D and r.config["class_names"] == ["a", "b", "c"]


def test_node_config_errors_are_one_line():
    with pytest.raises(FedalignError, match="no name="):
        handlers.Node.from_config({"dir": "/x"})
    with pytest.raises(FedalignError, match="node ink: the node config has no dir="):
        handlers.Node.from_config({"name": "ink"})
    with pytest.raises(FedalignError, match="node ink: this run needs train="):
        handlers.stats(Payload(), handlers.Node.from_config({"name": "ink", "dir": "/tmp/x"}))
    with pytest.raises(FedalignError, match="invalid client id"):
        handlers.Node.from_config({"name": "a b", "dir": "/x"})


def test_client_app_answers_bad_input_with_an_error_record(tmp_path):
    from flwr.app import Context, Message, RecordDict

    from fedalign.flower.client_app import app

    LoopbackGrid([])  # sets the task identity messages are built from
    ctx = Context(1, 5, {"name": "ink", "dir": str(tmp_path), "train": str(tmp_path / "no.h5")},
                  RecordDict(), {})
    msg = Message(m.to_recorddict(Payload()), dst_node_id=5, message_type=m.STATS)
    reply = app(msg, ctx)
    p = m.from_recorddict(reply.content)
    assert p.config["client"] == "ink" and "no.h5" in p.config["error"]
    assert "\n" not in p.config["error"]


# --------------------------------------------------------------------------------------------
# SLOT-Align: equal to the file pipeline
# --------------------------------------------------------------------------------------------


HEADS = ("fedcgs", "fed3r")


def test_slot_equals_the_file_pipeline(sites):
    root, nodes = sites
    out = root / "flower-slot"
    grid = LoopbackGrid(nodes)
    rep = run(grid, dict(method="slot", out=str(out), heads=",".join(HEADS), seeds="0-1"), say=lambda *_: None)
    file_slot(root, nodes, root / "files-slot", HEADS, "0-1")
    ok, line = compare.compare_references(out / "ref.npz", root / "files-slot" / "ref.npz")
    assert ok, line
    ok, line = compare.compare_reports(out / "slot.json", root / "files-slot" / "slot.json")
    assert ok, line
    # the nodes' aligned files are the file pipeline's, number for number
    from fedalign.files import read_features

    for n in nodes:
        node = handlers.Node.from_config(n)
        for what, twin in (("train", f"{n['name']}.c0.train.h5"), ("test", f"{n['name']}.test.h5")):
            X1, y1, _ = read_features(node.slot_path(what))
            X2, y2, _ = read_features(root / "files-slot" / twin)
            assert np.array_equal(X1, X2) and np.array_equal(y1, y2)
    # three exchanges; bytes per client: the stats message is n, mean, covariance (+ keys)
    assert [t for _, t, _, _ in grid.log[::3]] == [m.STATS, m.HEADS, m.EVALUATE]
    comm = rep["communication"]["per_client"]["ink"]
    assert 8 * (D + D * D) < comm["slot-align"]["received"] < 8 * (D + D * D) + 1000
    assert comm["slot-align"]["sent"] > 8 * (D + D * D)  # the reference, broadcast
    assert {"fedcgs", "fed3r"} <= set(comm)
    fa = rep["communication"]["fedavg_linear_head"]
    assert fa["per_round"] == fedavg_bytes(C, D) and fa["per_round"]["sent"] > 4 * C * (D + 1)
    assert rep["warnings"] == [] and rep["domains"] == list(SITES)


def test_slot_dp_run_reports_the_privacy_accounting_of_the_file_pipeline(sites):
    root, nodes = sites
    out = root / "flower-dp"
    params = [f"{h}.{k}={v}" for h in ("fedcgs", "fed3r")
              for k, v in (("dp_epsilon", "1"), ("dp_delta", "1e-5"), ("clip", "12"))]
    said = []
    rep = run(LoopbackGrid(nodes), dict(method="slot", out=str(out), heads="fedcgs,fed3r",
                                        seeds="0-1", params=" ".join(params)), say=said.append)
    file_slot(root, nodes, root / "files-dp", ("fedcgs", "fed3r"), "0-1", params)
    ok, line = compare.compare_reports(out / "slot.json", root / "files-dp" / "slot.json")
    assert ok, line
    files = json.loads((root / "files-dp" / "slot.json").read_text())
    for h in ("fedcgs", "fed3r"):
        mine, theirs = rep["methods"][h]["privacy"], files["methods"][h]["privacy"]
        assert [e["client"] for e in mine] == list(SITES) and len(theirs) == len(SITES)
        for a, b in zip(mine, theirs):  # the same record, but for the client's name
            assert {k: v for k, v in a.items() if k != "client"} == \
                   {k: v for k, v in b.items() if k != "client"}
        assert mine[0]["total"] == theirs[0]["total"] and mine[0]["head"] != "exact"
        assert any(ln.startswith(f"{h}: privacy") for ln in said)
    # without DP messages, no privacy record (as fedalign evaluate)
    rep = run(LoopbackGrid(nodes), dict(method="slot", out=str(root / "flower-nodp"),
                                        heads="fedcgs", seeds="0"), say=lambda *_: None)
    assert "privacy" not in rep["methods"]["fedcgs"]


@pytest.mark.slow
def test_slot_all_heads_equal_the_file_pipeline(sites):
    root, nodes = sites
    heads = ("fedcgs", "fedpft", "fed3r", "ofedavg")
    params = ("ofedavg.epochs=2", "ofedavg.min_steps=5", "fedpft.epochs=2")
    out = root / "flower-all"
    run(LoopbackGrid(nodes), dict(method="slot", out=str(out), heads=",".join(heads), seeds="0-1",
                                  params=" ".join(params)), say=lambda *_: None)
    file_slot(root, nodes, root / "files-all", heads, "0-1", params)
    for ok, line in (compare.compare_references(out / "ref.npz", root / "files-all" / "ref.npz"),
                     compare.compare_reports(out / "slot.json", root / "files-all" / "slot.json")):
        assert ok, line


def test_slot_refuses_the_centralized_head(sites):
    root, nodes = sites
    with pytest.raises(FedalignError, match="centralized is not available across sites"):
        run(LoopbackGrid(nodes), dict(method="slot", out=str(root / "x"), heads="centralized"))


def test_slot_node_that_drops_out_is_skipped_with_a_warning(fresh_sites):
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)
    neon = 1003
    grid.tamper = lambda nid, mtype, reply: None if (nid == neon and mtype == m.HEADS) else reply
    said = []
    rep = run(grid, dict(method="slot", out=str(root / "o"), heads="fedcgs", timeout=0.5),
              say=said.append)
    assert rep["domains"] == ["blocky", "ink"]
    assert any("node neon (node 1003): no reply to train.heads" in w and "dropped" in w
               for w in rep["warnings"])
    assert any(x.startswith("WARNING: node neon") for x in said)
    with pytest.raises(FedalignError, match="fewer than min-clients=3.*node neon"):
        run(grid, dict(method="slot", out=str(root / "o2"), heads="fedcgs", timeout=0.5,
                       **{"min-clients": 3}), say=lambda *_: None)


def test_slot_report_counts_each_clients_own_rows_after_a_drop(fresh_sites):
    """blocky, the first client, is lost in the heads round: the others keep their own n."""
    from fedalign.stats import compute_stats

    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)
    grid.tamper = lambda nid, mtype, reply: None if (nid == 1001 and mtype == m.HEADS) else reply
    rep = run(grid, dict(method="slot", out=str(root / "o"), heads="fedcgs", timeout=0.5),
              say=lambda *_: None)
    n = {c["name"]: compute_stats(c["train"]).n for c in nodes}
    assert [(c["name"], c["n"]) for c in rep["clients"]] == [("ink", n["ink"]), ("neon", n["neon"])]
    assert n["ink"] != n["blocky"]


def edit_reply(node: int, mtype: str, edit):
    """A loopback ``tamper`` that applies ``edit`` to the arrays of ``node``'s ``mtype`` reply."""
    def tamper(nid, mt, reply):
        if nid == node and mt == mtype:
            p = m.from_recorddict(reply.content)
            edit(p.arrays)
            reply.content = m.to_recorddict(p)
        return reply
    return tamper


@pytest.mark.parametrize("bad, message", [
    (lambda a: a["stats"].update(mean=np.full_like(a["stats"]["mean"], np.nan)),
     "stats reply: 'mean' has 6 NaN/Inf values"),
    (lambda a: a["stats"].update(covariance=np.eye(4)),
     r"stats reply: 'covariance' has shape \(4, 4\), expected \(6, 6\)"),
    (lambda a: a["stats"].update(covariance=-np.eye(D)), "stats reply: .*covariance"),
])
def test_slot_bad_reply_is_rejected_naming_the_node(sites, bad, message):
    root, nodes = sites
    grid = LoopbackGrid(nodes)
    grid.tamper = edit_reply(1001, m.STATS, bad)
    with pytest.raises(FedalignError, match=f"node blocky \\(node 1001\\): {message}"):
        run(grid, dict(method="slot", out=str(root / "bad"), heads="fedcgs", **{"min-clients": 3}),
            say=lambda *_: None)
    rep = run(grid, dict(method="slot", out=str(root / "bad2"), heads="fedcgs"), say=lambda *_: None)
    assert rep["domains"] == ["ink", "neon"] and len(rep["warnings"]) == 1


def test_slot_head_message_with_nan_is_rejected(sites):
    root, nodes = sites
    grid = LoopbackGrid(nodes)

    def tamper(nid, mtype, reply):
        if nid == 1003 and mtype == m.HEADS:
            p = m.from_recorddict(reply.content)
            p.arrays["msg/fed3r/s0/r0"]["G"][0, 0] = np.inf
            reply.content = m.to_recorddict(p)
        return reply

    grid.tamper = tamper
    with pytest.raises(FedalignError, match=r"node neon \(node 1003\): fed3r \(seed 0\) reply: 'G' "
                                            r"has 1 NaN/Inf value"):
        run(grid, dict(method="slot", out=str(root / "nan"), heads="fed3r", **{"min-clients": 3}),
            say=lambda *_: None)


# --------------------------------------------------------------------------------------------
# DeFed-GMM-DaDiL: relayed gossip equal to the file pipeline
# --------------------------------------------------------------------------------------------


def defed(grid, root, **kw):
    cfg = dict(method="defed", out=str(root / "flower-defed"), rounds=2, local_steps=2,
               n_components=6)
    cfg.update(kw)
    return run(grid, {k.replace("_", "-"): v for k, v in cfg.items()}, say=lambda *_: None)


@pytest.mark.parametrize("strategy", ["replacement", "aggregation"])
def test_defed_equals_the_file_pipeline(fresh_sites, strategy):
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)
    rep = defed(grid, root, strategy=strategy, rounds=3)
    file_defed(nodes, root / "files" / strategy, 3, strategy)
    for n in nodes:
        ok, line = compare.compare_federations(node_fed(nodes, n["name"], strategy),
                                               root / "files" / strategy)
        assert ok, line
        assert "(5 of 5 byte for byte)" in line  # its state and its atoms of rounds 0-3
    # the server forwarded to each client only the atoms of the peers it named
    for nid, mtype, msg, reply in grid.log:
        if mtype == m.DADIL_ROUND:
            p = m.from_recorddict(msg.content)
            sent = sorted(k[len("peer/"):] for k in p.arrays)
            assert sent == sorted(m.from_recorddict(reply.content).config["peers"])
            assert len(sent) == {"replacement": 1, "aggregation": 2}[strategy]
            assert all(set(a) == {"means", "variances", "label_logits"} for a in p.arrays.values())
    # the target's evaluation equals dadil-evaluate on the file pipeline's state
    r = cli("dadil-evaluate", "--test", nodes[1]["dadil-test"], "--state",
            f"{strategy}={root / 'files' / strategy / 'state' / 'ink.state.npz'}",
            "--json", root / "files" / "ev.json")
    assert r.exit_code == 0
    ev = json.loads((root / "files" / "ev.json").read_text())
    assert rep["summary"] == ev["summary"] and rep["targets"]["ink"]["accuracy"] == ev["accuracy"]
    assert "defed" in rep["communication"]["per_client"]["ink"]


def test_defed_resumes_after_a_server_restart(fresh_sites):
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)
    rep1 = defed(grid, root, rounds=1)
    rep2 = defed(grid, root, rounds=3)  # a new ServerApp: it knows nothing but the nodes
    assert not rep1["resumed"] and rep2["resumed"] and rep2["started_at_round"] == 1
    file_defed(nodes, root / "files" / "aggregation", 3, "aggregation")
    for n in nodes:
        ok, line = compare.compare_federations(node_fed(nodes, n["name"], "aggregation"),
                                               root / "files" / "aggregation")
        assert ok, line
    rep3 = defed(grid, root, rounds=3)  # nothing left to do: the target evaluates only
    assert rep3["started_at_round"] == 3 and rep3["summary"] == rep2["summary"]


def test_defed_resumes_a_round_interrupted_half_way(fresh_sites):
    """Server stops after some clients finished round 2: the others catch up."""
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)
    defed(grid, root, rounds=1)
    # round 2 done by blocky only (as if the server had stopped before the others' replies)
    from fedalign.flower import _lib

    b = handlers.Node.from_config(nodes[0])
    sp, ap = b.dadil_paths("aggregation", 2)
    ap.parent.mkdir(parents=True, exist_ok=True)
    st = _lib.load_state(sp)
    peers = _lib.draw_peers(st, ["blocky", "ink", "neon"], "aggregation")
    fwd = {p: _lib.load_atoms(node_fed(nodes, p, "aggregation") / "round_001" / f"{p}.atoms.npz")
           for p in peers}
    _lib.relay_round(sp, ap, "aggregation", 2, "blocky", nodes[0]["gmm"], ["blocky", "ink", "neon"], fwd)
    defed(grid, root, rounds=3)
    file_defed(nodes, root / "files" / "aggregation", 3, "aggregation")
    for n in nodes:
        ok, line = compare.compare_federations(node_fed(nodes, n["name"], "aggregation"),
                                               root / "files" / "aggregation")
        assert ok, line


def test_defed_missing_peer_is_skipped(fresh_sites):
    """neon's round-2 reply never arrives: the others go on without it, as the file pipeline
    does when a peer's atoms file is missing."""
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)
    calls = {"n": 0}

    def tamper(nid, mtype, reply):
        if nid == 1003 and mtype == m.DADIL_ROUND:
            calls["n"] += 1
            if calls["n"] == 2:
                return None
        return reply

    grid.tamper = tamper
    rep = defed(grid, root, strategy="replacement", rounds=4, timeout=0.5)
    assert rep["clients"] == ["blocky", "ink"]
    assert any("node neon (node 1003): no reply to train.dadil_round" in w for w in rep["warnings"])
    file_defed(nodes, root / "files" / "replacement", 4, "replacement", skip={2: "neon"})
    for c in ("blocky", "ink"):
        ok, line = compare.compare_federations(node_fed(nodes, c, "replacement"),
                                               root / "files" / "replacement")
        assert ok, line


def test_defed_lost_client_comes_back_and_catches_up(fresh_sites):
    """neon's replies stop after round 1 (it did round 2, never delivered); the others go on to
    round 4; back, it runs the rounds it missed from the atoms the others published, as late
    ``dadil-round`` runs on the round folders would; the report names what it missed."""
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)

    def tamper(nid, mtype, reply):
        return None if nid == 1003 and mtype == m.DADIL_ROUND and tamper.rounds > 1 else reply

    def count(nid, mtype, reply):
        tamper.rounds += nid == 1003 and mtype == m.DADIL_ROUND
        return tamper(nid, mtype, reply)

    tamper.rounds = 0
    grid.tamper = count
    rep = defed(grid, root, rounds=4, timeout=0.5)
    labels = [e["label"] for e in rep["exchanges"]]
    assert rep["clients"] == ["blocky", "ink"]
    assert rep["dropped"] == [dict(client="neon", node="1003", lost_at="round 2",
                                   reason=rep["dropped"][0]["reason"],
                                   missed=["round 2", "redraw before round 3", "round 3", "round 4"])]
    assert labels == ["hello", "round 0", "round 1", "round 2", "redraw before round 3",
                      "round 3", "round 4"]
    e = rep["exchanges"][3]
    assert (e["nodes"], e["answered"]) == (3, 2) and e["sent"] > 0 and e["received"] > 0
    rep2 = defed(LoopbackGrid(nodes), root, rounds=5)
    assert rep2["resumed"] and rep2["started_at_round"] == 2 and rep2["clients"] == list(SITES)
    defed_lost_files(nodes, root / "files" / "aggregation", "neon", 2, 2, 4, 5)
    for n in nodes:
        ok, line = compare.compare_federations(node_fed(nodes, n["name"], "aggregation"),
                                               root / "files" / "aggregation")
        assert ok, line


def test_defed_bad_atoms_are_rejected_naming_the_node(fresh_sites):
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)

    def tamper(nid, mtype, reply):
        if nid == 1002 and mtype == m.DADIL_ROUND:
            p = m.from_recorddict(reply.content)
            p.arrays["atoms"]["variances"][0, 0, 0] = np.nan
            reply.content = m.to_recorddict(p)
        return reply

    grid.tamper = tamper
    with pytest.raises(FedalignError, match=r"node ink \(node 1002\): round 1 atoms reply: "
                                            r"'variances' has 1 NaN/Inf value"):
        defed(grid, root, **{"min-clients": 3})


def test_defed_start_without_any_good_node_is_one_clear_error(fresh_sites):
    """Every node's round-0 reply an error: the run stops with the min-clients error naming
    what was dropped, not a TypeError on the atoms shape no reply gave."""
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)

    def tamper(nid, mtype, reply):
        if mtype == m.DADIL_INIT:
            p = m.from_recorddict(reply.content)
            p.config["error"] = "planted: this node's init failed"
            reply.content = m.to_recorddict(p)
        return reply

    grid.tamper = tamper
    with pytest.raises(FedalignError, match=r"DeFed start: 0 client\(s\) left.*planted"):
        defed(grid, root, **{"min-clients": 1})


def test_defed_refuses_states_of_other_federations_mixed(fresh_sites):
    root, nodes = fresh_sites
    defed(LoopbackGrid(nodes[:2]), root, rounds=1)
    with pytest.raises(FedalignError, match="clients neon have no state .* fresh=true"):
        defed(LoopbackGrid(nodes), root, rounds=2)
    rep = defed(LoopbackGrid(nodes), root, rounds=1, fresh=True)
    assert rep["clients"] == list(SITES) and not rep["resumed"]


# --------------------------------------------------------------------------------------------
# DeFed-GMM-DaDiL's first half as exchanges (premap='target'): equal to the file pipeline
# --------------------------------------------------------------------------------------------

PREMAP = dict(premap="target", target=TARGET, gmm_k=2)
SOURCES = tuple(s for s in SITES if s != TARGET)


@pytest.fixture
def premap_sites(tmp_path):
    """The three sites, the target's training rows without class 2 (the completed reference
    puts it back); no node needs ``gmm=``."""
    from fedalign.files import read_features

    nodes = make_sites(tmp_path)
    t = next(n for n in nodes if n["name"] == TARGET)
    X, y, info = read_features(t["train"])
    keep = y != 2
    write_features(t["train"], X[keep], y[keep], [f"t{j}" for j in range(int(keep.sum()))],
                   info["class_names"], dict(domain=TARGET, client=f"{TARGET}.c0"))
    return tmp_path, [{k: v for k, v in n.items() if k != "gmm"} for n in nodes]


def file_premap(nodes, out, in_reference=SOURCES, federation=SITES, k=2):
    """The ``fedalign`` pipeline's first half through the CLI (README, "DeFed-GMM-DaDiL by
    hand"): ``stats --per-class`` of the sources ``in_reference`` (client order),
    ``target-reference``, ``align --tau 1`` and ``fit-gmm`` at each source, ``fit-gmm
    --unlabeled`` at the target. Returns the node configs of ``federation`` with ``gmm=``
    these GMMs (for :func:`file_defed`)."""
    out.mkdir(parents=True, exist_ok=True)
    by = {n["name"]: n for n in nodes}
    for c in in_reference:
        cli("stats", by[c]["train"], "--per-class", "-o", out / f"{c}.stats.npz")
    cli("target-reference", by[TARGET]["train"], *[out / f"{c}.stats.npz" for c in in_reference],
        "-o", out / "t.ref.npz")
    fed = []
    for c in federation:
        gmm = out / f"{c}.gmm.npz"
        if c == TARGET:
            cli("fit-gmm", by[c]["train"], "--unlabeled", "-k", k, "-o", gmm)
        else:
            cli("align", "--tau", 1, by[c]["train"], out / "t.ref.npz", "-o", out / f"{c}.to_t.h5")
            cli("fit-gmm", out / f"{c}.to_t.h5", "-k", k, "-o", gmm)
        fed.append(dict(by[c], gmm=str(gmm)))
    return fed


def premap_gmm(nodes, name, fed="aggregation"):
    return node_fed(nodes, name, fed) / "premap" / f"{name}.gmm.npz"


def assert_premap_equal(root, nodes, rep, files, federation=SITES, fed="aggregation"):
    """The run's reference, GMMs and DeFed files equal the file pipeline's under ``files``."""
    for a in (root / "flower-defed" / f"defed-{fed}.ref.npz",
              node_fed(nodes, TARGET, fed) / "premap" / f"{TARGET}.ref.npz"):
        ok, line = compare.compare_references(a, files / "t.ref.npz")
        assert ok, line
    for c in federation:
        ok, line = compare.compare_gmms(premap_gmm(nodes, c, fed), files / f"{c}.gmm.npz")
        assert ok, line
        ok, line = compare.compare_federations(node_fed(nodes, c, fed), files / fed, gmm_hash=False)
        assert ok, line
    assert sorted(rep["premap"]["gmms"]) == list(federation)


def test_defed_premap_equals_the_file_pipeline(premap_sites):
    from fedalign.files import read_features, read_npz

    root, nodes = premap_sites
    grid = LoopbackGrid(nodes)
    rep = defed(grid, root, **PREMAP)
    fed_nodes = file_premap(nodes, root / "files")
    file_defed(fed_nodes, root / "files" / "aggregation", 2, "aggregation")
    assert_premap_equal(root, nodes, rep, root / "files")
    # the completed reference put back the class the target lacks
    ref_meta = read_npz(root / "files" / "t.ref.npz", "reference")[1]
    assert rep["premap"]["label_shift"] == ref_meta["label_shift"]
    assert rep["premap"]["label_shift"]["absent"] == [2]
    assert rep["premap"]["sources"] == list(SOURCES) and rep["premap"]["target"] == TARGET
    # the sources' mapped rows are the file pipeline's `align --tau 1`, number for number
    for c in SOURCES:
        X1, y1, _ = read_features(node_fed(nodes, c, "aggregation") / "premap" / f"{c}.to_target.h5")
        X2, y2, _ = read_features(root / "files" / f"{c}.to_t.h5")
        assert np.array_equal(X1, X2) and np.array_equal(y1, y2)
    # the target's DeFed evaluation equals dadil-evaluate on the file pipeline's state
    cli("dadil-evaluate", "--test", nodes[1]["dadil-test"], "--state",
        f"aggregation={root / 'files' / 'aggregation' / 'state' / 'ink.state.npz'}",
        "--json", root / "files" / "ev.json")
    ev = json.loads((root / "files" / "ev.json").read_text())
    assert rep["targets"]["ink"]["accuracy"] == ev["accuracy"]
    # three exchanges before round 0; what each message carries
    labels = [e["label"] for e in rep["exchanges"]]
    assert labels == ["hello", "class stats", "target reference", "premap", "round 0", "round 1",
                      "round 2"]
    sent = {(nid, t): (m.from_recorddict(msg.content), m.from_recorddict(r.content))
            for nid, t, msg, r in grid.log}
    assert {t for _, t in sent} >= {m.CLASS_STATS, m.TARGET_REFERENCE, m.PREMAP}
    assert [nid for nid, t in sent if t == m.CLASS_STATS] == [1001, 1003]
    assert [nid for nid, t in sent if t == m.TARGET_REFERENCE] == [1002]
    q, r = sent[(1001, m.CLASS_STATS)]
    assert set(r.arrays) == {"class_stats"}
    assert set(r.arrays["class_stats"]) == {"class_counts", "class_sums", "sum_x", "sum_xx"}
    q, r = sent[(1002, m.TARGET_REFERENCE)]
    assert set(q.arrays) == {"source/blocky", "source/neon"} and q.config["sources"] == ["blocky", "neon"]
    assert set(r.arrays) == {"reference"} and set(r.arrays["reference"]) == {"mean", "covariance"}
    assert set(sent[(1001, m.PREMAP)][0].arrays) == {"reference"}
    assert sent[(1002, m.PREMAP)][0].arrays == {}  # the target fits on its own rows
    assert all(not p.arrays for _, p in sent.values() if p.config.get("gmm"))  # no GMM leaves
    for nid, t in sent:
        if t in (m.DADIL_INIT, m.DADIL_ROUND):
            assert sent[(nid, t)][0].config["premap"] == "target"
    # bytes: the class statistics up, the reference down (8 bytes a number, plus keys)
    comm = rep["communication"]["per_client"]
    numbers = C + C * D + D + D * D
    assert 8 * numbers < comm["blocky"]["premap"]["received"] < 8 * numbers + 1000
    assert 8 * (D + D * D) < comm["blocky"]["premap"]["sent"] < 8 * (D + D * D) + 1500
    assert 2 * 8 * numbers < comm["ink"]["premap"]["sent"] < 2 * 8 * numbers + 2500
    assert 8 * (D + D * D) < comm["ink"]["premap"]["received"] < 8 * (D + D * D) + 2000
    assert rep["warnings"] == [] and rep["dropped"] == []
    # the command-line comparison: --premap compares the states without their GMM's hash
    f, fed = root / "files", "aggregation"
    args = ["--ref", root / "flower-defed" / f"defed-{fed}.ref.npz", f / "t.ref.npz"]
    for c in SITES:
        args += ["--gmm", premap_gmm(nodes, c), f / f"{c}.gmm.npz",
                 "--defed", node_fed(nodes, c, fed), f / fed]
    assert compare.main([str(a) for a in args]) == 1  # the states name other GMM files
    assert compare.main([str(a) for a in args] + ["--premap"]) == 0
    ok, line = compare.compare_gmms(premap_gmm(nodes, "blocky"), f / "neon.gmm.npz")
    assert not ok and "means" in line


def test_defed_premap_resumes_on_its_own_gmms(premap_sites):
    """A second run (no fresh=true) resumes from the states: no premap exchange, the rounds
    on the GMMs premap wrote."""
    root, nodes = premap_sites
    defed(LoopbackGrid(nodes), root, rounds=1, **PREMAP)
    rep = defed(LoopbackGrid(nodes), root, rounds=2, **PREMAP)
    assert rep["resumed"] and "premap" not in rep
    assert [e["label"] for e in rep["exchanges"]] == ["hello", "atoms of round 1", "round 2"]
    fed_nodes = file_premap(nodes, root / "files")
    file_defed(fed_nodes, root / "files" / "aggregation", 2, "aggregation")
    for c in SITES:
        ok, line = compare.compare_federations(node_fed(nodes, c, "aggregation"),
                                               root / "files" / "aggregation", gmm_hash=False)
        assert ok, line


@pytest.mark.parametrize("lost_in", [m.CLASS_STATS, m.PREMAP])
def test_defed_premap_source_lost_is_dropped(premap_sites, lost_in):
    """neon never answers ``lost_in``: the others go on. Lost before its statistics reached
    the target, the reference is of blocky's alone; lost after, its statistics stay in it."""
    root, nodes = premap_sites
    grid = LoopbackGrid(nodes)
    grid.tamper = lambda nid, mtype, reply: None if (nid == 1003 and mtype == lost_in) else reply
    rep = defed(grid, root, timeout=0.5, **PREMAP)
    label = {m.CLASS_STATS: "class stats", m.PREMAP: "premap"}[lost_in]
    assert rep["clients"] == ["blocky", "ink"]
    assert len(rep["warnings"]) == 1 and rep["warnings"][0].startswith(
        f"node neon (node 1003): no reply to {lost_in}")
    d = rep["dropped"][0]
    assert (d["client"], d["lost_at"]) == ("neon", label) and d["missed"][-1] == "round 2"
    in_ref = ("blocky",) if lost_in == m.CLASS_STATS else SOURCES
    assert rep["premap"]["sources"] == list(in_ref)
    fed_nodes = file_premap(nodes, root / "files", in_reference=in_ref,
                            federation=("blocky", "ink"))
    file_defed(fed_nodes, root / "files" / "aggregation", 2, "aggregation")
    assert_premap_equal(root, nodes, rep, root / "files", federation=("blocky", "ink"))


@pytest.mark.parametrize("bad, message", [
    (lambda a: a.update(class_sums=np.full_like(a["class_sums"], np.nan)),
     f"class stats reply: 'class_sums' has {C * D} NaN/Inf values"),
    (lambda a: a.update(sum_xx=np.eye(4)),
     r"class stats reply: 'sum_xx' has shape \(4, 4\), expected \(6, 6\)"),
    (lambda a: a.update(sum_xx=-np.eye(D)), "class stats reply: 'sum_xx' is not symmetric "
                                            "positive semidefinite"),
    (lambda a: a.update(class_counts=-a["class_counts"]),
     "class stats reply: class counts must be integers ≥ 0"),
])
def test_defed_premap_bad_class_stats_are_dropped_with_a_warning(premap_sites, bad, message):
    root, nodes = premap_sites
    grid = LoopbackGrid(nodes)
    grid.tamper = edit_reply(1001, m.CLASS_STATS, lambda a: bad(a["class_stats"]))
    with pytest.raises(FedalignError, match=f"node blocky \\(node 1001\\): {message}"):
        defed(grid, root, **{"min-clients": 3}, **PREMAP)
    rep = defed(grid, root, fresh=True, **PREMAP)
    assert rep["clients"] == ["ink", "neon"] and rep["premap"]["sources"] == ["neon"]
    assert len(rep["warnings"]) == 1
    assert rep["warnings"][0].startswith("node blocky (node 1001): ")
    assert rep["warnings"][0].endswith("dropped from the federation")


@pytest.mark.parametrize("lost_in, tamper_reply", [
    (m.TARGET_REFERENCE, lambda reply: None),
    (m.PREMAP, lambda reply: None),
    (m.TARGET_REFERENCE, "nan"),
])
def test_defed_premap_without_the_target_is_one_error_line(premap_sites, lost_in, tamper_reply):
    root, nodes = premap_sites
    grid = LoopbackGrid(nodes)

    def tamper(nid, mtype, reply):
        if nid != 1002 or mtype != lost_in:
            return reply
        if tamper_reply != "nan":
            return tamper_reply(reply)
        p = m.from_recorddict(reply.content)
        p.arrays["reference"]["mean"][0] = np.nan
        reply.content = m.to_recorddict(p)
        return reply

    grid.tamper = tamper
    what = {m.TARGET_REFERENCE: "target reference", m.PREMAP: "premap"}[lost_in]
    why = "'mean' has 1 NaN/Inf value" if tamper_reply == "nan" else f"no reply to {lost_in}"
    with pytest.raises(FedalignError, match=f"DeFed premap, {what}: the target failed: node ink "
                                            f"\\(node 1002\\): .*{why}") as e:
        defed(grid, root, timeout=0.5, **PREMAP)
    assert "\n" not in str(e.value)
    assert not (root / "flower-defed" / "defed-aggregation.json").exists()


def test_defed_premap_settings_are_checked(premap_sites):
    root, nodes = premap_sites
    for cfg, message in ((dict(premap="source"), "premap must be '' .off. or 'target'"),
                         (dict(premap="target"), "premap='target' needs target='CLIENT'"),
                         (dict(premap="target", target="a b"), "run config target: invalid client"),
                         (dict(premap="target", target="ink", gmm_k=0), "gmm-k must be ≥ 1")):
        with pytest.raises(FedalignError, match=message):
            defed(LoopbackGrid(nodes), root, **cfg)
    with pytest.raises(FedalignError, match="the target 'dvd' is none of the nodes that answered "
                                            r"\(blocky, ink, neon\)"):
        defed(LoopbackGrid(nodes), root, premap="target", target="dvd")
    # without premap, a node without gmm= is dropped at hello, as before
    with pytest.raises(FedalignError, match="node blocky .*has no gmm='…' in its node config"):
        defed(LoopbackGrid(nodes), root, **{"min-clients": 3})


def test_defed_premap_off_sends_what_it_sent_before(fresh_sites):
    """premap off (the default): no premap exchange, no premap key in any message, no premap
    folder on the nodes, the rounds on the node config's gmm= (states byte for byte those of
    the file pipeline: test_defed_equals_the_file_pipeline)."""
    root, nodes = fresh_sites
    grid = LoopbackGrid(nodes)
    rep = defed(grid, root, rounds=1, gmm_k=3)  # premap settings without premap: unused
    assert [e["label"] for e in rep["exchanges"]] == ["hello", "round 0", "round 1"]
    assert "premap" not in rep and set(rep["communication"]["per_client"]["ink"]) == {"defed"}
    for _, mtype, msg, _ in grid.log:
        assert "premap" not in m.from_recorddict(msg.content).config
        assert mtype not in (m.CLASS_STATS, m.TARGET_REFERENCE, m.PREMAP)
    assert m.from_recorddict(grid.log[0][2].content).config == dict(federation="aggregation",
                                                                   strategy="aggregation")
    for n in nodes:
        assert not (node_fed(nodes, n["name"], "aggregation") / "premap").exists()

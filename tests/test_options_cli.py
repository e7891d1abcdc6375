"""fedalign.cli.options: the shared option declarations and the parsers of option text."""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from fedalign import align, defaults, files, threads
from fedalign.cli import app
from fedalign.cli.options import parse_alpha, parse_params, parse_seeds, parse_shrinkage
from fedalign.errors import FedalignError

runner = CliRunner()


def test_parse_seeds_ranges_lists_and_errors():
    assert parse_seeds(["0-2", "5", "1,7"]) == [0, 1, 2, 5, 7]
    with pytest.raises(FedalignError, match=r"--seeds: each seed must be an integer in \[0, .*got -1$"):
        parse_seeds(["-1"])                 # numpy's generators take no negative seed
    with pytest.raises(FedalignError, match="--seeds: the range '3-1' is empty"):
        parse_seeds(["0", "3-1"])
    assert parse_seeds(["2-2"]) == [2]
    with pytest.raises(FedalignError, match="--seeds: the range '0-100000000' holds 100,000,001 "
                                            "seeds, more than 10,000"):
        parse_seeds(["0-100000000"])                                # built a list of 10⁸ ints
    assert len(parse_seeds(["0-9999"])) == 10_000
    with pytest.raises(FedalignError, match="--seeds: expected integers"):
        parse_seeds(["a"])
    with pytest.raises(FedalignError, match="--seeds: give at least one seed"):
        parse_seeds([])
    with pytest.raises(FedalignError, match="--eval-seeds: expected"):
        parse_seeds(["x"], flag="--eval-seeds")


def test_parse_seeds_refuses_seeds_beyond_32_bits():
    """scikit-learn's random_state and numpy's legacy generators take seeds < 2**32: a larger
    one is one error naming the bound (a traceback deep in a head before), in a list or a range."""
    assert defaults.MAX_SEED == 2**32 - 1
    assert parse_seeds([str(2**32 - 1)]) == [2**32 - 1]
    assert parse_seeds(["4294967294-4294967295"]) == [2**32 - 2, 2**32 - 1]
    message = (r"^--seeds: each seed must be an integer in \[0, 2\*\*32 − 1 = 4294967295\] \(.*\), "
               r"got 4294967296$")
    for values in (["4294967296"], ["0", "4294967296"], ["4294967290-4294967296"]):
        with pytest.raises(FedalignError, match=message):
            parse_seeds(values)
    with pytest.raises(FedalignError, match=r"^run config seeds: each seed must be an integer in "
                                            r"\[0, 2\*\*32 − 1 = 4294967295\]"):
        parse_seeds([str(2**64)], flag="run config seeds")


def _commands(group, prefix=()):
    """(command path, click command) of every subcommand of a click group, nested ones too."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, prefix + (name,))
        else:
            yield " ".join(prefix + (name,)), cmd


def test_every_seed_option_declares_the_32_bit_range():
    """Every integer seed option of every command (--seed, -L's seed, --init: --seed) is
    declared [0, MAX_SEED], so the parser refuses 2**32 by name before any file is read."""
    import typer.main

    seen = []
    for path, cmd in _commands(typer.main.get_command(app)):
        for p in cmd.params:
            if "seed" in p.name and not p.name.startswith("seeds"):
                seen.append(f"{path} {p.opts[0]}")
                assert (p.min, p.max) == (0, defaults.MAX_SEED), (path, p.name)
    assert {"fit-gmm --seed", "dadil-round --seed", "consensus --seed", "partition --seed",
            "stats --seed", "plot embedding --seed", "plot reconstruction --seed",
            "demo-data --seed", "extract --seed", "dadil-simulate --seed"} <= set(seen), seen


def test_run_config_seeds_take_the_command_lines_bounds():
    """The Flower run config's seeds (seeds, eval-seeds: parse_seeds; dadil-seed, gmm-seed:
    as --seed) are refused beyond 2**32 − 1 or below 0, naming the key."""
    from fedalign.flower.settings import Settings

    assert Settings.seed_list("4294967295") == [2**32 - 1]
    with pytest.raises(FedalignError, match=r"^run config eval-seeds: each seed must be an integer "
                                            r"in \[0, 2\*\*32 − 1 = 4294967295\]"):
        Settings.seed_list("0, 4294967296", "eval-seeds")
    for key in ("dadil-seed", "gmm-seed"):
        s = Settings.from_run_config({"out": "/x", key: 2**32 - 1})
        assert getattr(s, key.replace("-", "_")) == 2**32 - 1
        for bad in (2**32, -1):
            with pytest.raises(FedalignError, match=rf"^run config {key} must be an integer in "
                                                    rf"\[0, 2\*\*32 − 1 = 4294967295\] \(.*\), "
                                                    rf"got {bad}$"):
                Settings.from_run_config({"out": "/x", key: str(bad)})


def test_parse_params_shrinkage_alpha():
    assert parse_params(["fedpft.epochs=5", "ofedavg.lr=0.1"]) == {"fedpft": {"epochs": "5"},
                                                                   "ofedavg": {"lr": "0.1"}}
    with pytest.raises(FedalignError, match="--param must look like METHOD.KEY=VALUE"):
        parse_params(["epochs=5"])
    assert parse_shrinkage("auto") == "auto" and parse_shrinkage(" None ") == "none"
    assert parse_shrinkage("0.25") == 0.25
    for bad, msg in (("x", "auto, none or a number"), ("1.5", "in \\[0, 1\\]")):
        with pytest.raises(FedalignError, match=f"--shrinkage must be {msg}"):
            parse_shrinkage(bad)
    assert parse_alpha("none") is None and parse_alpha("inf") is None and parse_alpha(None) is None
    assert parse_alpha("0.1") == 0.1
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(FedalignError, match="--alpha must be a positive number or 'none'"):
            parse_alpha(bad)


def test_defaults_are_the_library_constants():
    """One home per default: the CLI's --tau, --chunk-rows, --threads and the library's."""
    assert align.DEFAULT_TAU == defaults.TAU
    assert files.DEFAULT_CHUNK_ROWS == defaults.CHUNK_ROWS
    assert threads.DEFAULT_THREADS == defaults.THREADS
    from fedalign.stats import compute_stats

    assert inspect.signature(compute_stats).parameters["chunk_rows"].default == defaults.CHUNK_ROWS
    assert inspect.signature(align.align_file).parameters["chunk_rows"].default == defaults.CHUNK_ROWS
    r = runner.invoke(app, ["align", "--help"])
    assert f"[default: {defaults.TAU}; 0 ≤ x ≤ 1]" in r.stdout   # the range: declared
    assert f"[default: {defaults.CHUNK_ROWS}; ≥ 1]" in r.stdout
    for cmd in ("dadil-round", "consensus", "dadil-evaluate", "dadil-envelope"):
        r = runner.invoke(app, [cmd, "--help"])
        assert "--threads INT" in r.stdout and f"[default: {defaults.THREADS}; ≥ 1]" in r.stdout


def test_bad_shrinkage_names_the_flag(feature_file, tmp_path):
    p, _, _ = feature_file()
    r = runner.invoke(app, ["stats", str(p), "-o", str(tmp_path / "s.npz"), "--shrinkage", "2"])
    assert r.exit_code == 2 and "--shrinkage must be in [0, 1]" in r.output

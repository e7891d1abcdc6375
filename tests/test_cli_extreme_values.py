"""Bad input found by a black-box sweep of real ``fedalign`` processes: each class is one
``error:`` line and exit code 2, no traceback, nothing written.

1. finite but extreme number options (``--var-floor-rel 1e308``, ``--clip 1e150``,
   ``--dp-epsilon 1e150``) reached scikit-learn / the DP calibration and ended in tracebacks
   (:func:`fedalign.cli.runtime.check_finite`, :func:`fedalign.dp.make_spec`);
2. a method option of ``inf`` (``--param fedpft.lr=inf``) trained a head of NaN weights and
   reported its accuracy (:func:`fedalign.heads.make_config`);
3. an option asking for more memory than there is (``--n-atoms 1000000000``): a MemoryError
   traceback (:func:`fedalign.cli.runtime.guarded`);
4. library warnings (numpy's ``RuntimeWarning: overflow``) printed before the error line
   (:func:`fedalign.cli.runtime.held_warnings`);
5. ``plot reconstruction --state ATOMS`` named the file ``None``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.cli.runtime import guarded
from fedalign.errors import FedalignError

from conftest import make_features

pytestmark = pytest.mark.usefixtures("one_thread")


def _env() -> dict:
    import fedalign

    root = str(Path(fedalign.__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))


def _listing(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*"))
            if p.is_file()}


def refused(folder, *args, match):
    """``fedalign ARGS`` in a real process: exit 2, one ``error:`` line matching ``match``, no
    traceback, the folder unchanged."""
    before = _listing(folder)
    r = subprocess.run([sys.executable, "-m", "fedalign", *map(str, args)], cwd=folder,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (args, r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr[-3000:]
    assert re.search(match, lines[0]), lines[0]
    assert _listing(folder) == before, "the folder changed"
    return lines[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("extreme")
    make_features(w / "a.h5", n=40, d=4, seed=0)
    make_features(w / "a.test.h5", n=30, d=4, seed=2)
    runner = CliRunner()
    for args in (["fit-gmm", w / "a.h5", "-o", w / "a.gmm.npz", "-k", "1"],
                 ["dadil-round", "--init", "--client", "c0", "--gmm", w / "a.gmm.npz", "--state",
                  w / "c0.state.npz", "-o", w / "c0.atoms.npz", "--n-atoms", "2"]):
        r = runner.invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, r.output
    return w


# 1. extreme finite option values -------------------------------------------------------------

@pytest.mark.parametrize("args, match", [
    # a relative floor of inf reached scikit-learn's reg_covar check (InvalidParameterError)
    (["fit-gmm", "a.h5", "-o", "o.npz", "--var-floor-rel", "1e308"],
     re.escape("--var-floor-rel must be 0 or of a magnitude in [1e-150, 1e+150], got 1e+308")),
    (["align", "a.h5", "--map", "x.npz", "-o", "o.h5", "--tau", "1e-300"],
     re.escape("--tau must be 0 or of a magnitude in [1e-150, 1e+150], got 1e-300")),
    # a TypeError formatting the release's note
    (["stats", "a.h5", "-o", "o.npz", "--dp-epsilon", "1e150", "--dp-delta", "1e-5", "--clip",
      "1"], r"--dp-epsilon 1e\+150 at --dp-delta 1e-05 calibrates a noise multiplier μ = "
            r"1.41e\+75, outside \[1e-12, 1e\+12\]"),
    # an OverflowError in the shrinkage rule
    (["stats", "a.h5", "-o", "o.npz", "--dp-epsilon", "1", "--dp-delta", "1e-5", "--clip",
      "1e100"], re.escape("--clip (the L2 norm rows are clipped to) must be in [1e-30, 1e+30]")),
    # σ = inf, a ZeroDivisionError
    (["stats", "a.h5", "-o", "o.npz", "--dp-epsilon", "1e-100", "--dp-delta", "1e-5", "--clip",
      "1", "--dp-mechanism", "zcdp"], r"--dp-epsilon 1e-100 .* outside \[1e-12, 1e\+12\]"),
], ids=["var-floor-rel", "tau-subnormal", "dp-epsilon", "clip", "zcdp-epsilon"])
def test_extreme_number_options_are_one_error_line(world, args, match):
    refused(world, *args, match=match)


# 2. method options -----------------------------------------------------------------------------

@pytest.mark.parametrize("param", ["fedpft.lr=inf", "fedpft.lr=1e308", "fedcgs.ridge=-inf"])
def test_method_options_of_infinite_magnitude_are_refused(world, param):
    method = param.split(".")[0]
    refused(world, "evaluate", "-m", method, "--train", "a.h5", "--test", "a.test.h5", "--param",
            param, match=re.escape(f"{param.split('=')[0]} must be "))


def test_a_method_options_own_default_of_inf_is_taken():
    from fedalign.heads import get_method

    assert get_method("fedcgs").config({"dp_epsilon": "inf"}).dp_epsilon == float("inf")
    with pytest.raises(FedalignError, match="fedcgs.dp_delta must be a finite number"):
        get_method("fedcgs").config({"dp_delta": "nan"})


def test_dp_spec_ranges():
    from fedalign.dp import make_spec

    assert make_spec(1.0, 1e-5, 1e30).clip == 1e30
    for eps, clip, match in ((1.0, 1e31, "clip"), (1.0, 1e-31, "clip"),
                             (1e200, 1.0, "noise multiplier")):
        with pytest.raises(FedalignError, match=match):
            make_spec(eps, 1e-5, clip)


# 3. out of memory, 4. held warnings ----------------------------------------------------------------

def _run_guarded(fn, capsys):
    code = 0
    try:
        guarded(fn)()
    except typer.Exit as e:
        code = e.exit_code
    return code, capsys.readouterr().err


def test_out_of_memory_is_one_error_line(capsys):
    def command():
        raise MemoryError()

    code, err = _run_guarded(command, capsys)
    assert code == 2
    assert err.startswith("error: out of memory") and err.count("\n") == 1, err


def test_library_warnings_before_an_error_are_dropped(capsys):
    def failing():
        warnings.warn("overflow encountered in multiply", RuntimeWarning)
        raise FedalignError("bad input")

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        code, err = _run_guarded(failing, capsys)
    assert code == 2 and err == "error: bad input\n" and not shown, (err, shown)


@pytest.mark.parametrize("bug", [None, ZeroDivisionError("bug")], ids=["succeeds", "bug"])
def test_library_warnings_are_shown_when_a_command_succeeds_or_has_a_bug(bug):
    """Held warnings are shown as before, unless the command failed on bad input (above)."""
    def command():
        warnings.warn("a library's note", UserWarning)
        if bug is not None:
            raise bug

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        if bug is None:
            guarded(command)()
        else:
            with pytest.raises(ZeroDivisionError):
                guarded(command)()
    assert [str(w.message) for w in shown] == ["a library's note"]


# 5. messages that name the file ----------------------------------------------------------------

def test_plot_reconstruction_names_an_atoms_file_given_as_state(world):
    refused(world, "plot", "reconstruction", "a.test.h5", "--state", "c0.atoms.npz", "-o", "r.png",
            "--method", "pca",
            match=re.escape("error: c0.atoms.npz is an atoms file: give the target's --alpha"))

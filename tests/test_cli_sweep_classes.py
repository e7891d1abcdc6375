"""Bad input a black-box sweep found accepted or misreported, fixed as classes; each is one
``error:`` line, exit 2, nothing written (``refused`` of :mod:`test_cli_extreme_values`).

1. a choice option given a word that is not a choice (``--strategy banana`` with ``--init``,
   ``plot reconstruction --method banana``): :func:`fedalign.cli.options.choice_option`;
2. ``consensus fed fed``: one run given twice (:func:`fedalign.files.check_distinct`);
3. ``partition --test-fraction 0``: empty test files; 6. ``--alpha 1e308``: "a larger --alpha";
4. ``align FEATURES REFERENCE --map MAP``: REFERENCE silently ignored;
5. ``stats`` of 2 rows in d=4: s=-8.8e-17 and "use shrinkage 'auto'" with auto in use;
7./8. grammar: "zero.h5 have no labelled rows", "is a atoms file";
9. a file of another format named as such (an .npz for features, a CSV read as .npz, a
   folder given as labels file).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_features
from test_cli_extreme_values import refused, world  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("args, flag", [
    (["dadil-round", "--init", "--client", "c9", "--gmm", "a.gmm.npz", "--state",
      "c9.state.npz", "-o", "c9.atoms.npz", "--strategy", "banana"], "--strategy"),
    (["plot", "reconstruction", "a.test.h5", "--state", "c0.state.npz", "--method", "banana",
      "-o", "r.png"], "--method"),
    (["stats", "a.h5", "-o", "s.npz", "--dp-mechanism", "banana"], "--dp-mechanism"),
    (["import", "a.h5", "-o", "i.h5", "--label-values", "banana"], "--label-values"),
])
def test_choice_options_refuse_other_words(world, args, flag):  # noqa: F811
    refused(world, *args, match=rf"^error: {flag} must be one of .*, got 'banana'")


def test_consensus_refuses_a_run_given_twice(world):  # noqa: F811
    fed = world / "fed"
    fed.mkdir(exist_ok=True)
    (fed / "c0.atoms.npz").write_bytes((world / "c0.atoms.npz").read_bytes())
    refused(world, "consensus", "fed", "fed", match=r"run fed is given twice")
    refused(world, "consensus", "x=fed", "y=./fed", match=r"given twice")
    refused(world, "consensus", "x=fed", "x=c0.atoms.npz", match=r"run name 'x' is given twice")


def test_partition_refuses_an_empty_test_split(world):  # noqa: F811
    refused(world, "partition", "a.h5", "-o", "p", "--test-fraction", "0",
            match=r"--test-fraction 0 leaves the test split of domain a empty")


def test_partition_alpha_beyond_the_sampler(tmp_path):
    make_features(tmp_path / "a.h5", n=40, d=4, seed=0)
    make_features(tmp_path / "b.h5", n=40, d=4, seed=1)
    line = refused(tmp_path, "partition", "a.h5", "b.h5", "-o", "p", "--alpha", "1e308",
                   match=r"--alpha must be in \[1e-150, 1e\+150\]")
    assert "larger" not in line


def test_align_refuses_reference_and_map(world):  # noqa: F811
    from typer.testing import CliRunner

    from fedalign.cli import app

    w = world
    for args in (["stats", w / "a.h5", "-o", w / "a.npz"],
                 ["stats", w / "a.test.h5", "-o", w / "t.npz"],
                 ["barycenter", w / "a.npz", w / "t.npz", "-o", w / "ref.npz"],
                 ["align", w / "a.h5", w / "ref.npz", "-o", w / "a.al.h5", "--save-map",
                  w / "a.map.npz"]):
        r = CliRunner().invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, r.output
    refused(w, "align", "a.test.h5", "ref.npz", "--map", "a.map.npz", "-o", "t.al.h5",
            match=r"reference ref\.npz and --map a\.map\.npz exclude each other")


def test_stats_too_few_rows_for_auto(tmp_path):
    make_features(tmp_path / "two.h5", n=2, d=4, seed=0)
    line = refused(tmp_path, "stats", "two.h5", "-o", "s.npz",
                   match=r"shrinkage s=0 \(n=2 rows for d=4 dimensions\); Ledoit–Wolf "
                         r"\(--shrinkage auto\) finds no shrinkage .* at least 5 rows")
    assert "e-1" not in line


def test_messages_grammar(world, tmp_path):  # noqa: F811
    make_features(tmp_path / "zero.h5", n=10, d=4, seed=0, unlabeled=True)
    for f in ("c0.state.npz", "c0.atoms.npz"):
        (tmp_path / f).write_bytes((world / f).read_bytes())
    refused(tmp_path, "plot", "reconstruction", "zero.h5", "--state", "c0.state.npz",
            "--missing", "0", "-o", "r.png", match=r"^error: zero\.h5: no labelled rows")
    refused(tmp_path, "dadil-round", "--state", "c0.atoms.npz", "-o", "x.npz",
            match=r"c0\.atoms\.npz: is an atoms file, expected a state file")


def test_files_of_another_format(world, tmp_path):  # noqa: F811
    (tmp_path / "c0.atoms.npz").write_bytes((world / "c0.atoms.npz").read_bytes())
    np.savetxt(tmp_path / "x.csv", np.ones((3, 2)), delimiter=",")
    (tmp_path / "labels").mkdir()
    refused(tmp_path, "stats", "c0.atoms.npz", "-o", "s.npz",
            match=r"c0\.atoms\.npz: is an \.npz file \(an atoms file\), expected an HDF5 "
                  r"features file")
    refused(tmp_path, "import", "x.csv", "-o", "x.h5", "--format", "npz",
            match=r"x\.csv: not a readable \.npz file: it is a text file, not an \.npz file "
                  r"\(a CSV\? give --format csv\)")
    refused(tmp_path, "import", "x.csv", "-o", "x.h5", "--labels", "labels",
            match=r"labels: is a folder, not a labels file")

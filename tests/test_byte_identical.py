"""Byte-identical outputs: a fixed, generated, tiny federation's files against recorded hashes.

The federation (seeded blobs written with :func:`fedalign.files.write_features`, every step
through the real ``fedalign`` commands, in-process): ``fit-gmm`` (labeled, and ``--unlabeled``
for the target), ``dadil-round --init`` and 2 rounds of every strategy for 3 clients,
``consensus``, ``stats`` for two clients and the ``barycenter`` of the two stats files. The
SHA-256 of every file is recorded in ``tests/data/byte_identical.json``; a refactoring that
changes behaviour or a file format shows up here as the first file whose bytes moved.

Hashes belong to a platform (numpy/BLAS/POT versions and CPU kernels can move the last bits
of a float: :func:`_platform` names what does): the record keeps one set per platform seen,
and the files must equal one set entirely — the set recorded for this platform when there is
one. On a platform never recorded (a CPU without AVX-512 gives other exp/log bits in the GMM
fits) the test checks what it can without a record: the same files, and the same bytes on a
second run of the federation, with a warning naming the platform. On another machine,
``FEDALIGN_UPDATE_BYTE_IDENTICAL=1 python -m pytest -q tests/test_byte_identical.py`` adds its set — only from a commit whose outputs are known to
be unchanged (say so in the commit); after a deliberate format change, delete the old sets.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedalign.cli import app
from fedalign.files import write_features

RECORD = Path(__file__).parent / "data" / "byte_identical.json"
STRATEGIES = ("replacement", "aggregation", "none")
DOMAINS = ("a", "b", "t")     # two labeled sources, one unlabeled target
ROUNDS = 2

runner = CliRunner()


def _run(*args) -> None:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, f"fedalign {' '.join(map(str, args))}: {r.output}"


def _blobs(path: str, seed: int, n: int = 60, d: int = 4, C: int = 2) -> None:
    """Two well-separated classes per domain, each domain shifted and scaled differently."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(C), n // C)
    centers = np.array([[0.0] * d, [4.0] * d])
    X = (centers[y] * (1 + 0.2 * seed) + rng.normal(size=(n, d)) + seed).astype(np.float32)
    write_features(path, X, y, [f"s{seed}_{i:03d}" for i in range(n)],
                   class_names=[f"c{c}" for c in range(C)], provenance={"producer": "tests"})


def _federation() -> None:
    """Write every file of the fixed federation into the current folder (relative paths only,
    so the files' recorded paths do not depend on where the test runs)."""
    for i, dom in enumerate(DOMAINS):
        _blobs(f"{dom}.h5", seed=i)
    for dom in DOMAINS[:2]:
        _run("fit-gmm", f"{dom}.h5", "-o", f"{dom}.gmm.npz", "-k", 2)
    _run("fit-gmm", "t.h5", "-o", "t.gmm.npz", "-k", 2, "--unlabeled")
    for strategy in STRATEGIES:
        fed = Path(f"fed_{strategy}")
        for t in range(ROUNDS + 1):
            (fed / f"round_{t:03d}").mkdir(parents=True)
        (fed / "state").mkdir()
        for dom in DOMAINS:
            _run("dadil-round", "--init", "--client", dom, "--gmm", f"{dom}.gmm.npz",
                 "--state", fed / "state" / f"{dom}.state.npz",
                 "-o", fed / "round_000" / f"{dom}.atoms.npz", "--n-atoms", 2, "--seed", 3)
        for t in range(1, ROUNDS + 1):
            prev = sorted((fed / f"round_{t - 1:03d}").glob("*.atoms.npz"))
            for dom in DOMAINS:
                _run("dadil-round", "--state", fed / "state" / f"{dom}.state.npz",
                     "--strategy", strategy, "--local-steps", 2, "--client", dom,
                     "-o", fed / f"round_{t:03d}" / f"{dom}.atoms.npz", *prev)
    _run("consensus", "replacement=fed_replacement", "aggregation=fed_aggregation",
         "-o", "consensus.json", "-L", 4)
    for dom in DOMAINS[:2]:
        _run("stats", f"{dom}.h5", "-o", f"{dom}.stats.npz", "--per-class")
    _run("barycenter", "a.stats.npz", "b.stats.npz", "-o", "ref.npz")


def _hashes(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.usefixtures("one_thread")
def test_fixed_federation_files_are_byte_identical(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _federation()
    got, here = _hashes(tmp_path), _platform()
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    sets = [(None, record.get("files", {}))] + [(p.get("platform"), p["files"])
                                                for p in record.get("other_platforms", [])]
    if os.environ.get("FEDALIGN_UPDATE_BYTE_IDENTICAL") and got not in [f for _, f in sets]:
        # another platform's hashes: kept beside the recorded ones (a behaviour change moves
        # every set; delete the old sets after a deliberate one)
        RECORD.parent.mkdir(exist_ok=True)
        record.setdefault("about", "SHA-256 of every file of tests/test_byte_identical.py's "
                          "fixed federation, one set per platform seen; regenerate with "
                          "FEDALIGN_UPDATE_BYTE_IDENTICAL=1 after a deliberate change")
        if not record.get("files"):
            record["files"] = got
        else:
            record.setdefault("other_platforms", []).append(dict(platform=here, files=got))
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        sets.append((here, got))
    want = _closest(got, [f for _, f in sets])
    assert sorted(got) == sorted(want), "the federation wrote other files than recorded"
    if got == want:
        return
    mine = [f for plat, f in sets if plat == here]
    if not mine:    # a platform never recorded: its own bytes must at least repeat
        again = tmp_path / "again"
        again.mkdir()
        monkeypatch.chdir(again)
        _federation()
        assert _hashes(again) == got, "the same federation wrote other bytes on a second run"
        warnings.warn(f"no byte-identical record for this platform ({here}): checked "
                      "that its own files repeat, not that they equal a recorded platform's; "
                      "FEDALIGN_UPDATE_BYTE_IDENTICAL=1 adds its set (module docstring)")
        return
    want = _closest(got, mine)
    moved = [f for f in want if got[f] != want[f]]
    assert not moved, (f"{len(moved)} of {len(want)} files changed bytes against this "
                       f"platform's record, first: {moved[:5]}")


def _closest(got: dict, sets: list) -> dict:
    """The recorded set with the fewest files whose hash differs from ``got``'s."""
    return min(sets, key=lambda w: sum(got.get(f) != h for f, h in w.items()))


def _platform() -> str:
    """What moves the last bits of a float: the machine, the numerical libraries' versions,
    OpenBLAS's kernel and numpy's SIMD dispatch (AVX-512 and AVX2 give other exp/log bits)."""
    import platform

    import ot
    import scipy
    import sklearn
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    from threadpoolctl import threadpool_info

    blas = sorted({f"{i['internal_api']}:{i.get('architecture')}" for i in threadpool_info()
                   if i.get("user_api") == "blas"})
    simd = [k for k in __cpu_dispatch__ if __cpu_features__.get(k)]
    return (f"{platform.machine()} numpy {np.__version__} scipy {scipy.__version__} "
            f"scikit-learn {sklearn.__version__} pot {ot.__version__} blas {','.join(blas)} "
            f"simd {','.join(simd) or 'baseline'}")

"""Outputs (fedalign.files.outputs): one file under several spellings, keyed lookups."""

import os

import pytest

from fedalign.errors import FedalignError


# ------------------------------------------------ one file, several spellings: keyed lookups
def _count_resolutions(monkeypatch):
    """Count ``os.path.realpath`` calls made by fedalign.files (its outputs module resolves
    every path)."""
    import fedalign.files.outputs as outputs

    calls = []
    real = outputs.os.path.realpath

    def counting(p, *a, **k):
        calls.append(p)
        return real(p, *a, **k)

    monkeypatch.setattr(outputs.os.path, "realpath", counting)
    return calls


def test_check_outputs_resolves_each_path_once(tmp_path, monkeypatch):
    """A federation's ~1,000 outputs: n + m resolutions, not one per pair (20 s at n = 1,000)."""
    from fedalign.files import check_outputs

    ins = [tmp_path / f"c{c}.gmm.npz" for c in range(10)]
    outs = [tmp_path / f"r{r:03d}" / f"c{c}.npz" for r in range(150) for c in range(10)]
    calls = _count_resolutions(monkeypatch)
    check_outputs(ins, outs, allow=[ins[0]])
    assert len(calls) == len(ins) + len(outs) + 1


def test_check_outputs_sees_every_spelling_and_names_the_first_input(tmp_path, monkeypatch):
    from fedalign.files import check_outputs

    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).write_text(name)
    os.link("a", "hard")
    (tmp_path / "soft").symlink_to("b")
    check_outputs(["a", "b"], ["x", "y"])                                   # distinct: fine
    (tmp_path / "d").mkdir()
    for outs, msg in ((["x", str(tmp_path / "x")], f"x and {tmp_path}/x are the same output"),
                      (["x", "d/../x"], "x and d/../x are the same output file"),
                      (["y", "hard"], r"output hard is also an input \(a\)"),   # a hard link
                      (["soft"], r"output soft is also an input \(b\)"),        # a symlink
                      ([str(tmp_path / "b")], f"output {tmp_path}/b is also an input \\(b\\)")):
        with pytest.raises(FedalignError, match=msg):
            check_outputs(["a", "b"], outs)
    # an input given twice under two spellings: the message names the first one given
    with pytest.raises(FedalignError, match=r"output a is also an input \(hard\)"):
        check_outputs(["hard", "a"], ["a"])
    with pytest.raises(FedalignError, match=r"output a is also an input: refusing"):
        check_outputs(["a", "hard"], ["a"])
    check_outputs(["a"], ["hard"], allow=["./a"])                         # updated in place
    check_outputs([None, "a"], [None, "x"])                               # None entries ignored

"""Transactions (fedalign.files.transactions): all of a command's outputs or none."""

import pytest

from fedalign.errors import FedalignError
from fedalign.files import atomic_output
from test_files_outputs import _count_resolutions


def test_atomic_output_leaves_nothing_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_output(tmp_path / "out.txt") as tmp:
            tmp.write_text("partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_transaction_finds_its_outputs_by_any_spelling_in_one_lookup(tmp_path, monkeypatch):
    from fedalign.files import atomic_outputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "old").write_text("old")
    (tmp_path / "link").symlink_to("old")
    (tmp_path / "d").mkdir()
    n = 300
    with atomic_outputs() as tx:
        calls = _count_resolutions(monkeypatch)
        tmps = [tx.add(f"f{i}.txt") for i in range(n)]
        assert len(calls) == n                                     # one resolution per output
        old_tmp = tx.add("old")
        for bad in ("./f7.txt", "d/../f7.txt", "link"):          # the same file again
            with pytest.raises(FedalignError, match="would be written twice"):
                tx.add(bad)
        assert tx.temporary("./f7.txt") == tmps[7] and tx.temporary("link") == old_tmp
        with pytest.raises(KeyError):
            tx.temporary("nope")
        tx.commit_first("./f9.txt")
        assert tx.entries[0][0] == tmps[9] and len(tx.entries) == n + 1
        tx.commit_first("nope")                                    # not an output: no change
        assert tx.entries[0][0] == tmps[9] and len(tx.entries) == n + 1
        tx.discard(tmps[3])
        with pytest.raises(KeyError):
            tx.temporary("f3.txt")
        assert tx.add("f3.txt") != tmps[3]                         # free again after discard
        for i, t in enumerate(tmps):
            if i != 3:
                t.write_text(str(i))
        tx.temporary("f3.txt").write_text("3")
        old_tmp.write_text("new")
    assert [(tmp_path / f"f{i}.txt").read_text() for i in (0, 3, n - 1)] == ["0", "3", str(n - 1)]
    assert (tmp_path / "old").read_text() == "new"
    assert not [p for p in tmp_path.iterdir() if ".fedalign-tmp-" in p.name]

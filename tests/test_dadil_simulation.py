"""fedalign.dadil.simulation as a library: all of a federation's files together, or none."""

from __future__ import annotations

import pytest

from fedalign.dadil.simulation import simulate
from fedalign.errors import FedalignError
from fedalign.files import atomic_outputs

from test_dadil_gossip import make_gmms

pytestmark = pytest.mark.usefixtures("one_thread")
OPTS = dict(n_atoms=2, seed=5)
CLIENTS = ["c0", "c1", "tgt"]


def _gmms(tmp_path):
    (tmp_path / "gmms").mkdir()
    return make_gmms(tmp_path / "gmms", 3)   # c0, c1 labeled, tgt unlabeled


def _entries(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_run_stopped_midway_leaves_nothing(tmp_path, in_memory):
    """An error in round 2 of 3 (here: the caller's callback; a signal works the same way):
    no state, no round folder, no staging folder, though rounds 0-1 were written (and, without
    ``in_memory``, committed) inside the staging folder."""
    gp = _gmms(tmp_path)

    def stop(t, states):
        if t == 2:
            raise FedalignError("stopped")

    with pytest.raises(FedalignError, match="stopped"):
        simulate(gp, tmp_path / "fed", 3, "aggregation", 1, callback=stop, in_memory=in_memory,
                 **OPTS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gmms"]


def test_files_appear_together_and_inside_an_enclosing_transaction_at_its_end(tmp_path):
    gp = _gmms(tmp_path)
    with atomic_outputs():
        simulate(gp, tmp_path / "a" / "fed", 2, "replacement", 1, **OPTS)   # parents created
        # not yet: the files are temporaries until the commit
        assert not [p for p in (tmp_path / "a" / "fed").rglob("*.npz") if p.name[0] != "."]
    assert _entries(tmp_path / "a") == [
        "fed", "fed/round_000", *[f"fed/round_000/{c}.atoms.npz" for c in CLIENTS],
        "fed/round_001", *[f"fed/round_001/{c}.atoms.npz" for c in CLIENTS],
        "fed/round_002", *[f"fed/round_002/{c}.atoms.npz" for c in CLIENTS],
        "fed/state", *[f"fed/state/{c}.state.npz" for c in CLIENTS]]
    with pytest.raises(FedalignError, match="boom"):    # the enclosing block fails: nothing
        with atomic_outputs():
            simulate(gp, tmp_path / "b", 1, "aggregation", 1, **OPTS)
            raise FedalignError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "gmms"]


def test_a_rerun_replaces_the_files_and_the_states_continue_from_the_new_run(tmp_path):
    from fedalign.dadil.state import load_state

    gp = _gmms(tmp_path)
    simulate(gp, tmp_path / "fed", 2, "aggregation", 1, **OPTS)
    first = (tmp_path / "fed" / "state" / "c0.state.npz").read_bytes()
    st = simulate(gp, tmp_path / "fed", 3, "aggregation", 1, **OPTS)
    assert load_state(tmp_path / "fed" / "state" / "c0.state.npz").round == 3 == st["c0"].round
    assert (tmp_path / "fed" / "state" / "c0.state.npz").read_bytes() != first
    assert (tmp_path / "fed" / "round_003" / "tgt.atoms.npz").is_file()

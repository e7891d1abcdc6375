"""Consensus M_ij(t) of gossip federations: closed forms and file handling."""

from __future__ import annotations

import numpy as np
import pytest

from fedalign.dadil.consensus import (collect_history, consensus_history, consensus_matrix,
                                      plot_consensus, weight_points)
from fedalign.errors import FedalignError
from fedalign.dadil.state import PublishedAtoms, save_atoms

A, K, D, C = 2, 3, 4, 2


pytestmark = pytest.mark.usefixtures("one_thread")


def atoms(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(A, K, D)) * 3, rng.uniform(0.5, 2, (A, K, D)),
            np.log(np.eye(C)[np.arange(K) % C] * 0.9 + 0.05)[None].repeat(A, 0))


def test_weight_points_vertices_then_simplex():
    W = weight_points(3, 8, seed=1)
    assert W.shape == (8, 3)
    np.testing.assert_array_equal(W[:3], np.eye(3))
    assert np.all(W >= 0) and np.allclose(W.sum(1), 1)
    np.testing.assert_array_equal(W, weight_points(3, 8, seed=1))
    assert weight_points(3, 2).shape == (2, 3)
    with pytest.raises(FedalignError):
        weight_points(3, 0)


def test_identical_and_permuted_dictionaries_agree():
    m, v, lg = atoms()
    perm = [2, 0, 1]
    _, M = consensus_matrix({"a": (m, v, lg), "b": (m[:, perm], v[:, perm], lg[:, perm])},
                            weight_points(A, 4))
    assert M.shape == (2, 2) and M[0, 1] < 1e-6
    # …while permuting the *atoms* is another dictionary: at the vertex e_0, B = atom 0, and
    # W2 ≥ the distance between the two atoms' means (a lower bound independent of the OT code)
    _, M2 = consensus_matrix({"a": (m, v, lg), "b": (m[::-1], v[::-1], lg[::-1])},
                             weight_points(A, 4))
    gap = np.linalg.norm(m[0].mean(0) - m[1].mean(0))
    assert gap > 0.5 and M2[0, 1] >= gap - 1e-9


def test_translated_dictionary_gives_the_shift():
    """Every barycenter of atoms shifted by δ is shifted by δ: M_ij = ‖δ‖ for all α."""
    m, v, lg = atoms(1)
    delta = np.array([0.3, -0.4, 1.2, 0.0])
    clients, M = consensus_matrix({"a": (m, v, lg), "b": (m + delta, v, lg), "c": (m, v, lg)},
                                  weight_points(A, 5))
    assert clients == ["a", "b", "c"]
    np.testing.assert_allclose(M[0, 1], np.linalg.norm(delta), rtol=1e-6)
    np.testing.assert_allclose(M[1, 2], np.linalg.norm(delta), rtol=1e-6)
    assert M[0, 2] < 1e-6 and np.allclose(M, M.T) and np.all(np.diag(M) == 0)


def write_federation(folder, rounds=3):
    m, v, lg = atoms(2)
    for t in range(rounds):
        (folder / f"round_{t:03d}").mkdir(parents=True)
        for i, c in enumerate(["x", "y"]):
            shift = (rounds - 1 - t) * (i + 1) * 0.5  # disagreement shrinks to 0
            save_atoms(folder / f"round_{t:03d}" / f"{c}.atoms.npz",
                       PublishedAtoms(m + shift, v, lg, t, c))


def test_history_from_files_and_plot(tmp_path):
    write_federation(tmp_path / "fed")
    h = consensus_history([tmp_path / "fed"], n_points=3)
    np.testing.assert_array_equal(h["rounds"], [0, 1, 2])
    assert h["clients"] == ["x", "y"]
    np.testing.assert_allclose(h["mean"], [2 * 0.5 * 1 * 2, 0.5 * 2, 0.0], atol=1e-6)
    assert np.all(np.diff(h["mean"]) < 0)
    h2 = consensus_history([tmp_path / "fed"], n_points=3, every=2)
    np.testing.assert_array_equal(h2["rounds"], [0, 2])
    png = plot_consensus({"run": h}, tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image as mpimg

    img = mpimg.imread(png)[..., :3]                     # the run's curves are drawn in C0
    assert (np.abs(img - np.array([0x1F, 0x77, 0xB4]) / 255).max(-1) < 0.03).sum() > 200


def test_history_errors(tmp_path):
    write_federation(tmp_path / "fed", 1)
    m, v, lg = atoms()
    save_atoms(tmp_path / "fed" / "dup.atoms.npz", PublishedAtoms(m, v, lg, 0, "x"))
    with pytest.raises(FedalignError, match="second atoms file"):
        collect_history([tmp_path / "fed"])
    with pytest.raises(FedalignError, match="no atoms files"):
        (tmp_path / "empty").mkdir()
        collect_history([tmp_path / "empty"])
    with pytest.raises(FedalignError, match="no such file"):
        collect_history([tmp_path / "nope"])

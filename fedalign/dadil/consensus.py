"""Consensus of a gossip federation: how far apart the clients' dictionaries still are.

Two clients i, j agree when their dictionaries generate the same measures for every choice of
barycentric weights. DeFed-GMM-DaDiL (Montesuma et al. 2025, eq. 4–6) measures the
disagreement at round t as

    M_ij(t) = max_{α ∈ Δ_A} W2( B(α; P^(i)(t)), B(α; P^(j)(t)) ),

approximated here by the maximum over L common weight vectors α_1..α_L: the A vertices of
the simplex (B(e_a) is atom a itself) followed by L − A points drawn from Dirichlet(1, …, 1)
with a fixed seed, the same for every pair and round. W2 between two barycenters is the
mixture-Wasserstein distance √MW2² (:mod:`fedalign.dadil.distances`, features only); barycenters
are the labeled GMM barycenters of :mod:`fedalign.dadil.barycenter`.

The history of a federation is read from its published atoms files (round and producer are
stored in each file), so any folder of ``*.atoms.npz`` files can be analysed afterwards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedalign.dadil.atoms import Atoms
from fedalign.dadil.barycenter import atoms_barycenter
from fedalign.dadil.distances import gmm_mw2
from fedalign.dadil.state import load_atoms
from fedalign.errors import FedalignError


def weight_points(n_atoms: int, n_points: int = 10, seed: int = 0) -> np.ndarray:
    """L common points of the simplex Δ_A: the vertices, then Dirichlet(1) draws. (L, A)."""
    A, L = int(n_atoms), int(n_points)
    if L < 1:
        raise FedalignError(f"n_points must be ≥ 1, got {n_points}")
    W = np.eye(A)[:L]
    if L > A:
        W = np.vstack([W, np.random.default_rng(seed).dirichlet(np.ones(A), size=L - A)])
    return W


def client_barycenters(means, variances, label_logits, W, *, tol: float = 1e-6,
                       max_iter: int = 50) -> list:
    """B(α_l; atoms) for every row α_l of W: list of :class:`~fedalign.gmm.GMM`."""
    atoms = Atoms(means, variances, label_logits)
    return [atoms_barycenter(atoms, w, tol=tol, max_iter=max_iter) for w in W]


def barycenter_distance(B1: list, B2: list) -> float:
    """max_l W2(B1[l], B2[l]) with W2 = √MW2² (features only)."""
    return float(max(np.sqrt(max(gmm_mw2(p, q, labeled=False), 0.0)) for p, q in zip(B1, B2)))


def consensus_matrix(atoms: dict, W) -> tuple[list, np.ndarray]:
    """M_ij for every pair of clients.

    Parameters
    ----------
    atoms : {client: (means (A, K, d), variances (A, K, d), label_logits (A, K, C))}
    W : (L, A) common weight vectors

    Returns
    -------
    clients (sorted), M (N, N) symmetric with zero diagonal.
    """
    clients = sorted(atoms)
    bary = {c: client_barycenters(*atoms[c], W) for c in clients}
    N = len(clients)
    M = np.zeros((N, N))
    for i in range(N):
        for j in range(i + 1, N):
            M[i, j] = M[j, i] = barycenter_distance(bary[clients[i]], bary[clients[j]])
    return clients, M


def collect_history(paths) -> dict:
    """Published atoms files (or folders searched recursively for ``*.atoms.npz``) grouped as
    {round: {producer: PublishedAtoms}}; two different files for one (round, producer) are an
    error."""
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.rglob("*.atoms.npz")))
        elif p.exists():
            files.append(p)
        else:
            raise FedalignError(f"no such file or folder: {p}")
    if not files:
        raise FedalignError(f"no atoms files found in {', '.join(map(str, paths))}")
    hist: dict = {}
    shape = None
    for f in files:
        pa = load_atoms(f)
        if shape is None:
            shape = (f, pa.shape)
        elif pa.shape != shape[1]:
            raise FedalignError(f"{f}: atoms shape (A, K, d, C)={pa.shape} differs from "
                                f"{shape[0]}'s {shape[1]}")
        if pa.producer in hist.setdefault(pa.round, {}):
            raise FedalignError(f"{f}: a second atoms file of {pa.producer} for round {pa.round}")
        hist[pa.round][pa.producer] = pa
    return dict(sorted(hist.items()))


def consensus_history(paths, n_points: int = 10, seed: int = 0, every: int = 1, *,
                      progress=None) -> dict:
    """M_ij(t) for the rounds of a federation (every ``every``-th round, and the last one).

    Returns
    -------
    dict with ``rounds`` (T,), ``clients`` (N,), ``M`` (T, N, N), ``mean`` and ``max`` (T,)
    over the pairs, and the weight points ``W`` (L, A).
    """
    hist = collect_history(paths)
    rounds = sorted(hist)
    every = max(1, int(every))
    keep = [t for i, t in enumerate(rounds) if i % every == 0 or t == rounds[-1]]
    A = next(iter(hist[rounds[0]].values())).shape[0]
    W = weight_points(A, n_points, seed)
    clients = sorted({c for t in keep for c in hist[t]})
    Ms = []
    for t in keep:
        if sorted(hist[t]) != clients:
            raise FedalignError(f"round {t} has atoms of {', '.join(sorted(hist[t]))}, "
                                f"expected {', '.join(clients)}")
        _, M = consensus_matrix({c: (p.means, p.variances, p.label_logits)
                                 for c, p in hist[t].items()}, W)
        Ms.append(M)
        if progress is not None:
            progress(1)
    Ms = np.stack(Ms)
    iu = np.triu_indices(len(clients), 1)
    pairs = Ms[:, iu[0], iu[1]] if len(clients) > 1 else np.zeros((len(keep), 1))
    return dict(rounds=np.array(keep), clients=clients, M=Ms, mean=pairs.mean(1),
                max=pairs.max(1), W=W)


#: y label of the consensus plot (what M(t) is, in words).
CONSENSUS_YLABEL = "M(t) = max over weights of W2 between two clients' barycenters"


def consensus_figure(runs: dict, title: str = "DeFed-GMM-DaDiL consensus"):
    """The consensus plot as an open matplotlib figure (see :func:`plot_consensus`).

    x: rounds with integer ticks (MaxNLocator(integer=True)); y: M(t), on a log scale when
    the positive values span more than two decades (symlog when some are 0).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    values = []
    for i, (name, h) in enumerate(runs.items()):
        col = f"C{i}"
        ax.plot(h["rounds"], h["mean"], color=col, marker=".", label=f"{name} (mean over pairs)")
        ax.plot(h["rounds"], h["max"], color=col, ls="--", lw=1, label=f"{name} (max)")
        values.extend(np.asarray(h["mean"], float).tolist() + np.asarray(h["max"], float).tolist())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(CONSENSUS_YLABEL, fontsize=8)
    v = np.asarray(values, dtype=np.float64)
    pos = v[np.isfinite(v) & (v > 0)]
    if len(pos) and pos.max() > 100 * pos.min():
        if np.any(v[np.isfinite(v)] <= 0):
            ax.set_yscale("symlog", linthresh=float(pos.min()))
        else:
            ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_consensus(runs: dict, path, title: str = "DeFed-GMM-DaDiL consensus") -> Path:
    """PNG of the mean (solid) and max (dashed) of M_ij(t) over pairs, one colour per run.

    ``runs`` maps a run name (e.g. ``replacement``) to a :func:`consensus_history` result.
    Rounds are integer ticks; y is log-scaled when M spans more than two decades.
    """
    import matplotlib.pyplot as plt

    from fedalign.files import atomic_output

    fig = consensus_figure(runs, title)
    path = Path(path)
    try:
        with atomic_output(path, suffix=".tmp.png") as tmp:
            fig.savefig(tmp, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return path

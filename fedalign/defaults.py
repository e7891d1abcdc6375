"""Default values the library and the CLI share, and the one check of a seed's range.

This module imports nothing but :mod:`fedalign.errors` (pure Python): the CLI declares its
options (``--tau``, ``--chunk-rows``, ``--threads``, ``--n-atoms``, ``--local-steps``) with
these defaults, and its help quotes the DaDiL presets' values, at ``fedalign --help`` time,
before any library module (numpy, h5py) is loaded; the library modules take the same names
(``align.DEFAULT_TAU``, ``files.DEFAULT_CHUNK_ROWS``, ``threads.DEFAULT_THREADS``,
``dadil.optim.PRESETS``). Every seed the library or a front end takes is checked against
:data:`MAX_SEED` by :func:`check_seed`, so the range has one wording.
"""

from __future__ import annotations

import operator

from fedalign.errors import FedalignError

#: Rows read or written per streamed chunk of a features file (memory ∝ CHUNK_ROWS · d).
CHUNK_ROWS = 8192
#: SLOT-Align geodesic time τ: the reference implementation's fixed-mode default.
TAU = 0.4
#: Atoms A of a DaDiL dictionary (DeFed-GMM-DaDiL and centralized GMM-DaDiL).
N_ATOMS = 3
#: Local steps E of a DeFed-GMM-DaDiL client per gossip round (``dadil-round``, the Flower app).
LOCAL_STEPS = 5
#: Largest seed of every seed option (``--seed``, ``--seeds``): numpy's legacy RandomState and
#: scikit-learn's ``random_state`` (GMM fits, PCA, t-SNE, heads) take 32-bit seeds.
MAX_SEED = 2**32 - 1
#: Relabelings of the DaDiL target's ``lda`` head by classification EM
#: (``fedalign.dadil.classification_em``): 0, the one-pass head. Refining it (e.g. 10) won on
#: the tuning set and lost on Amazon review and Digits' missing classes (stop 40).
CEM_ITER = 0
#: Threads of the commands that work on small matrices (DaDiL rounds, consensus, evaluation).
THREADS = 1
#: The DaDiL presets (``fedalign.dadil.optim.PRESETS``, whose comment says what they are):
#: the optimiser and its steps, the variance floor, how atoms start, and the step's decay.
DADIL_PRESETS = {
    "fedalign": dict(optimizer="gd", lr=0.2, alpha_rule="newton", lr_alpha=0.25,
                     var_floor_rel=1e-2, min_var=None, init="data", target_atoms=False,
                     lr_decay=0.02),
    "reference": dict(optimizer="adam", lr=0.1, alpha_rule="projected", lr_alpha=0.1,
                      var_floor_rel=None, min_var=0.05, init="normal", target_atoms=True,
                      lr_decay=0.0),
}


def check_seed(seed, name: str = "seed", param: str | None = None) -> int:
    """``seed`` as an int, refused unless it is an integer in [0, :data:`MAX_SEED`].

    Parameters
    ----------
    seed : the value given (an int or a numpy integer; a bool, a float or text is refused)
    name : what the message calls it, its first words: ``"seed"``, ``"--seeds: each seed"``,
        ``"run config gmm-seed"``
    param : the library parameter the error is about (:class:`fedalign.errors.FedalignError`)

    Returns
    -------
    the seed as an int
    """
    try:
        value = None if isinstance(seed, bool) else operator.index(seed)
    except TypeError:
        value = None
    if value is None or not 0 <= value <= MAX_SEED:
        shown = repr(seed) if value is None else value
        raise FedalignError(f"{name} must be an integer in [0, 2**32 − 1 = {MAX_SEED}] "
                            f"(numpy's legacy generators and scikit-learn take 32-bit seeds), "
                            f"got {shown}", param=param)
    return value

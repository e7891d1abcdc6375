"""Default values the library and the CLI share.

This module imports nothing: the CLI declares its options (``--tau``, ``--chunk-rows``,
``--threads``, ``--n-atoms``, ``--local-steps``) with these defaults, and its help quotes the
DaDiL presets' values, at ``fedalign --help`` time, before any library module (numpy, h5py)
is loaded; the library modules take the same names (``align.DEFAULT_TAU``,
``files.DEFAULT_CHUNK_ROWS``, ``threads.DEFAULT_THREADS``, ``dadil.optim.PRESETS``).
"""

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

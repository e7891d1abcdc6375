"""Default values the library and the CLI share.

This module imports nothing: the CLI declares its options (``--tau``, ``--chunk-rows``,
``--threads``, ``--n-atoms``, ``--local-steps``) with these defaults at ``fedalign --help``
time, before any library module (numpy, h5py) is loaded; the library modules take the same names (``align.DEFAULT_TAU``,
``files.DEFAULT_CHUNK_ROWS``, ``threads.DEFAULT_THREADS``).
"""

#: Rows read or written per streamed chunk of a features file (memory ∝ CHUNK_ROWS · d).
CHUNK_ROWS = 8192
#: SLOT-Align geodesic time τ: the reference implementation's fixed-mode default.
TAU = 0.4
#: Atoms A of a DaDiL dictionary (DeFed-GMM-DaDiL and centralized GMM-DaDiL).
N_ATOMS = 3
#: Local steps E of a DeFed-GMM-DaDiL client per gossip round (``dadil-round``, the Flower app).
LOCAL_STEPS = 5
#: Threads of the commands that work on small matrices (DaDiL rounds, consensus, evaluation).
THREADS = 1

"""DeFed-GMM-DaDiL: decentralized GMM dataset-dictionary learning, one module per concept.

Rooms (each imports only the ones above it, plus :mod:`fedalign.errors`, :mod:`fedalign.files`,
:mod:`fedalign.gmm`, :mod:`fedalign.metrics`, :mod:`fedalign.threads` and FedCGS of
:mod:`fedalign.heads`; see
``docs/architecture.md``):

- :mod:`~fedalign.dadil.distances`   MW2² / SMW2² between diagonal GMMs (exact OT plans)
- :mod:`~fedalign.dadil.barycenter`  the labeled GMM barycenter B(α; atoms) and its one builder
- :mod:`~fedalign.dadil.atoms`       dictionary atoms, their seeded starts, the simplex
- :mod:`~fedalign.dadil.gradients`   a domain's loss and its closed-form gradients (plans frozen)
- :mod:`~fedalign.dadil.optim`       presets, the preconditioned step, Adam, the α rules
- :mod:`~fedalign.dadil.dictionary`  local steps, α alone, centralized GMM-DaDiL
- :mod:`~fedalign.dadil.rng`         a client's seeded generators and their serialisation
- :mod:`~fedalign.dadil.state`       a client's private state, published atoms, their files
- :mod:`~fedalign.dadil.gossip`      one gossip round (Algorithm 1), in memory and from files
- :mod:`~fedalign.dadil.simulation`  many clients × rounds in one process, the same files
- :mod:`~fedalign.dadil.consensus`   consensus curves M_ij(t) of a federation
- :mod:`~fedalign.dadil.classification_em` the ``lda`` head's pseudo-labels refined by the LDA
- :mod:`~fedalign.dadil.target_head` the target's ``lda`` head on its own pseudo-labeled rows
- :mod:`~fedalign.dadil.classifiers` heads on labeled GMMs and the baselines
- :mod:`~fedalign.dadil.evaluation`  one target domain, every method; ``evaluate -m dadil``
- :mod:`~fedalign.dadil.envelope`    the barycentric-envelope study of a fixed dictionary

The names below are the public API, re-exported from those modules. Everything is numpy:
importing this package never imports torch.
"""

from fedalign.dadil.atoms import Atoms, data_moments, init_atoms, project_simplex
from fedalign.dadil.barycenter import LabeledBarycenter, atoms_barycenter, labeled_barycenter
from fedalign.dadil.classifiers import (CLASSIFIERS, accuracy, centralized_barycenter,
                                        gmm_classifier, oracle_classifier,
                                        source_only_classifier, target_classifier)
from fedalign.dadil.consensus import consensus_history, plot_consensus
from fedalign.dadil.dictionary import (AlphaFit, LearnedDictionary, LocalSteps, fit_alpha,
                                       learn_dictionary, local_steps)
from fedalign.dadil.distances import gmm_mw2, mw2
from fedalign.dadil.envelope import envelope_study, load_dictionary
from fedalign.dadil.evaluation import (TargetResult, evaluate_dadil, evaluate_target,
                                       evaluate_target_files, target_report)
from fedalign.dadil.gossip import (N_PEERS, STRATEGIES, choose_peers, gossip_round, init_files,
                                   round_files)
from fedalign.dadil.optim import PRESETS, Optim
from fedalign.dadil.simulation import federation_paths, simulate
from fedalign.dadil.state import (ClientState, PublishedAtoms, check_client_id, client_barycenter,
                                  init_client, load_atoms, load_state, rng_from_array,
                                  rng_to_array, save_atoms, save_state)
from fedalign.threads import limit_threads

__all__ = [
    "AlphaFit", "Atoms", "CLASSIFIERS", "ClientState", "LabeledBarycenter", "LearnedDictionary",
    "LocalSteps", "N_PEERS", "Optim", "PRESETS",
    "PublishedAtoms", "STRATEGIES", "TargetResult", "accuracy", "atoms_barycenter",
    "centralized_barycenter", "check_client_id", "choose_peers", "client_barycenter",
    "consensus_history", "data_moments", "envelope_study", "evaluate_dadil", "evaluate_target",
    "evaluate_target_files", "federation_paths", "fit_alpha", "gmm_classifier", "gmm_mw2",
    "gossip_round", "init_atoms", "init_client", "init_files", "labeled_barycenter",
    "learn_dictionary", "limit_threads", "load_atoms", "load_dictionary", "load_state",
    "local_steps", "mw2", "oracle_classifier", "plot_consensus", "project_simplex",
    "rng_from_array", "rng_to_array", "round_files", "save_atoms", "save_state", "simulate",
    "source_only_classifier", "target_classifier", "target_report",
]

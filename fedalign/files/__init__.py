"""Every file kind fedalign reads or writes: definition, version, writer, validating reader.

One home for every file kind. Each file carries a ``kind`` and a ``format_version``; readers
reject wrong kinds, wrong versions, missing arrays, shape mismatches and NaN/Inf with a
:class:`~fedalign.errors.FedalignError` (one readable line, exit code 2 in the CLI).

File kinds
----------
========== ====== =====================================================================
kind       format what it holds (and what may leave a client)
========== ====== =====================================================================
features   .h5    ``features`` (n, d) float32, ``labels`` (n,) int64 (-1 = unlabeled),
                  ``ids`` (n,) str; attrs ``class_names``, ``provenance``. Private.
stats      .npz   n, mean (d,), Ledoit–Wolf covariance (d, d), shrinkage, raw moment sums
                  around a shift; optional class counts / sums. Aggregates only, shareable.
                  format_version 1 (default) or 2 (``stats --compact``/``--dtype float32``:
                  covariance and Σyyᵀ stored once, upper triangle, float64 or float32).
                  A DP release (meta ``dp``: :mod:`fedalign.dp`) holds the noisy count, Σx
                  and Σxxᵀ (shift 0), no fourth-moment sums, and a post-processed covariance.
reference  .npz   Bures–Wasserstein barycenter: mean (d,), covariance (d, d), weights,
                  convergence record. Sent by the server to every client.
map        .npz   a client's affine OT map to the reference: A (d, d), b (d,). Private.
gmm        .npz   diagonal GMM: weights (K,), means (K, d), variances (K, d),
                  optional labels (K, C). Private to its client.
atoms      .npz   a client's dictionary atoms after a gossip round: means (A, K, d),
                  variances (A, K, d), label logits (A, K, C), round; meta: producer
                  (client id). Nothing else (no α, no GMM, no sample). Published to peers.
state      .npz   a DaDiL client's private state (atoms, barycentric weights, Adam
                  moments, PCG64 RNG state, round; meta: client id, GMM path + sha256,
                  settings). Never published.
report     .json  evaluation results (accuracy tables).
========== ====== =====================================================================

Features files written by other tools are read in their natural h5py forms (class names as
an array of strings or bytes, integer ids, int32 labels, float64 features) or refused with
one line naming the attribute and the expected form: ``docs/features-format.md``.
Covariances (stats, reference) and map matrices A must be symmetric (to
:data:`~fedalign.linalg.SYMMETRY_RTOL`) and positive definite
(:func:`fedalign.linalg.check_spd`); labels must lie in [-1, C) when class names are given.

Modules
-------
- :mod:`fedalign.files.outputs` — no output over an input, outputs checked before any work,
  the temporaries killed runs left; an input's lock and SHA-256;
- :mod:`fedalign.files.transactions` — all of a command's outputs or none
  (:class:`Transaction`, :func:`atomic_outputs`, :func:`atomic_output`, :func:`staging_folder`
  and :func:`move_in`, :func:`after_commit`);
- :mod:`fedalign.files.schemas` — the ``.npz`` kinds and their validation;
- :mod:`fedalign.files.npz` — the ``.npz`` codec (:func:`write_npz`, :func:`read_npz`,
  :func:`npz_header`, packed symmetric matrices);
- :mod:`fedalign.files.features` — the features ``.h5`` reader and writer;
- :mod:`fedalign.files.reports` — JSON reports.

Every name is importable from here. A test that replaces a function (the commit seam
``_before_commit``) replaces it in the module that calls it (``fedalign.files.transactions``).
"""

from fedalign.files.features import (DEFAULT_CHUNK_ROWS, FEATURES_KIND, FEATURES_VERSION,
                                     MAX_CLASSES, FeatureFile, FeatureWriter, open_features,
                                     read_features, write_features)
from fedalign.files.npz import (_KIND_KEY, _META_KEY, _VERSION_KEY, npz_bytes, npz_header,
                                pack_symmetric, read_npz, unpack_symmetric, write_npz)
from fedalign.files.outputs import (TMP_MARK, check_distinct, check_output_file,
                                    check_output_folder, check_outputs, locked, remove_stale,
                                    same_file, sha256_file)
from fedalign.files.reports import (REPORT_KIND, REPORT_VERSION, read_report, report_accuracies,
                                    write_report)
from fedalign.files.schemas import (MAX_INTEGER, MAX_MAGNITUDE, META_TYPES, PACKED_DTYPES, SCHEMAS, VERSIONS,
                                    Schema)
from fedalign.files.transactions import (Transaction, after_commit, atomic_output, atomic_outputs,
                                         make_output_folder, move_in, staging_folder)
from fedalign.linalg import SYMMETRY_RTOL, check_spd

__all__ = [
    # outputs and transactions
    "TMP_MARK", "Transaction", "after_commit", "atomic_output", "atomic_outputs",
    "check_distinct", "check_output_file", "check_output_folder", "check_outputs", "locked",
    "make_output_folder", "move_in", "remove_stale", "same_file", "sha256_file",
    "staging_folder",
    # .npz kinds
    "MAX_INTEGER", "MAX_MAGNITUDE", "META_TYPES", "PACKED_DTYPES", "SCHEMAS", "SYMMETRY_RTOL", "Schema",
    "VERSIONS", "check_spd", "npz_bytes", "npz_header", "pack_symmetric", "read_npz",
    "unpack_symmetric", "write_npz",
    # features
    "DEFAULT_CHUNK_ROWS", "FEATURES_KIND", "FEATURES_VERSION", "MAX_CLASSES", "FeatureFile",
    "FeatureWriter", "open_features", "read_features", "write_features",
    # reports
    "REPORT_KIND", "REPORT_VERSION", "read_report", "report_accuracies", "write_report",
]

"""The barycentric envelope of a fixed dictionary: how well can it express a target?

A dictionary P = (P_1, …, P_A) of labeled GMM atoms spans its *barycentric envelope*
{B(α; P) : α ∈ Δ_A}, the labeled GMM barycenters of the atoms
(:mod:`fedalign.dadil.barycenter`).
The study of Montesuma et al. (GMM-DaDiL, Section 5.2 and Table 3; used for DeFed-GMM-DaDiL as
well) takes the atoms of ONE source client, learned without the target, keeps them fixed and
fits the target's barycentric weights alone,

    α_T = argmin_{α ∈ Δ_A} MW2²(Q_T, B(α; P))          (atoms fixed; projection onto Δ_A)

(:func:`fedalign.dadil.dictionary.fit_alpha`), on (a) the GMM Q_T of the full target data and
(b) a *reduced* GMM fitted after some classes were removed from the target data. It reports

- α_T, and the fit record (loss and α per step);
- the reconstruction loss MW2²(Q_T, B(α_T; P)) = min_π Σ_ij π_ij (‖m_i − mᴮ_j‖² +
  ‖√v_i − √vᴮ_j‖²), features only (:func:`fedalign.dadil.distances.gmm_mw2`), recomputed
  from α_T;
- the accuracy on the target's labelled test features of a classifier built from B(α_T; P):
  a linear head trained on ``n_per_class`` samples per class of B(α_T; P) (one per seed) and/or
  the MAP rule, overall, per class, and on the missing / present classes.

Because the atoms carry labels for every class, B(α_T; P) contains all classes even when Q_T
lacks some: a small loss and a high accuracy on the missing classes say that the target lies
(close to) inside the envelope, so its missing classes are reconstructed from the sources.

References
----------
E. F. Montesuma, F. M. N. Mboula, A. Souloumiac, "Lighter, Better, Faster Multi-Source Domain
Adaptation with Gaussian Mixture Models and Optimal Transport", ECML-PKDD 2024.
R. Clain, E. F. Montesuma, F. M. N. Mboula, "Decentralized Federated Dataset Dictionary
Learning for Multi-Source Domain Adaptation", ICASSP 2025.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedalign.dadil import dictionary
from fedalign.dadil.atoms import Atoms
from fedalign.dadil.barycenter import atoms_barycenter
from fedalign.dadil.classifiers import CLASSIFIERS, gmm_classifier
from fedalign.dadil.distances import gmm_mw2
from fedalign.dadil.state import load_atoms, load_state
from fedalign.errors import FedalignError
from fedalign.files import _KIND_KEY, read_report, sha256_file
from fedalign.results import mean_std


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _npz_kind(path) -> str | None:
    """The ``kind`` stored in a fedalign ``.npz`` file, or None when it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return str(z[_KIND_KEY]) if _KIND_KEY in z.files else None
    except Exception:  # not an npz: the validating reader below says why
        return None


def load_dictionary(path) -> tuple:
    """Atoms from a published ``atoms`` file or a client's ``state`` file.

    Returns
    -------
    atoms : :class:`fedalign.dadil.atoms.Atoms`
    source : dict with ``path``, ``sha256``, ``kind`` (atoms | state), ``client``, ``round``
        and, for a state, ``alpha`` (its own weights) and ``role``
    """
    path = Path(path)
    if _npz_kind(path) == "state":
        st = load_state(path)
        atoms = Atoms(st.means, st.variances, st.label_logits)
        src = dict(kind="state", client=st.client, round=int(st.round),
                   alpha=[float(a) for a in st.alpha], role=st.settings.get("role"))
    else:
        pa = load_atoms(path)   # also the error for anything that is neither
        atoms = Atoms(pa.means, pa.variances, pa.label_logits)
        src = dict(kind="atoms", client=pa.producer, round=int(pa.round))
    return atoms, dict(path=str(path), sha256=sha256_file(path), **src)


def check_target_gmm(atoms, gmm, name: str = "target") -> None:
    """The GMM must be non-empty and have the atoms' dimension d (and class count C if known)."""
    if gmm.K < 1:
        raise FedalignError(f"GMM {name!r} has no components")
    if gmm.d != atoms.d:
        raise FedalignError(f"GMM {name!r} has dimension d={gmm.d}, the atoms have d={atoms.d}")
    if gmm.n_classes is not None and gmm.n_classes != atoms.n_classes:
        raise FedalignError(f"GMM {name!r} has {gmm.n_classes} classes, the atoms have "
                            f"C={atoms.n_classes}")


def check_test(atoms, X, y, class_names=None, where: str = "test features") -> tuple:
    """Labelled test features for the atoms: (X (n, d) float64, y (n,) int64), rows y ≥ 0 only."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).astype(np.int64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise FedalignError(f"{where}: features {X.shape} and labels {y.shape} disagree")
    if X.shape[1] != atoms.d:
        raise FedalignError(f"{where}: the features have dimension d={X.shape[1]}, the atoms "
                            f"d={atoms.d}")
    if class_names and len(class_names) != atoms.n_classes:
        raise FedalignError(f"{where}: {len(class_names)} classes, the atoms have "
                            f"C={atoms.n_classes}")
    keep = y >= 0
    if not keep.any():
        raise FedalignError(f"{where}: no labelled rows (every label is -1): cannot measure "
                            "accuracy")
    if y[keep].max() >= atoms.n_classes:
        raise FedalignError(f"{where}: label {int(y[keep].max())}, but the atoms have "
                            f"C={atoms.n_classes} classes")
    if not np.all(np.isfinite(X[keep])):
        raise FedalignError(f"{where} contain NaN or Inf")
    return X[keep], y[keep]


def parse_classes(spec, class_names=(), n_classes: int | None = None) -> list:
    """``"3,7"`` (indices) or ``"bike,mug"`` (class names) → sorted unique class indices."""
    names = [str(c) for c in class_names or ()]
    out = []
    for tok in filter(None, (t.strip() for t in str(spec).split(","))):
        if tok.lstrip("-").isdigit():
            c = int(tok)
        elif tok in names:
            c = names.index(tok)
        else:
            raise FedalignError(f"unknown class {tok!r}" + (f" (classes: {', '.join(names)})"
                                                             if names else " (give indices)"))
        if c < 0 or (n_classes is not None and c >= n_classes):
            raise FedalignError(f"class {c} out of range for {n_classes} classes")
        out.append(c)
    return sorted(set(out))


# --------------------------------------------------------------------------------------------
# The study
# --------------------------------------------------------------------------------------------


def barycenter(atoms, alpha):
    """B(α; atoms) as a labeled :class:`~fedalign.gmm.GMM` (K uniform components,
    :func:`fedalign.dadil.barycenter.atoms_barycenter`)."""
    return atoms_barycenter(atoms, np.asarray(alpha, dtype=np.float64))


def reconstruction_loss(atoms, gmm, alpha) -> float:
    """MW2²(Q, B(α; atoms)), features only (no label term)."""
    return float(gmm_mw2(gmm, barycenter(atoms, alpha), labeled=False))


def _subset_accuracy(preds, y, classes):
    """Mean over seeds of the accuracy on the rows whose class is in ``classes`` (None if none)."""
    sel = np.isin(y, list(classes))
    if not sel.any():
        return None
    return float(np.mean([np.mean(p[sel] == y[sel]) for p in preds]))


def _head_scores(B, X, y, classifier, n_per_class, seeds, C, missing, names) -> dict:
    preds = []
    for s in seeds:
        preds.append(np.asarray(gmm_classifier(B, classifier, int(n_per_class), int(s))(X)))
    per_seed = [float(np.mean(p == y)) for p in preds]
    per_class = []
    for c in range(C):
        n = int((y == c).sum())
        per_class.append({"class": c, "name": names[c] if names else str(c), "n": n,
                          "accuracy": _subset_accuracy(preds, y, [c])})
    res = dict(per_seed=per_seed, **mean_std(per_seed), per_class=per_class)
    if missing is not None:
        present = [c for c in range(C) if c not in missing]
        res["missing_classes"] = _subset_accuracy(preds, y, missing)
        res["present_classes"] = _subset_accuracy(preds, y, present)
    return res


def _gmm_classes(gmm):
    """Classes that own a component of a labeled GMM (None when unlabeled)."""
    return None if gmm.labels is None else sorted({int(c) for c in gmm.labels.argmax(1)})


def envelope_study(atoms, target_gmms: dict, X_test, y_test, *, classifiers=CLASSIFIERS,
                   n_per_class: int = 500, seeds=(0,), n_steps: int = 100,
                   labeled: bool | None = False, rule: str = "projected", tol: float = 1e-9,
                   missing: dict | None = None, class_names=None) -> dict:
    """Fit α_T alone on each target GMM with the atoms fixed; loss and accuracy of B(α_T).

    Parameters
    ----------
    atoms : :class:`fedalign.dadil.atoms.Atoms` (A, K, d, C), kept fixed
    target_gmms : {name: :class:`~fedalign.gmm.GMM`}, e.g. ``{"full": Q_T, "reduced": Q_T'}``
    X_test : (n, d) the target's labelled test features; y_test : (n,) labels (−1 rows ignored)
    classifiers : subset of ("linear", "map"): head on samples of B(α_T) / MAP rule
    n_per_class : samples per class of B(α_T) for the linear head
    seeds : sampling seeds of the linear head (the α fit is deterministic)
    n_steps, rule, tol : :func:`fedalign.dadil.dictionary.fit_alpha` controls
    labeled : fit on SMW2² with the target GMM's labels (oracle) if True; MW2² (as the
        unlabeled target would) if False (default); None: whether the GMM has labels
    missing : optional {name: [class indices removed from that GMM's data]}; a labeled GMM
        defaults to the classes owning none of its components
    class_names : optional C names (reported with the per-class accuracies)

    Returns
    -------
    dict (JSON-serialisable): ``atoms`` (A, K, d, C), ``settings``, and ``targets``
    {name: {gmm (K, labeled, classes), alpha (A,), loss = MW2²(Q, B(α)), fit (losses,
    alphas, iterations, converged), missing_classes, accuracy {head: per_seed, mean, std,
    per_class, missing_classes, present_classes}}}.
    """
    if not target_gmms:
        raise FedalignError("give at least one target GMM")
    classifiers = list(dict.fromkeys(classifiers))
    bad = [c for c in classifiers if c not in CLASSIFIERS]
    if bad or not classifiers:
        raise FedalignError(f"classifier must be one of {', '.join(CLASSIFIERS)}, got "
                            f"{bad[0] if bad else 'none'!r}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise FedalignError("give at least one seed")
    if int(n_steps) < 1:
        raise FedalignError(f"n_steps must be ≥ 1, got {n_steps}")
    if int(n_per_class) < 1:
        raise FedalignError(f"n_per_class must be ≥ 1, got {n_per_class}", param="n_per_class")
    missing = dict(missing or {})
    unknown = set(missing) - set(target_gmms)
    if unknown:
        raise FedalignError(f"missing classes given for unknown GMM {sorted(unknown)[0]!r}")
    C = atoms.n_classes
    for name, g in target_gmms.items():
        check_target_gmm(atoms, g, name)
        use = g.labels is not None if labeled is None else bool(labeled)
        if use and g.labels is None:
            raise FedalignError(f"GMM {name!r} has no labels: cannot fit α on SMW2²")
        for c in missing.get(name, []):
            if not 0 <= int(c) < C:
                raise FedalignError(f"missing class {c} of GMM {name!r} out of range for C={C}")
    X, y = check_test(atoms, X_test, y_test, class_names)
    targets = {}
    for name, g in target_gmms.items():
        use = g.labels is not None if labeled is None else bool(labeled)
        fit = dictionary.fit_alpha(atoms, g, n_steps=int(n_steps), labeled=use, rule=rule,
                                   tol=float(tol))
        alpha = np.asarray(fit.alpha, dtype=np.float64)
        present = _gmm_classes(g)
        miss = missing.get(name)
        if miss is None and present is not None:
            miss = [c for c in range(C) if c not in present]
        miss = None if miss is None else sorted({int(c) for c in miss})
        B = barycenter(atoms, alpha)
        targets[name] = dict(
            gmm=dict(K=g.K, labeled=g.labels is not None, classes=present),
            alpha=[float(a) for a in alpha],
            loss=reconstruction_loss(atoms, g, alpha),
            fit=dict(labeled=use, iterations=int(fit.iterations), converged=bool(fit.converged),
                     losses=[float(v) for v in fit.losses],
                     alphas=[[float(a) for a in row] for row in fit.alphas]),
            missing_classes=miss,
            accuracy={clf: _head_scores(B, X, y, clf, n_per_class, seeds, C, miss, class_names)
                      for clf in classifiers})
    return dict(atoms=dict(zip(("A", "K", "d", "C"), (atoms.n_atoms, atoms.n_components,
                                                      atoms.d, C))),
                settings=dict(n_steps=int(n_steps), rule=rule, tol=float(tol),
                              labeled=labeled, classifiers=classifiers,
                              n_per_class=int(n_per_class), seeds=seeds),
                class_names=[str(c) for c in class_names] if class_names else None,
                n_test=int(len(y)), targets=targets)


# --------------------------------------------------------------------------------------------
# α from the command line or from a dadil-envelope report
# --------------------------------------------------------------------------------------------


def check_alpha(alpha, n_atoms: int, where: str = "α") -> np.ndarray:
    """α must be A finite weights in the simplex (≥ 0, summing to 1 within 1e-6)."""
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if a.shape != (int(n_atoms),):
        raise FedalignError(f"{where} has {a.size} weights, the atoms are {n_atoms}")
    if not np.all(np.isfinite(a)) or np.any(a < 0) or abs(a.sum() - 1.0) > 1e-6:
        raise FedalignError(f"{where} must be non-negative weights summing to 1, got "
                            f"{', '.join(f'{v:g}' for v in a)}")
    return a


def read_alpha(spec: str, n_atoms: int, atoms_sha256: str | None = None) -> tuple:
    """α from ``"0.2,0.5,0.3"`` or from a dadil-envelope report ``"REPORT.json[:NAME]"``.

    Parameters
    ----------
    spec : the weights, or the report path with the name of the target GMM whose fitted α
        to use (optional when the report holds one)
    n_atoms : A
    atoms_sha256 : the dictionary file's hash; a report fitted on other atoms is an error

    Returns
    -------
    alpha (A,), and a dict with ``source`` (the spec) and ``missing_classes`` (from the
    report, else None)
    """
    spec = str(spec).strip()
    path, sep, name = spec.rpartition(":")
    if not (sep and path.endswith(".json")):
        path, name = (spec, "") if spec.endswith(".json") else ("", "")
    if not path:
        try:
            vals = [float(t) for t in spec.split(",") if t.strip()]
        except ValueError:
            raise FedalignError(f"alpha: expected weights like 0.2,0.5,0.3 or "
                                f"REPORT.json[:NAME], got {spec!r}") from None
        return check_alpha(vals, n_atoms, "alpha"), dict(source=spec, missing_classes=None)
    rep = read_report(path)
    if rep.get("producer") != "fedalign dadil-envelope" or not rep.get("targets"):
        raise FedalignError(f"{path}: not a dadil-envelope report")
    targets = rep["targets"]
    if not name:
        if len(targets) != 1:
            raise FedalignError(f"{path} holds several fitted α ({', '.join(targets)}): "
                                f"give {path}:NAME")
        name = next(iter(targets))
    if name not in targets:
        raise FedalignError(f"{path}: no target GMM {name!r} (has {', '.join(targets)})")
    sha = (rep.get("source") or {}).get("sha256")
    if atoms_sha256 is not None and sha and sha != atoms_sha256:
        raise FedalignError(f"{path}: its α was fitted on other atoms ({sha[:12]}…), not on "
                            f"the given dictionary ({atoms_sha256[:12]}…)")
    alpha = check_alpha(targets[name]["alpha"], n_atoms, f"{path}:{name} α")
    return alpha, dict(source=f"{path}:{name}",
                       missing_classes=targets[name].get("missing_classes"))

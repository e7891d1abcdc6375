"""Variants of the ``lda`` head's pseudo-labels, scored on a tuning set the tables do not report.

The ``lda`` head (:mod:`fedalign.dadil.target_head`) labels the target's adaptation rows with
B(α_T)'s MAP rule and fits the LDA of their and the sources' class statistics. With classes
missing from the target it lost 3.7 points (aggregation) from 0 to 45 % removed on Digits usps
at stop 39. This script compares ways of making the pseudo-labels, on the missing-class jobs
(0/15/30/45 % removed) of targets whose missing-class study RESULTS.md does not report — the
tuning set of stop 39: Digits mnist; Office-Caltech10 amazon and caltech10 — from the same
DeFed barycenters (the job's kept states):

- ``hard`` — one pass: the MAP labels (the library's default, ``cem_iter = 0``);
- ``soft`` — class statistics weighted by B(α_T)'s class posteriors;
- ``prior`` — MAP labels after Saerens' EM re-estimates the target's class priors;
- ``soft+prior`` — both;
- ``poe`` — MAP labels of the product of B(α_T)'s posterior and the sources-only LDA's;
- ``cem1`` — one relabeling by the LDA (classification EM, ``cem_iter = 1``);
- ``cem`` — classification EM until no label changes (≤ 10,
  :func:`fedalign.dadil.classification_em.cem_lda`; ``cem_iter = 10``);
- ``shift`` (stop 41) — every source's statistics moved by the shift of the classes the target
  holds: δ_k = Σ_c n_c (μ̂_c − μ_{k,c}) / Σ_c n_c, n_c the target's pseudo-label counts, μ̂_c
  its pseudo-labeled class means, μ_{k,c} source k's (classes source k holds); then the one
  pass. A class the target lacks keeps source k's statistics, moved by δ_k, instead of staying
  where the sources put it;
- ``shift-pooled`` (stop 41) — the same with one δ from the pooled sources' class means;
- ``weighted`` (stop 41, formed after ``shift`` had been seen) — every source's statistics
  weighted by how well it describes the target: w_k ∝ a_k, the fraction of the target's rows
  on which source k's own LDA (the chosen shrinkage) agrees with B(α_T)'s MAP labels, scaled to
  mean 1 (counts, sums and second moments × w_k); then the one pass. A class the target lacks
  then comes mostly from the sources closest to it;
- ``bary`` (stop 43) — the one pass plus one more message: B(α_T)'s own class moments
  (:func:`barycenter_statistics`, as many rows as the target has, spread by B's class masses),
  so that a class the target lacks also has the dictionary's reconstruction of it, not only
  the sources' statistics;
- ``iso`` (stop 42) — the sources' statistics from an isotropic map onto the target's completed
  reference, x ↦ μ_ref + (tr Σ_ref / tr Σ_k)^{1/2} (x − μ_k), instead of the Ledoit–Wolf map
  (the dictionary and the pseudo-labels unchanged), the LDA's shrinkage chosen again on them;

and, as diagnostics that are not candidates, ``true+shift``, ``true+weighted`` and ``true+bary``
(with the true labels) and ``true+iso``, ``true`` (the target's true labels: a ceiling of
any pseudo-labeling), ``sources`` and ``iso-sources`` (no target row) and ``src-labels`` (pseudo-labels by the
sources-only LDA, no dictionary). No head reads a target label except ``true``; only the
comparison does, on targets the tables do not report.

The criterion, fixed before any variant was scored: adopt a variant over ``hard`` if (i)
mnist's mean loss from 0 to 45 % falls by ≥ 1.0 point and (ii) no tuning target's mean accuracy
(every m, both strategies) falls by more than 0.3. ``soft``, ``prior`` and ``soft+prior`` were
scored first; ``poe``, ``cem1`` and ``cem`` were formed after those had been seen. Stop 41's
``shift``, ``shift-pooled`` and ``weighted`` were scored against the same criterion.

    python tune_lda_head.py --features FEATS/digits --domains mnist,usps,mnistm \\
        --targets mnist --out WORK/tune-lda/digits
    python tune_lda_head.py --features FEATS/office_caltech10 \\
        --domains amazon,caltech10,dslr,webcam --targets amazon,caltech10 --out WORK/tune-lda/office

Stop 40's figures (seeds 0–2, both strategies; mean accuracy %, loss 0 → 45 %): mnist hard
79.5 / 3.2, soft 79.6 / 2.6, prior 79.5 / 3.2, soft+prior 79.3 / 3.3, poe 79.8 / 1.7, cem1
80.8 / 1.9, cem 81.0 / 1.3, true 86.1 / 3.5; amazon hard 94.16, cem 94.25; caltech10 hard
91.39, soft 91.56, poe 90.76, cem1 91.07, cem 91.09 (−0.30: inside (ii)). ``cem`` met the
criterion; on the reported targets it then lost (Amazon review −1.0, Digits' missing-class loss
+3.5 / +1.2) and the default stayed ``hard`` (RESULTS.md, "How the defaults were chosen").

Stop 41's figures (same jobs): mnist shift 79.3 / 3.4, shift-pooled 79.3 / 3.4, weighted
79.3 / 3.0, true+shift 86.1 / 3.3, true+weighted 85.8 / 4.7; amazon 94.14, 94.14, 94.16;
caltech10 91.80, 91.78, 91.44 — none meets (i): moving the sources by the present classes'
shift, or weighting them by how well they describe the target, leaves the loss where it was.

Stop 42's figures (mnist only; its criterion in RESULTS.md: the mean may not fall by more than
0.3, the loss not grow by more than 0.5): iso 78.83 / 6.17, true+iso 86.04 / 9.17, iso-sources
77.96 / 0.50 against hard 79.46 / 3.17 — not adopted.

Stop 43's figures (mnist first, as written before any score: the Office targets only if (i)
held): bary 79.50 / 2.75 against hard 79.46 / 3.17 (the loss falls by 0.42: (i) fails);
true+bary 84.94 / 4.00 against true 86.08 / 3.50 — not adopted.
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import run_lodo

VARIANTS = ("hard", "soft", "prior", "soft+prior", "poe", "cem1", "cem", "shift", "shift-pooled",
            "weighted", "iso", "bary")
DIAGNOSTICS = ("true", "true+shift", "true+weighted", "true+iso", "true+bary", "sources",
               "iso-sources", "src-labels")


def run_job_kept(a, T: str, seed: int, m: float) -> tuple:
    """The reproduction's missing-class job (its result cached as JSON, its states kept)."""
    name = f"missing_{T}_s{seed}_m{int(round(100 * m)):02d}"
    path = Path(a.out) / "results" / f"{name}.json"
    if not path.exists():
        res = run_lodo.run_job(a, dict(kind="missing", target=T, seed=seed, missing=m, name=name))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, default=run_lodo._jsonable))
        tmp.replace(path)
    return name, json.loads(path.read_text())


def em_priors(P, prior0, iters: int = 200, tol: float = 1e-8):
    """Saerens' EM: posteriors P (n, C) under priors prior0 → re-weighted posteriors, priors."""
    pi = prior0.copy()
    for _ in range(iters):
        Q = P * (pi / np.maximum(prior0, 1e-12))
        Q /= Q.sum(1, keepdims=True)
        new, done = Q.mean(0), np.abs(Q.mean(0) - pi).max() < tol
        pi = new
        if done:
            break
    Q = P * (pi / np.maximum(prior0, 1e-12))
    return Q / Q.sum(1, keepdims=True), pi


def soft_statistics(X, Q) -> dict:
    """FedCGS's message with soft labels Q (n, C)."""
    return {"class_counts": Q.sum(0), "class_sums": Q.T @ X, "sum_x": X.sum(0),
            "sum_xx": X.T @ X}


def shifted(m: dict, delta) -> dict:
    """FedCGS's message of the same rows moved by delta (d,): x ↦ x + δ, from the aggregates."""
    N, sx = float(np.sum(m["class_counts"])), np.asarray(m["sum_x"], np.float64)
    cross = np.outer(delta, sx)
    return {"class_counts": m["class_counts"],
            "class_sums": m["class_sums"] + np.outer(m["class_counts"], delta),
            "sum_x": sx + N * delta,
            "sum_xx": m["sum_xx"] + cross + cross.T + N * np.outer(delta, delta)}


def shift_messages(messages: list, target: dict, pooled: bool) -> list:
    """The sources' messages moved by the shift of the classes the target holds (``shift``)."""
    nT = np.asarray(target["class_counts"], np.float64)
    muT = target["class_sums"] / np.maximum(nT, 1)[:, None]

    def delta(ms):
        n = sum(np.asarray(m["class_counts"], np.float64) for m in ms)
        mu = sum(m["class_sums"] for m in ms) / np.maximum(n, 1)[:, None]
        w = nT * (n > 0)
        return (w @ (muT - mu)) / max(w.sum(), 1e-300)

    if pooled:
        d = delta(messages)
        return [shifted(m, d) for m in messages]
    return [shifted(m, delta([m])) for m in messages]


def weighted_messages(messages: list, X, y_hat, C: int, ridge: float, to: str) -> list:
    """The sources' messages × w_k, w_k ∝ agreement of source k's LDA with y_hat (``weighted``)."""
    from fedalign.dadil.target_head import lda_from_statistics
    from fedalign.heads.fedcgs import MESSAGE_KEYS

    a = np.array([np.mean(lda_from_statistics([m], C, ridge, to).predict(X) == y_hat)
                  for m in messages])
    w = len(a) * a / max(a.sum(), 1e-300)
    return [{k: wk * np.asarray(m[k], np.float64) for k in MESSAGE_KEYS}
            for wk, m in zip(w, messages)]


def isotropic_sources(raw: list, X_target, C: int) -> list:
    """Every source's rows moved isotropically onto the target's completed reference (``iso``):
    x ↦ μ_ref + (tr Σ_ref / tr Σ_k)^{1/2} (x − μ_k), the reference of
    :func:`fedalign.label_shift.completed_reference` (Ledoit–Wolf keeps the trace)."""
    from fedalign.heads.fedcgs import class_statistics
    from fedalign.label_shift import completed_reference
    from fedalign.stats import gaussian_stats

    msgs = [class_statistics(X, y, C) for X, y in raw]
    ref, _ = completed_reference(gaussian_stats(X_target), msgs, X_target, C)
    out = []
    for X, y in raw:
        st = gaussian_stats(X)
        scale = np.sqrt(np.trace(ref.covariance) / np.trace(st.covariance))
        out.append((ref.mean + scale * (np.asarray(X, np.float64) - st.mean), y))
    return out


def barycenter_statistics(B, n: int) -> dict:
    """FedCGS's message of n rows drawn from the labeled diagonal GMM B, in expectation: class
    c has n π_c rows, π_c = Σ_k w_k L_kc, class sums n Σ_k w_k L_kc m_k, Σx n Σ_k w_k m_k and
    Σxxᵀ n Σ_k w_k (diag v_k + m_k m_kᵀ) (B's moments, no sampling)."""
    w, M, V, L = (np.asarray(a, np.float64) for a in (B.weights, B.means, B.variances, B.labels))
    wl = w[:, None] * L                                        # (K, C)
    return {"class_counts": n * wl.sum(0), "class_sums": n * wl.T @ M,
            "sum_x": n * w @ M,
            "sum_xx": n * ((M * w[:, None]).T @ M + np.diag(w @ V))}


def variant_heads(rows, B, X, y_true, iso_rows=None) -> dict:
    """{variant: the LDA head} for one barycenter B of the target."""
    from scipy.special import softmax

    from fedalign.dadil.classification_em import cem_lda
    from fedalign.dadil.target_head import class_statistics, lda_from_statistics
    from fedalign.gmm import predict_proba

    C, (ridge, to) = rows.n_classes, rows.shrinkage
    P = predict_proba(B, X)
    y_hat = P.argmax(1)
    mine = {"hard": class_statistics(X, y_hat, C), "true": class_statistics(X, y_true, C)}
    Qp, _ = em_priors(P, np.asarray(B.weights) @ np.asarray(B.labels))
    sources = lda_from_statistics(rows.messages, C, ridge, to)     # no target row
    P0 = softmax(sources.scores(X), axis=1)
    stats = {"soft": soft_statistics(X, P), "prior": class_statistics(X, Qp.argmax(1), C),
             "soft+prior": soft_statistics(X, Qp),
             "poe": class_statistics(X, (np.log(P + 1e-300) + np.log(P0 + 1e-300)).argmax(1), C),
             "true": mine["true"],
             "src-labels": class_statistics(X, P0.argmax(1), C)}
    heads = {k: lda_from_statistics(rows.messages + [m], C, ridge, to) for k, m in stats.items()}
    heads["sources"] = sources
    weighted = weighted_messages(rows.messages, X, y_hat, C, ridge, to)   # weights from y_hat
    for name, labels in (("weighted", "hard"), ("true+weighted", "true")):
        heads[name] = lda_from_statistics(weighted + [mine[labels]], C, ridge, to)
    for name, labels, pooled in (("shift", "hard", False), ("shift-pooled", "hard", True),
                                 ("true+shift", "true", False)):
        t = mine[labels]
        heads[name] = lda_from_statistics(shift_messages(rows.messages, t, pooled) + [t],
                                          C, ridge, to)
    if iso_rows is not None:   # the sources' statistics of the isotropic map, its own shrinkage
        r2, t2 = iso_rows.shrinkage
        heads["iso"] = lda_from_statistics(iso_rows.messages + [mine["hard"]], C, r2, t2)
        heads["true+iso"] = lda_from_statistics(iso_rows.messages + [mine["true"]], C, r2, t2)
        heads["iso-sources"] = lda_from_statistics(iso_rows.messages, C, r2, t2)
    bary = barycenter_statistics(B, len(X))         # the dictionary's classes, absent ones too
    for name, labels in (("bary", "hard"), ("true+bary", "true")):
        heads[name] = lda_from_statistics(rows.messages + [mine[labels], bary], C, ridge, to)
    for name, it in (("hard", 0), ("cem1", 1), ("cem", 10)):
        heads[name] = cem_lda(rows.messages, X, y_hat, C, ridge, to, max_iter=it).head
    return heads


def score_job(args) -> dict:
    """Run (or read) one job; every variant's accuracy on the target's test split."""
    a, T, seed, m = args
    from fedalign.dadil import target_head as th
    from fedalign.dadil.state import client_barycenter, load_state

    name, res = run_job_kept(a, T, seed, m)
    C = res["n_classes"]
    data = run_lodo.load_all(a)   # once: the aligned job and the iso variant's raw sources
    X, y, (tr, te, dropped), sources, src, _ = run_lodo.job_data(a, data, T, seed, m, C)
    rows = th.target_rows(X[tr], [src[d] for d in sources], C)
    Xa = np.asarray(X[tr], np.float64)
    iso = th.target_rows(Xa, isotropic_sources([data[d][:2] for d in sources], Xa, C), C)
    acc = {}
    for strat in ("replacement", "aggregation"):
        B = client_barycenter(load_state(Path(a.out) / "states" / f"{name}_{strat}.state.npz"))
        heads = variant_heads(rows, B, Xa, y[tr], iso)
        acc[strat] = {k: float(np.mean(h.predict(X[te]) == y[te])) for k, h in heads.items()}
        recorded = res["result"]["accuracy"][f"DeFed {strat}"]["lda"][0]
        assert abs(acc[strat]["hard"] - recorded) < 1e-12, (name, strat)  # the library's head
    return dict(target=T, seed=seed, missing=m, dropped=[int(c) for c in dropped], acc=acc)


def table(out: list) -> list:
    """Markdown lines: per target, every variant's mean accuracy and loss 0 → largest m."""
    names = VARIANTS + DIAGNOSTICS
    lines = ["| target | jobs | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for T in sorted({r["target"] for r in out}):
        mine = [r for r in out if r["target"] == T]
        ms = sorted({r["missing"] for r in mine})
        cells = []
        for v in names:
            mean = 100 * np.mean([s[v] for r in mine for s in r["acc"].values()])
            at = {m: np.mean([s[v] for r in mine if r["missing"] == m for s in r["acc"].values()])
                  for m in ms}
            cells.append(f"{mean:.2f} (loss {100 * (at[ms[0]] - at[ms[-1]]):+.2f})")
        lines.append(f"| {T} | {len(mine)} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None):
    import sys

    ap = run_lodo.parser()
    ap.description = __doc__.splitlines()[0]
    argv = list(sys.argv[1:] if argv is None else argv)
    a = run_lodo.parse_study(ap, argv + ["--no-peers", "--keep-states"])
    a.seeds = a.missing_seeds
    jobs = [(a, T, s, m) for T in a.targets for s in a.seeds for m in a.missing]
    with ProcessPoolExecutor(a.workers, initializer=run_lodo._worker_init) as ex:
        out = list(ex.map(score_job, jobs))
    (Path(a.out) / "lda_head_tuning.json").write_text(json.dumps(out, indent=1))
    print("\n".join(table(out)))


if __name__ == "__main__":
    main()

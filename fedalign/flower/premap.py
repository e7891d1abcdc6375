"""The DeFed run's first half as exchanges (run config ``premap='target'``), :func:`run_premap`.

What ``fedalign stats --per-class`` at each source, ``target-reference`` at the target,
``align --tau 1`` and ``fit-gmm`` at each source and ``fit-gmm --unlabeled`` at the target do
with files (README, "DeFed-GMM-DaDiL by hand"), as three exchanges before round 0:

1. ``query.class_stats`` → each source; ← its class statistics: class counts (C,), class sums
   (C, d), Σx (d,), Σxxᵀ (d, d), 8 (C + C d + d + d²) bytes. Checked: the majority's d, C and
   class names, finite, integer counts ≥ 0 with a labeled row, Σxxᵀ symmetric positive
   semidefinite;
2. ``train.target_reference`` → the target: every source's class statistics, in client order;
   ← the completed reference, mean (d,) and covariance (d, d) (8 (d + d²) bytes), its n and
   label-shift record. Checked: shapes, finite, SPD. The server writes it as
   ``OUT/defed-FEDERATION.ref.npz``;
3. ``train.premap`` → each source: the reference (and its file's SHA-256); → the target: its
   role; every node writes its GMM into its node folder
   (``dir/dadil/FEDERATION/premap/NAME.gmm.npz``, :func:`fedalign.flower.handlers.premap`) and
   answers with its shape and SHA-256. The DeFed rounds then run on these GMMs.

The server sees every source's class statistics and the target's completed reference; never a
row, a label or a GMM. Faults: a source lost or refused in any of the three exchanges is
dropped with one warning naming it (lost after its statistics reached the target, they stay in
the reference); the target lost or refused stops the run with one error line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedalign.flower import _lib as lib
from fedalign.flower import messages as m
from fedalign.flower.exchange import Exchange, majority
from fedalign.flower.messages import NodeReplyError, Payload
from fedalign.flower.settings import Settings

#: the exchanges' stage in the communication record
STAGE = "premap"


def run_premap(ex: Exchange, s: Settings, relay, out: Path) -> dict:
    """The three exchanges; drops the lost sources from ``relay`` (``alive``, ``everyone``)
    and returns the report's ``premap`` record (target, reference file, label-shift record,
    the sources whose statistics made the reference, every node's GMM)."""
    fed = relay.base["federation"]
    target = _target(s, relay)
    stats, d = _class_stats(ex, relay, [n for n in relay.alive if n != target])
    ex.require({**stats, target: None}, "DeFed premap (class statistics)")
    if not stats:
        raise lib.FedalignError("DeFed premap: no source's class statistics arrived (the "
                                "target's reference is completed from them)")
    order = sorted(stats, key=lambda n: relay.names[n])
    ref, rec = _target_reference(ex, relay, target, {n: stats[n] for n in order}, d)
    path = out / f"defed-{fed}.ref.npz"
    lib.save_reference(path, ref, dict(producer="fedalign flower", target=relay.names[target],
                                       sources=[relay.names[n] for n in order]))
    sha = lib.sha256_file(path)
    gmms = _premap(ex, s, relay, target, order, ref, sha, d)
    relay.alive = [n for n in relay.alive if n in gmms]
    relay.everyone = [relay.names[n] for n in relay.alive]
    ex.require(gmms, "DeFed premap")
    absent = ", ".join(map(str, rec.get("absent") or [])) or "none"
    ex.say(f"DeFed {fed}: {len(order)} sources mapped onto target {relay.names[target]}'s "
           f"completed Gaussian (classes absent from it: {absent})")
    return dict(onto="target", target=relay.names[target], reference=str(path),
                reference_sha256=sha, label_shift=rec,
                sources=[relay.names[n] for n in order],
                gmms={relay.names[n]: gmms[n].config["gmm"] for n in relay.alive})


def _target(s: Settings, relay) -> int:
    """The target's node id (run config ``target``), or one error line."""
    ids = [n for n in relay.alive if relay.names[n] == s.target]
    if not ids:
        raise lib.FedalignError(f"DeFed premap: the target {s.target!r} is none of the nodes "
                                f"that answered ({', '.join(relay.everyone)})")
    return ids[0]


def _from_target(ex: Exchange, target: int, reply, what: str, check):
    """The target's reply after ``check``; lost or refused → the run stops (FedalignError)."""
    if not isinstance(reply, NodeReplyError):
        try:
            reply = check(target, reply) or reply
        except NodeReplyError as e:
            reply = e
    if isinstance(reply, NodeReplyError):
        raise lib.FedalignError(f"DeFed premap, {what}: the target failed: {reply} (every "
                                "source maps onto its Gaussian: the run stops)")
    return reply


# --------------------------------------------------------------------------------------------
# 1. The sources' class statistics
# --------------------------------------------------------------------------------------------


def _check_psd(lab: str, M: np.ndarray) -> None:
    """Σxxᵀ (d, d): symmetric and positive semidefinite (λ_min ≥ −d · eps · tr), numerically;
    a sum over fewer rows than d is singular, not refused."""
    scale = float(np.abs(M).max()) if M.size else 0.0
    tol = M.shape[0] * np.finfo(np.float64).eps * float(np.trace(M))
    if (float(np.abs(M - M.T).max()) > lib.SYMMETRY_RTOL * scale or not scale > 0
            or float(np.linalg.eigvalsh(0.5 * (M + M.T))[0]) < -tol):
        raise NodeReplyError(lab, "class stats reply: 'sum_xx' is not symmetric positive "
                                  "semidefinite")


def _check_class_stats(ex: Exchange, d: int, C: int, names: list):
    def check(nid, p: Payload):
        lab = ex.label(nid)
        a = m.check_arrays(lab, "class stats", p.group("class_stats"),
                           {"class_counts": (C,), "class_sums": (C, d), "sum_x": (d,),
                            "sum_xx": (d, d)})
        counts = a["class_counts"]
        if counts.dtype.kind not in "iu" or np.any(counts < 0) or counts.sum() < 1:
            raise NodeReplyError(lab, "class stats reply: class counts must be integers ≥ 0 "
                                      f"with a labeled row, got {counts.tolist()}")
        _check_psd(lab, a["sum_xx"])
        if list(p.config.get("class_names") or []) != names:
            raise NodeReplyError(lab, "class stats reply has other class names than the other "
                                      "sources")
        return None
    return check


def _class_stats(ex: Exchange, relay, sources: list) -> tuple[dict, int]:
    """``query.class_stats`` → ({node id: reply} of the sources whose statistics agree with
    the majority's d, C and class names, d)."""
    replies = ex.ask({n: (m.CLASS_STATS, Payload({}, dict(relay.base))) for n in sources},
                     STAGE, "class stats")
    ok = [r for r in replies.values() if not isinstance(r, NodeReplyError)]
    d = majority(int(r.config.get("d", -1)) for r in ok)
    C = majority(int(np.shape(r.group("class_stats").get("class_counts", []))[0]) for r in ok)
    names = list(majority(tuple(r.config.get("class_names") or []) for r in ok) or ())
    return ex.keep(replies, "federation", _check_class_stats(ex, d, C, names)), d


# --------------------------------------------------------------------------------------------
# 2. The target's completed reference
# --------------------------------------------------------------------------------------------


def _check_reference(ex: Exchange, d: int):
    def check(nid, p: Payload):
        lab = ex.label(nid)
        a = m.check_arrays(lab, "target reference", p.group("reference"),
                           {"mean": (d,), "covariance": (d, d)})
        try:
            lib.check_spd(a["covariance"], "covariance")
        except lib.FedalignError as e:
            raise NodeReplyError(lab, f"target reference reply: {e}") from None
        n = p.config.get("n")
        if not isinstance(n, int) or n < 2:
            raise NodeReplyError(lab, f"target reference reply has n={n!r}, expected an "
                                      "integer ≥ 2")
        return None
    return check


def _target_reference(ex: Exchange, relay, target: int, stats: dict, d: int):
    """``train.target_reference`` → (:class:`fedalign.align.Reference`, label-shift record)."""
    names = [relay.names[n] for n in stats]
    arrays = {f"source/{relay.names[n]}": r.group("class_stats") for n, r in stats.items()}
    reply = ex.ask({target: (m.TARGET_REFERENCE, Payload(arrays, dict(relay.base, sources=names)))},
                   STAGE, "target reference")[target]
    p = _from_target(ex, target, reply, "target reference", _check_reference(ex, d))
    r, rec = p.group("reference"), dict(p.config.get("label_shift") or {})
    ref = lib.Reference(np.asarray(r["mean"], float), np.asarray(r["covariance"], float),
                        np.ones(1), np.array([int(p.config["n"])], np.int64),
                        dict(reference="the target's Gaussian, completed by the classes it "
                                       "lacks (premap)", label_shift=rec))
    return ref, rec


# --------------------------------------------------------------------------------------------
# 3. Every node's GMM
# --------------------------------------------------------------------------------------------


def _check_gmm(ex: Exchange, target: int, d: int):
    def check(nid, p: Payload):
        g = p.config.get("gmm") or {}
        want = nid != target
        if (not isinstance(g.get("K"), int) or g["K"] < 1 or g.get("d") != d
                or g.get("labeled") is not want or not isinstance(g.get("sha256"), str)):
            raise NodeReplyError(ex.label(nid), f"premap reply: expected a "
                                                f"{'labeled' if want else 'unlabeled'} GMM of "
                                                f"d={d}, got {g}")
        return None
    return check


def _premap(ex: Exchange, s: Settings, relay, target: int, sources: list, ref, sha: str,
            d: int) -> dict:
    """``train.premap`` → {node id: reply} of the nodes whose GMM was written."""
    cfg = dict(relay.base, gmm_k=int(s.gmm_k), gmm_seed=int(s.gmm_seed))
    arrays = {"reference": {"mean": ref.mean, "covariance": ref.covariance}}
    reqs = {n: (m.PREMAP, Payload(arrays, dict(cfg, role="source", reference_sha256=sha)))
            for n in sources}
    reqs[target] = (m.PREMAP, Payload({}, dict(cfg, role="target")))
    replies = ex.ask(reqs, STAGE, "premap")
    check = _check_gmm(ex, target, d)
    tgt = _from_target(ex, target, replies.pop(target), "premap", check)
    return {**ex.keep(replies, "federation", check), target: tgt}

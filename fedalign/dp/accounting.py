"""Carrying DP records forward and a client's total privacy loss over everything it sent.

Where the records live:

- a DP stats file: its release record, ``meta["dp"]`` (:func:`fedalign.dp.release.describe`);
- a reference: ``meta["dp_inputs"]``, one entry per input statistics (client, domain, digest of
  the statistics, and the DP record or None for exact statistics) — only when at least one
  input is a DP release (:func:`reference_inputs`);
- a map and every file it aligned: ``dp`` = {``map_stats``: the record of the statistics the
  map was built from (None: exact), ``reference_inputs``} (:func:`map_record`);
- a DP head: ``head.info["dp"]`` = {``record``, ``clipped_fraction`` per client}.

A client's total (:func:`client_privacy`) composes its statistics release (found in its train
file's provenance) with its head message by Gaussian DP (:mod:`fedalign.dp.calibration`),
μ = √(μ_stats² + μ_head²), and reports ε at δ = the largest δ of the parts.

When the head message is covered. Per-row clipping bounds a head message's sensitivity only
if the rows the head sees do not otherwise depend on the private data. A client that maps its
features with its **exact** statistics breaks this: one row changes the map and so every
mapped row, and the message's sensitivity is no longer bounded by C. The composed guarantee
holds when the map is built from the **released** statistics (``align --stats
client.dp.npz``: the map is then post-processing of the release and of the other clients'
releases). :func:`client_privacy` says which case applies (``head_message_covered``) and
gives no total in the other.
"""

from __future__ import annotations

import math

from fedalign.dp.calibration import account, compose_mu
from fedalign.dp.release import record_mu

#: What is not covered when the map was built from exact statistics (the reason reported).
NOT_COVERED = ("the rows were mapped with a map built from the client's exact statistics: one "
               "row changes the map and so every mapped row, so per-row clipping does not bound "
               "the head message's sensitivity; build the map from the released statistics "
               "(align --stats <client>.dp.npz) for the composed guarantee to hold")


def compact(record: dict | None) -> dict | None:
    """A release record without its post-processing details (what is carried forward)."""
    if record is None:
        return None
    return {k: v for k, v in record.items() if k not in ("postprocessing", "clipped_fraction_note")}


def reference_inputs(metas, digests) -> list | None:
    """``dp_inputs`` of a reference: per input statistics {client, domain, stats_sha256, dp}
    (``dp`` None: exact statistics); None when no input is a DP release."""
    metas = list(metas)
    if not any(m.get("dp") for m in metas):
        return None
    return [dict(client=m.get("client"), domain=m.get("domain"), stats_sha256=dig,
                 dp=compact(m.get("dp"))) for m, dig in zip(metas, digests)]


def map_record(stats_dp: dict | None, ref_meta: dict) -> dict | None:
    """The ``dp`` entry of a map's metadata (and of the ``align`` step of every file it
    moved): the record of the statistics it was built from and the reference's DP inputs;
    None when neither is DP (nothing is added)."""
    inputs = ref_meta.get("dp_inputs")
    if stats_dp is None and not inputs:
        return None
    return dict(map_stats=compact(stats_dp), reference_inputs=inputs)


def summary(record: dict | None) -> dict | None:
    """One release, briefly: mechanism, ε, δ, C, μ recomputed from the σ's, clipped fraction."""
    if record is None:
        return None
    out = dict(mechanism=record.get("mechanism"), epsilon=record.get("epsilon"),
               delta=record.get("delta"), clip=record.get("clip"), mu=record_mu(record))
    if "clipped_fraction" in record:
        out["clipped_fraction"] = record["clipped_fraction"]
    return out


def _last_align(provenance: dict) -> dict | None:
    steps = [h for h in provenance.get("history", []) if h.get("step") == "align"]
    return steps[-1] if steps else None


def client_privacy(name: str, provenance: dict, head_record: dict | None,
                   head_dp: bool) -> dict:
    """A client's privacy over one run: its statistics release (from the ``align`` step of its
    train file's provenance) composed with its head message.

    Parameters
    ----------
    name : the client
    provenance : its train file's provenance
    head_record : the head message's release record (None: not a DP message)
    head_dp : whether the head sends a DP message at all

    Returns
    -------
    dict: ``stats`` (a :func:`summary`, ``"exact"`` when exact statistics were sent, None when
    the train file records no statistics release), ``head`` (summary or ``"exact"``),
    ``head_message_covered`` and ``reason``, ``total`` (:func:`fedalign.dp.calibration.account`
    of the composition, or ``private: false`` with the reason).
    """
    step = _last_align(provenance)
    stats, stats_digests, mine = None, set(), None
    if step is not None:
        dp = step.get("dp") or {}
        entries = dp.get("reference_inputs") or []
        mine = next((e for e in entries if e.get("client") == name), None)
        stats = "exact" if mine is None or mine.get("dp") is None else summary(mine["dp"])
        stats_digests = {e["stats_sha256"] for e in entries if e.get("dp")}
    head = summary(head_record) if head_dp else "exact"
    covered, reason = True, None
    if not head_dp:
        covered, reason = False, "the head message is not a DP release"
    elif step is not None:
        used = ([step.get("stats_sha256")] if step.get("map_scope") != "domain"
                else list(step.get("client_stats_sha256") or []))
        if not used or not set(used) <= stats_digests:
            covered, reason = False, NOT_COVERED
    return dict(client=name, stats=stats, head=head, head_message_covered=covered,
                reason=reason, total=compose(stats, head, covered, reason))


def compose(stats, head, covered: bool, reason: str | None = None) -> dict:
    """The composed guarantee of a statistics release and a head message (each a
    :func:`summary`, ``"exact"`` or None for nothing sent): μ = √(μ_s² + μ_h²) at the largest
    δ, or ``private: false`` with the reason (something sent exactly, or a head message whose
    sensitivity is not bounded)."""
    parts = [r for r in (stats, head) if r is not None]
    if stats == "exact":
        return dict(private=False, reason="the statistics were sent exactly (no DP)")
    if head == "exact":
        return dict(private=False, reason="the head message was sent exactly (no DP)")
    if not covered:
        return dict(private=False, reason="no composed guarantee: " + (reason or NOT_COVERED))
    return account(compose_mu(r["mu"] for r in parts), max(r["delta"] for r in parts))


def is_private(entry: dict) -> bool:
    """Whether a :func:`client_privacy` entry carries a finite composed guarantee."""
    t = entry.get("total") or {}
    return bool(t.get("private")) and t.get("epsilon") is not None and not math.isinf(t["epsilon"])

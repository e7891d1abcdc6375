"""The Flower run against the file pipeline: same reference, same accuracies, same DaDiL files.

::

    python -m fedalign.flower.compare --ref out/flower/ref.npz out/files/ref.npz \\
        --slot out/flower/slot.json out/files/slot.json \\
        --defed NODE_DIR/dadil/aggregation FILES_DIR/aggregation [--defed …]   (one per node)
        --target out/flower/defed-aggregation.json out/files/defed-aggregation.json
        [--premap --ref out/flower/defed-aggregation.ref.npz out/files/t.ref.npz \
         --gmm NODE_DIR/dadil/aggregation/premap/ink.gmm.npz out/files/ink.gmm.npz …]

prints one line per check and exits 1 when one fails. The reference must agree to ``--atol``
(1e-8); accuracies must be equal per domain and seed; every DaDiL state and published atoms
file must hold equal arrays and equal records (the GMM path each state records may differ).
With ``--premap`` (the run fitted every node's GMM, ``premap='target'``) the GMM files are
compared on their own (``--gmm``: equal arrays, equal fit records; the path and hash of the
features file each was fitted on differ), and the states without the GMM's hash.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

#: State arrays compared exactly.
STATE_ARRAYS = ("means", "variances", "label_logits", "alpha", "round", "rng_state", "var_floor",
                "received_means", "received_variances", "received_label_logits", "alpha_received")


def compare_references(a, b, atol: float = 1e-8) -> tuple[bool, str]:
    """Max |Δ| of the barycenter mean and covariance of two reference files."""
    from fedalign.flower._lib import read_npz

    x, _ = read_npz(a, "reference")
    y, _ = read_npz(b, "reference")
    dm = float(np.max(np.abs(x["mean"] - y["mean"])))
    dc = float(np.max(np.abs(x["covariance"] - y["covariance"])))
    ok = dm <= atol and dc <= atol and x["mean"].shape == y["mean"].shape
    return ok, f"reference: max |Δmean| {dm:.2e}, max |Δcovariance| {dc:.2e} (tolerance {atol:g})"


def compare_reports(a, b) -> tuple[bool, str]:
    """Per-domain, per-seed accuracies of every method both reports hold (equal, not close)."""
    ra, rb = (json.loads(Path(p).read_text()) for p in (a, b))
    ma, mb = ra.get("methods", {}), rb.get("methods", {})
    common = [m for m in ma if m in mb]
    if not common:
        return False, "accuracy: the reports have no method in common"
    diffs = []
    for m in common:
        sa, sb = ma[m]["seeds"], mb[m]["seeds"]
        if sa != sb:
            diffs.append(f"{m}: seeds {sa} ≠ {sb}")
            continue
        for seed, pa, pb in zip(sa, ma[m]["per_seed"], mb[m]["per_seed"]):
            for dom in sorted(set(pa) | set(pb)):
                if pa.get(dom) != pb.get(dom):
                    diffs.append(f"{m} seed {seed} {dom}: {pa.get(dom)} ≠ {pb.get(dom)}")
    n = sum(len(ma[m]["per_seed"]) * len(ma[m]["per_seed"][0]) for m in common)
    if diffs:
        return False, f"accuracy: {len(diffs)} of {n} differ: " + "; ".join(diffs[:5])
    return True, f"accuracy: {n} per-domain, per-seed values equal ({', '.join(common)})"


def compare_target_reports(a, b) -> tuple[bool, str]:
    """The DeFed target's accuracies of two ``dadil-evaluate``-layout reports (the app's
    ``defed-FEDERATION.json`` and the file pipeline's): equal rows, seeds and values."""
    ra, rb = (json.loads(Path(p).read_text()) for p in (a, b))
    diffs = [k for k in ("domain", "seeds", "rows", "accuracy") if ra.get(k) != rb.get(k)]
    if "accuracy" not in ra or "accuracy" not in rb:
        return False, "DeFed accuracy: a report has no target accuracy"
    n = sum(len(v) for row in ra["accuracy"].values() for v in row.values())
    if diffs:
        return False, f"DeFed accuracy: {', '.join(diffs)} differ"
    return True, (f"DeFed accuracy: {n} per-seed values of target {ra.get('domain')} equal "
                  f"({', '.join(r[2] for r in ra['rows'])})")


def _same_arrays(x: dict, y: dict, keys) -> list:
    bad = []
    for k in keys:
        if (k in x) != (k in y):
            bad.append(f"{k} present in one only")
        elif k in x and not (x[k].shape == y[k].shape and np.array_equal(x[k], y[k])):
            bad.append(k)
    return bad


#: GMM metadata that names the file a GMM was fitted on (not compared by :func:`compare_gmms`)
GMM_SOURCE_META = ("producer", "source", "source_sha256")


def compare_gmms(a, b) -> tuple[bool, str]:
    """Two GMM files fitted apart (premap): equal arrays and equal metadata but for
    :data:`GMM_SOURCE_META` (each records the path and hash of its own features file)."""
    from fedalign.flower._lib import read_npz

    xa, ma = read_npz(a, "gmm")
    xb, mb = read_npz(b, "gmm")
    bad = _same_arrays(xa, xb, sorted(set(xa) | set(xb)))
    bad += [f"meta {k}" for k in sorted((set(ma) | set(mb)) - set(GMM_SOURCE_META))
            if ma.get(k) != mb.get(k)]
    if bad:
        return False, f"GMM {Path(a).name}: {', '.join(bad[:5])} differ"
    return True, f"GMM {Path(a).name}: {len(xa)} arrays and the fit record equal"


def compare_federations(a, b, gmm_hash: bool = True) -> tuple[bool, str]:
    """Two DeFed federation folders (``state/``, ``round_XXX/``): equal states and atoms.

    ``gmm_hash=False``: the states' records are compared without the GMM's SHA-256 (GMMs
    fitted apart, each naming its own features file: compare them with :func:`compare_gmms`).
    """
    from fedalign.flower._lib import read_npz

    skip = {"gmm_path"} if gmm_hash else {"gmm_path", "gmm_sha256"}
    a, b = Path(a), Path(b)
    problems, n_states, n_atoms, identical = [], 0, 0, 0
    for sa in sorted((a / "state").glob("*.state.npz")):
        sb = b / "state" / sa.name
        if not sb.is_file():
            problems.append(f"{sb} missing")
            continue
        xa, ma = read_npz(sa, "state")
        xb, mb = read_npz(sb, "state")
        bad = _same_arrays(xa, xb, STATE_ARRAYS)
        for k in sorted((set(ma) | set(mb)) - skip):
            if ma.get(k) != mb.get(k):
                bad.append(f"meta {k}")
        if bad:
            problems.append(f"{sa.name}: {', '.join(bad)}")
        n_states += 1
        identical += sa.read_bytes() == sb.read_bytes()
    for pa in sorted(a.glob("round_*/*.atoms.npz")):
        pb = b / pa.relative_to(a)
        if not pb.is_file():
            problems.append(f"{pb} missing")
            continue
        xa, ma = read_npz(pa, "atoms")
        xb, mb = read_npz(pb, "atoms")
        bad = _same_arrays(xa, xb, ("means", "variances", "label_logits", "round"))
        if ma.get("producer") != mb.get("producer"):
            bad.append("producer")
        if bad:
            problems.append(f"{pa.relative_to(a)}: {', '.join(bad)}")
        n_atoms += 1
        identical += pa.read_bytes() == pb.read_bytes()
    if not n_states:
        problems.append(f"no states under {a / 'state'}")
    if problems:
        return False, f"DeFed {a.name}: " + "; ".join(problems[:5])
    return True, (f"DeFed {a.name}: {n_states} states and {n_atoms} published atoms files equal "
                  f"({identical} of {n_states + n_atoms} byte for byte)")


def _kb(n: int) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1024 ** 2 else f"{n / 1024 ** 2:,.2f} MiB"


def communication_lines(reports) -> list:
    """Bytes per client per method from the run reports' communication records, next to
    FedAvg of the same linear head (per round and for the record's number of rounds)."""
    lines, fedavg = [], None
    for path in reports:
        rep = json.loads(Path(path).read_text())
        comm = rep.get("communication", {})
        fedavg = comm.get("fedavg_linear_head", fedavg)
        for client, book in sorted(comm.get("per_client", {}).items()):
            for stage, e in sorted(book.items()):
                if e["sent"] or e["received"]:
                    lines.append(f"  {client:<12} {stage:<14} server→client {_kb(e['sent']):>12}   "
                                 f"client→server {_kb(e['received']):>12}")
    if fedavg is not None:
        pr, R = fedavg["per_round"], fedavg["rounds"]
        C, d = fedavg["shape"]
        lines.append(f"  FedAvg of the same linear head (C={C}, d={d}, float32), per client: "
                     f"{_kb(pr['sent'])} down + {_kb(pr['received'])} up per round; "
                     f"{R} rounds: {_kb(R * pr['sent'])} + {_kb(R * pr['received'])}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedalign.flower.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", nargs=2, metavar=("FLOWER", "FILES"))
    ap.add_argument("--slot", nargs=2, metavar=("FLOWER", "FILES"))
    ap.add_argument("--defed", nargs=2, action="append", default=[], metavar=("FLOWER", "FILES"))
    ap.add_argument("--target", nargs=2, metavar=("FLOWER", "FILES"),
                    help="the DeFed target's accuracy reports")
    ap.add_argument("--comm", nargs="+", default=[], metavar="REPORT",
                    help="print the bytes per client of these run reports")
    ap.add_argument("--gmm", nargs=2, action="append", default=[], metavar=("FLOWER", "FILES"),
                    help="GMM files fitted apart (premap), one pair per node")
    ap.add_argument("--premap", action="store_true",
                    help="the run fitted every node's GMM: states compared without its hash")
    ap.add_argument("--atol", type=float, default=1e-8)
    args = ap.parse_args(argv)
    checks = []
    try:
        if args.ref:
            checks.append(compare_references(*args.ref, atol=args.atol))
        if args.slot:
            checks.append(compare_reports(*args.slot))
        if args.target:
            checks.append(compare_target_reports(*args.target))
        for a, b in args.gmm:
            checks.append(compare_gmms(a, b))
        for a, b in args.defed:
            checks.append(compare_federations(a, b, gmm_hash=not args.premap))
        comm = communication_lines(args.comm) if args.comm else []
    except Exception as e:  # a missing or unreadable file: one line
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for ok, line in checks:
        print(("equal   " if ok else "DIFFER  ") + line)
    if comm:
        print("bytes per client (as Flower's message_size_mod counts them):")
        print("\n".join(comm))
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The output checks of a command with many outputs: keyed lookups vs pairwise comparison.

A ``dadil-simulate`` federation of C clients × R rounds writes ~C·(R + 1) files, and every one
is checked against the others and the inputs (never an input, never one file twice). This
times :func:`fedalign.files.check_outputs` and a transaction's ``add`` of every output, next to
the pairwise ``same_file`` loop they replaced, in one process, one after the other, and prints
the ratio (goal: linear in the outputs, the pairwise loop is quadratic).

Usage: python benchmarks/bench_outputs.py [--clients 10] [--rounds 100 300]
"""

import argparse
import os
import tempfile
import time


def pairwise(inputs, outputs):
    """The quadratic check (before 2026-12): every output against every earlier one and every
    input, each comparison resolving both paths."""
    from fedalign.files import same_file

    for i, o in enumerate(outputs):
        assert not any(same_file(o, o2) for o2 in outputs[:i])
        assert not any(same_file(o, p) for p in inputs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, nargs="+", default=[100, 300])
    a = ap.parse_args()
    from fedalign.files import atomic_outputs, check_outputs

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        ins = [os.path.join(tmp, f"c{c}.gmm.npz") for c in range(a.clients)]
        print(f"{'outputs':>8} {'keyed s':>9} {'pairwise s':>11} {'ratio':>7} {'tx.add s':>9}")
        for rounds in a.rounds:
            outs = [os.path.join(tmp, f"round_{r:03d}", f"c{c}.npz")
                    for r in range(rounds + 1) for c in range(a.clients)]
            t = time.perf_counter()
            check_outputs(ins, outs)
            keyed = time.perf_counter() - t
            t = time.perf_counter()
            pairwise(ins, outs)
            slow = time.perf_counter() - t
            flat = [os.path.join(tmp, f"f{i}.npz") for i in range(len(outs))]
            t = time.perf_counter()
            with atomic_outputs() as tx:
                for p in flat:
                    tx.add(p)
                tx.rollback()
            add = time.perf_counter() - t
            print(f"{len(outs):>8} {keyed:>9.3f} {slow:>11.2f} {slow / keyed:>6.0f}× {add:>9.2f}")


if __name__ == "__main__":
    main()

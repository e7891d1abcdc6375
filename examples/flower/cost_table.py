#!/usr/bin/env python
"""The cost of a Flower run against N: a markdown table and a plot from launchers' metrics.

Each ``metrics.json`` is what ``launch.py`` writes after a run (times and bytes from the
ServerApp's reports — every exchange's wall time and bytes both ways — and the resident memory
of each kind of process, sampled every 0.5 s)::

    python examples/flower/make_features.py -o feats --rows 1200 -d 8   # 3 domains, C = 3
    for n in 3 10 20; do
        python examples/flower/launch.py -n $n feats/*.h5 -o runs/n$n --seeds 0 --rounds 3 \\
            --local-steps 2 --n-components 6
    done
    python examples/flower/cost_table.py runs/n*/metrics.json -o examples/flower/cost

writes ``cost.md`` (the table) and ``cost.png`` (time per exchange and bytes through the
SuperLink against N). Bytes are those of each message's records (Flower's
``message_size_mod`` count); every byte the ServerApp sends or receives passes through the
SuperLink, so "through the SuperLink" is sent + received of the exchange.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def summarize(m: dict) -> dict:
    """One row of the table from one run's metrics."""
    slot, defed = m["slot"], m["defed"]
    n = m["n"]
    rounds = [e for e in defed["exchanges"] if e["label"].startswith("round ")
              and e["label"] != "round 0"]
    slot_ex = slot["exchanges"]
    per_site = lambda book, k: np.mean([v[k] for v in book.values()])  # noqa: E731
    peak, total = m["peak_rss_bytes"], m.get("peak_rss_total_bytes", {})
    return dict(
        n=n,
        slot_exchange_s=float(np.mean([e["seconds"] for e in slot_ex])),
        slot_exchanges=len(slot_ex),
        slot_run_s=m["wall_s"]["slot_run"],
        defed_round_s=float(np.mean([e["seconds"] for e in rounds])),
        defed_run_s=m["wall_s"]["defed_run"],
        slot_site_down=per_site(slot["bytes_per_site"], "sent"),
        slot_site_up=per_site(slot["bytes_per_site"], "received"),
        defed_round_site_down=float(np.mean([e["sent"] / e["nodes"] for e in rounds])),
        defed_round_site_up=float(np.mean([e["received"] / e["answered"] for e in rounds])),
        link_slot=sum(e["sent"] + e["received"] for e in slot_ex),
        link_round=float(np.mean([e["sent"] + e["received"] for e in rounds])),
        rss_superlink=peak.get("flower-superlink", 0),
        rss_supernode=peak.get("flower-supernode", 0),
        rss_clientapp=peak.get("flwr-clientapp", 0),
        rss_serverapp=peak.get("flwr-serverapp", 0),
        rss_all=total.get("all", 0),
        pss_all=total.get("pss", 0),
        load=m["load_average"],
    )


def _kib(b: float) -> str:
    return f"{b / 1024:,.1f}" if b < 1024 ** 2 else f"{b / 1024 ** 2:,.2f} Mi"


def _mib(b: float) -> str:
    return f"{b / 1024 ** 2:,.0f}"


def table(rows: list) -> str:
    head = ["N", "SLOT s/exchange", "SLOT run s", "DeFed s/round", "DeFed run s",
            "SLOT KiB/site down/up", "DeFed KiB/site/round down/up", "SuperLink KiB SLOT",
            "SuperLink KiB/DeFed round", "RSS MiB SuperLink", "RSS MiB SuperNode",
            "RSS MiB ClientApp", "RSS MiB all (peak)", "PSS MiB all (peak)", "load 1-min start→end"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lo = f"{r['load']['start'][0]:.1f}→{r['load'].get('end', [float('nan')])[0]:.1f}"
        cells = [r["n"], f"{r['slot_exchange_s']:.1f} ({r['slot_exchanges']})",
                 f"{r['slot_run_s']:.0f}", f"{r['defed_round_s']:.1f}", f"{r['defed_run_s']:.0f}",
                 f"{_kib(r['slot_site_down'])} / {_kib(r['slot_site_up'])}",
                 f"{_kib(r['defed_round_site_down'])} / {_kib(r['defed_round_site_up'])}",
                 _kib(r["link_slot"]), _kib(r["link_round"]), _mib(r["rss_superlink"]),
                 _mib(r["rss_supernode"]), _mib(r["rss_clientapp"]), _mib(r["rss_all"]),
                 _mib(r["pss_all"]) if r["pss_all"] else "—", lo]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["n"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.plot(n, [r["slot_exchange_s"] for r in rows], "o-", label="SLOT, per exchange")
    a.plot(n, [r["defed_round_s"] for r in rows], "s-", label="DeFed, per round")
    a.set(xlabel="sites N", ylabel="wall time (s)", title="time per exchange")
    a.legend()
    b.plot(n, [r["link_round"] / 1024 for r in rows], "s-", label="DeFed round")
    b.plot(n, [r["link_slot"] / 1024 for r in rows], "o-", label="SLOT run (all exchanges)")
    b.set(xlabel="sites N", ylabel="KiB", title="bytes through the SuperLink")
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="metrics.json of launch.py runs")
    ap.add_argument("-o", "--out", default=str(Path(__file__).with_name("cost")),
                    help="output stem: STEM.md and STEM.png")
    args = ap.parse_args(argv)
    rows = sorted((summarize(json.loads(Path(p).read_text())) for p in args.metrics),
                  key=lambda r: r["n"])
    out = Path(args.out)
    out.with_suffix(".md").write_text(table(rows))
    plot(rows, out.with_suffix(".png"))
    print(table(rows), end="")
    print(f"→ {out.with_suffix('.md')}, {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

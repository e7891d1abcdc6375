"""The ServerApp: SLOT-Align and DeFed-GMM-DaDiL over Flower's Grid.

``app`` is the ``flwr.serverapp.ServerApp`` named in ``examples/flower/pyproject.toml``; its
``main(grid, context)`` calls :func:`run`, which reads the run config
(:class:`~fedalign.flower.settings.Settings`) and runs the method's driver,
:func:`~fedalign.flower.slot_driver.run_slot` or :func:`~fedalign.flower.defed_driver.run_defed`.
Both talk to the nodes only through :class:`~fedalign.flower.exchange.Exchange` (push
messages, poll the replies, check them, count their bytes), so they run the same on the
deployment engine and on an in-process grid (the tests).

- :mod:`fedalign.flower.settings` — the run config, read with the command line's grammar;
- :mod:`fedalign.flower.exchange` — the messages to the nodes, their replies, the lost nodes;
- :mod:`fedalign.flower.slot_driver` — SLOT-Align: stats → barycenter → heads → evaluation;
- :mod:`fedalign.flower.defed_driver` — DeFed-GMM-DaDiL: the relayed gossip;
- :mod:`fedalign.flower.premap` — its first half (``premap='target'``): class statistics →
  the target's completed reference → every node's GMM.

The names of those modules that callers took from here stay importable from here.
"""

from __future__ import annotations

from pathlib import Path

from fedalign.flower import _lib as lib
from fedalign.flower.defed_driver import run_defed
from fedalign.flower.exchange import Exchange
from fedalign.flower.settings import Settings
from fedalign.flower.slot_driver import REFUSED_HEADS, fedavg_bytes, run_slot

__all__ = ["REFUSED_HEADS", "Exchange", "Settings", "app", "fedavg_bytes", "run", "run_defed",
           "run_slot"]


def run(grid, run_config, say=print) -> dict:
    """Run the configured method over ``grid`` (any ``flwr.serverapp.Grid``)."""
    s = Settings.from_run_config(run_config)
    out = Path(s.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    ex = Exchange(grid, s, say)
    return run_slot(ex, s, out) if s.method == "slot" else run_defed(ex, s, out)


def _make_app():
    from logging import INFO, WARNING

    from flwr.common.logger import log
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        def say(text):
            for line in str(text).splitlines():
                log(WARNING if line.startswith("WARNING") else INFO, "%s", line)

        try:
            run(grid, context.run_config, say)
        except lib.FedalignError as e:  # bad input: one line, then the run is marked failed
            log(40, "error: %s", " ".join(str(e).split()))
            raise lib.FedalignError(" ".join(str(e).split())) from None

    return app


app = _make_app()

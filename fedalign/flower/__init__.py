"""Across sites: SLOT-Align and DeFed-GMM-DaDiL as a Flower app (``pip install 'fedalign[flower]'``).

- :mod:`fedalign.flower.server_app` — ``app``, the ServerApp (``@app.main()``): the run config
  (:mod:`~fedalign.flower.settings`) → one driver per method over the node exchange
  (:mod:`~fedalign.flower.exchange`): the SLOT-Align server (:mod:`~fedalign.flower.slot_driver`:
  barycenter, global heads) and the DeFed gossip relay (:mod:`~fedalign.flower.defed_driver`:
  a mailbox of atoms, after :mod:`~fedalign.flower.premap` with ``premap='target'``: the
  sources mapped onto the target's completed Gaussian and every node's GMM, as exchanges);
- :mod:`fedalign.flower.client_app` — ``app``, the ClientApp: one handler per message type;
- :mod:`fedalign.flower.handlers` — what a node computes from its own files (no Flower);
- :mod:`fedalign.flower.messages` — payloads ↔ ``RecordDict``, reply checks, byte counts;
- :mod:`fedalign.flower.compare` — the Flower run against the file pipeline;
- :mod:`fedalign.flower._lib` — every library function the app calls.

The Flower project folder is ``examples/flower/`` (its ``pyproject.toml`` names these apps);
``examples/flower/run_local.sh N`` runs both methods on a local SuperLink and N SuperNodes.
Importing this package does not import Flower.
"""

"""Results shared by every evaluator: one method's accuracies, mean ± std, plain JSON.

:class:`MethodResult` is what ``evaluate`` (:mod:`fedalign.evaluate`), DaDiL's evaluation
(:mod:`fedalign.dadil.evaluation`) and the Flower server (:mod:`fedalign.flower.server_app`)
return and report; :func:`mean_std` is the one mean ± std over seeds (population std,
ddof = 0); :func:`json_safe` the one cleaner that turns numpy values (and paths) into plain
JSON types. This room imports nothing of fedalign, so every evaluator may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

import numpy as np


def mean_std(values) -> dict:
    """``{"mean", "std"}`` of ``values`` as Python floats (population std, ddof = 0)."""
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std())}


@dataclass
class MethodResult:
    """Accuracies of one method: ``per_seed[i][domain]`` for ``seeds[i]``."""

    method: str
    seeds: list
    per_seed: list
    params: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    diagnostics: list = field(default_factory=list)
    privacy: list = field(default_factory=list)

    def macro(self) -> list:
        """Macro mean over domains, one value per seed."""
        return [float(np.mean(list(acc.values()))) for acc in self.per_seed]

    def summary(self) -> dict:
        """mean ± std (ddof = 0) over seeds, per domain and for the macro mean."""
        domains = list(self.per_seed[0])
        out = {dom: mean_std([a[dom] for a in self.per_seed]) for dom in domains}
        out["macro"] = mean_std(self.macro())
        return out

    def to_json(self) -> dict:
        out = dict(seeds=list(self.seeds), per_seed=self.per_seed, macro_per_seed=self.macro(),
                   summary=self.summary(), params=self.params, notes=self.notes)
        if any(self.diagnostics):
            out["diagnostics"] = self.diagnostics  # per seed, e.g. O-FedAvg's final training loss
        if self.privacy:
            out["privacy"] = self.privacy  # per client, one run (fedalign.dp.accounting)
        return out


def json_safe(obj):
    """``obj`` in plain JSON types: dicts (keys as text), lists (from tuples and arrays),
    numpy scalars as Python numbers, paths as text; anything else as it is."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, PurePath):
        return str(obj)
    return obj

"""Evaluation reports (``.json``): written atomically with their kind and format version, read
and validated, and their accuracy tables checked (:func:`report_accuracies`).
"""

from __future__ import annotations

import json
from pathlib import Path

from fedalign.errors import FedalignError
from fedalign.files.outputs import _require_file
from fedalign.files.transactions import atomic_output

REPORT_KIND = "report"
REPORT_VERSION = 1


def write_report(path, report: dict) -> Path:
    """Write an evaluation report (JSON) atomically with kind and format_version."""
    payload = {"kind": REPORT_KIND, "format_version": REPORT_VERSION, **report}
    with atomic_output(path, suffix=".tmp.json") as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return Path(path)


def read_report(path) -> dict:
    """Read and validate a report file."""
    path = _require_file(path)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FedalignError(f"{path}: not a readable JSON report ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise FedalignError(f"{path}: not a fedalign report file")
    if data.get("format_version") != REPORT_VERSION:
        raise FedalignError(f"{path}: report format_version {data.get('format_version')} not supported")
    return data


def report_accuracies(report: dict, path) -> tuple[str, dict]:
    """Check the accuracy tables of a report and return ``(producer, results)``.

    ``evaluate`` reports hold ``methods: {method: {"summary": {domain: {"mean", "std"}}}}``
    (with a ``macro`` domain) and ``alignment: null | {"tau": τ, …}``; ``dadil-evaluate``
    reports hold ``summary: {method: {"mean", "std"}}``. ``results`` is the one present.
    """
    def mean_std(v, where):
        if not (isinstance(v, dict) and all(isinstance(v.get(k), (int, float))
                                             and not isinstance(v.get(k), bool)
                                             for k in ("mean", "std"))):
            raise FedalignError(f"{path}: {where} must be {{\"mean\": number, \"std\": number}}")

    if "methods" in report:
        methods = report["methods"]
        if not isinstance(methods, dict) or not methods:
            raise FedalignError(f"{path}: 'methods' must be a non-empty object of method results")
        for m, r in methods.items():
            summ = r.get("summary") if isinstance(r, dict) else None
            if not isinstance(summ, dict) or "macro" not in summ:
                raise FedalignError(f"{path}: methods.{m}.summary must be an object of per-domain "
                                    "accuracies with a 'macro' entry")
            for dom, v in summ.items():
                mean_std(v, f"methods.{m}.summary.{dom}")
        al = report.get("alignment")
        if al is not None and not (isinstance(al, dict) and isinstance(al.get("tau"), (int, float))):
            raise FedalignError(f"{path}: 'alignment' must be null or an object with a number 'tau'")
        return "evaluate", methods
    if "summary" in report:
        summ = report["summary"]
        if not isinstance(summ, dict) or not summ:
            raise FedalignError(f"{path}: 'summary' must be a non-empty object of method results")
        for m, v in summ.items():
            mean_std(v, f"summary.{m}")
        return "dadil-evaluate", summ
    raise FedalignError(f"{path}: report has no accuracy results (no 'methods' or 'summary'; "
                        f"producer {report.get('producer', 'unknown')!r})")

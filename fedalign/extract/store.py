"""The resumable partial file of an extraction.

Committed batches go to ``.<output name>.partial.h5`` next to the output, flushed after every
batch; batches are aligned to a fixed grid (batch k holds listing rows ``[kB, (k+1)B)``), so a
resumed run forms exactly the batches an uninterrupted one does and produces the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedalign import defaults

PARTIAL_FORMAT = 1



def partial_path(output) -> Path:
    """Deterministic temporary file next to ``output``: ``.<name>.partial.h5``."""
    output = Path(output)
    return output.with_name(f".{output.name}.partial.h5")


class PartialStore:
    """Committed batches of an extraction, flushed after every batch.

    Layout: datasets ``features`` (r, d) float32, ``index`` (r,) listing index per row,
    ``sha256`` (r,) file hash per row; attrs ``fingerprint`` (JSON of everything that
    determines the numbers), ``skipped`` (JSON list of ``[index, error]``), and the commit
    record ``rows`` / ``next`` written last, so anything after the last commit is discarded
    on reopening.
    """

    def __init__(self, path, d: int, fingerprint: dict, batch_rows: int):
        import h5py

        self.path = Path(path)
        self.fp = json.dumps(fingerprint, sort_keys=True)
        self.resumed = False
        self.discarded = None  # why an existing partial file was not resumed
        self.rows, self.next, self.skipped = 0, 0, []
        h5 = None
        if self.path.exists():
            try:
                h5 = h5py.File(self.path, "r+")
                if h5.attrs.get("fingerprint") != self.fp or h5.attrs.get("partial_format") != PARTIAL_FORMAT:
                    h5.close()
                    h5 = None
                    self.discarded = "it was made with other settings or inputs"
            except Exception:  # noqa: BLE001 - a damaged partial file is started over
                h5 = None
                self.discarded = "it is damaged"
        if h5 is not None:
            self.rows, self.next = int(h5.attrs["rows"]), int(h5.attrs["next"])
            self.skipped = [s for s in json.loads(h5.attrs["skipped"]) if s[0] < self.next]
            for name in ("features", "index", "sha256"):
                h5[name].resize(self.rows, axis=0)
            self.resumed = self.next > 0
        else:
            self.path.unlink(missing_ok=True)
            h5 = h5py.File(self.path, "w")
            h5.attrs["partial_format"] = PARTIAL_FORMAT
            h5.attrs["fingerprint"] = self.fp
            rows = max(1, min(batch_rows, 4096))  # HDF5 chunks (≤ 21 MB at d = 1280)
            h5.create_dataset("features", (0, d), maxshape=(None, d), dtype=np.float32, chunks=(rows, d))
            h5.create_dataset("index", (0,), maxshape=(None,), dtype=np.int64, chunks=(rows,))
            h5.create_dataset("sha256", (0,), maxshape=(None,), dtype="S64", chunks=(rows,))
            self._commit_attrs(h5)
            h5.flush()
        self._h5 = h5

    def _commit_attrs(self, h5):
        h5.attrs["skipped"] = json.dumps(self.skipped)
        h5.attrs["rows"] = self.rows
        h5.attrs["next"] = self.next

    def commit(self, X, index, shas, skipped, next_index: int) -> None:
        """Append one batch's rows and skipped items; record the new resume point."""
        h5, m = self._h5, len(index)
        if m:
            for name, val in (("features", X), ("index", index), ("sha256", shas)):
                h5[name].resize(self.rows + m, axis=0)
                h5[name][self.rows:] = val
        self.rows += m
        self.skipped += [[int(i), str(e)] for i, e in skipped]
        self.next = int(next_index)
        self._commit_attrs(h5)
        h5.flush()

    def iter_blocks(self, rows: int = defaults.CHUNK_ROWS):
        """Yield ``(X, index, sha256)`` blocks of the committed rows."""
        h5 = self._h5
        for s in range(0, self.rows, rows):
            e = min(self.rows, s + rows)
            yield (np.asarray(h5["features"][s:e]), np.asarray(h5["index"][s:e]),
                   [v.decode() for v in h5["sha256"][s:e]])

    def close(self):
        self._h5.close()

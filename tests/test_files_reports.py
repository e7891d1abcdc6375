"""Reports (fedalign.files.reports): JSON, written atomically, read and validated."""

import json

import pytest

from fedalign.errors import FedalignError
from fedalign.files import read_report, write_report


def test_report_roundtrip(tmp_path):
    write_report(tmp_path / "r.json", {"table": [1, 2]})
    assert read_report(tmp_path / "r.json")["table"] == [1, 2]
    (tmp_path / "x.json").write_text(json.dumps({"kind": "other"}))
    with pytest.raises(FedalignError):
        read_report(tmp_path / "x.json")

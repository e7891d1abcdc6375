"""The shared defaults and the one check of a seed's range (fedalign.defaults)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fedalign import defaults
from fedalign.defaults import MAX_SEED, check_seed
from fedalign.errors import FedalignError


def test_check_seed_takes_integers_in_the_32_bit_range():
    assert MAX_SEED == 2**32 - 1
    for seed in (0, 7, MAX_SEED, np.int64(3), np.uint32(MAX_SEED)):
        got = check_seed(seed)
        assert got == int(seed) and type(got) is int


@pytest.mark.parametrize("seed, shown", [(-1, "-1"), (2**32, "4294967296"),
                                         (np.int64(-5), "-5"), (True, "True"), (1.5, "1.5"),
                                         ("3", "'3'"), (None, "None")])
def test_check_seed_refuses_others_in_one_wording(seed, shown):
    with pytest.raises(FedalignError) as e:
        check_seed(seed, "run config gmm-seed", param="gmm_seed")
    assert str(e.value) == ("run config gmm-seed must be an integer in [0, 2**32 − 1 = "
                            "4294967295] (numpy's legacy generators and scikit-learn take "
                            f"32-bit seeds), got {shown}")
    assert e.value.param == "gmm_seed"
    with pytest.raises(FedalignError, match=r"^seed must be") as e:
        check_seed(seed)
    assert e.value.param is None


def test_the_seed_range_is_worded_in_defaults_only():
    """One home: no other library module spells the range's bound in a message."""
    root = Path(defaults.__file__).parent
    bound = re.compile(r"2\*\*32 − 1 =|= 2\*\*32 − 1|% \(2\*\*32")
    spelled = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
               if p.name != "defaults.py" and bound.search(p.read_text(encoding="utf-8"))]
    assert spelled == []

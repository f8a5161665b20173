"""Claim key_attention on small tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import (
    key_attention,
)
from claim_tables import (
    CFG,
    roles_all,
)


def test_key_attention_against_the_other_heads():
    rows = key_attention.score({"addition": roles_all(0.7, 0.2)}, CFG, seed=0)
    assert rows[1]["verdict"] == "holds" and rows[1]["value"] == pytest.approx(50, abs=3)
    rows = key_attention.score({"addition": roles_all(0.2, 0.2)}, CFG, seed=0)
    assert rows[1]["verdict"] in ("does not hold", "inconclusive")
    assert rows[1]["ci_low"] < 0 < rows[1]["ci_high"]

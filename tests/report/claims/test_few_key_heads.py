"""Claim few_key_heads on small tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import (
    few_key_heads,
)
from claim_tables import (
    CFG,
    effects_table,
    key_table,
)


def test_few_key_heads_counts_the_share_and_the_papers_threshold():
    eff = effects_table({(2, 1): -0.08, (2, 2): -0.02}, {}, n_layers=10, n_heads=4)  # 40 heads
    rows = few_key_heads.score({"addition": key_table(eff, ["L2H1"], [])}, {"addition": eff}, CFG)
    head, sub = rows
    assert sub["value"] == pytest.approx(100 / 40) and sub["verdict"] == "holds"
    assert "1 pass the paper's -5% threshold" in sub["note"]
    assert head["verdict"] == "holds" and head["scope"] == "all"
    # three of forty heads is 7.5%: more than 5%
    many = key_table(eff, ["L0H0", "L1H1", "L2H1"], [])
    assert few_key_heads.score({"addition": many}, {"addition": eff}, CFG)[1]["verdict"] == "does not hold"

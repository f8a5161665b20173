"""Claim mlp_answer on small tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import (
    mlp_answer,
)
from claim_tables import (
    CFG,
    effects_table,
    key_table,
    probes,
)


def test_mlp_answer_reads_the_key_mlps():
    eff = effects_table({}, {3: (-0.1, -0.12, -0.08)})
    keys = {"addition": key_table(eff, [], ["L3MLP"])}
    rows = mlp_answer.score({"addition": probes(0.2, 0.05)}, keys, CFG)
    assert rows[1]["verdict"] == "holds" and rows[1]["value"] == pytest.approx(0.15)
    rows = mlp_answer.score({"addition": probes(0.05, 0.2)}, keys, CFG)
    assert rows[1]["verdict"] == "does not hold"

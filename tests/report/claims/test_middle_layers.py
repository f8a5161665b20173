"""Claim middle_layers on small tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import (
    middle_layers,
)
from claim_tables import (
    CFG,
    effects_table,
    key_table,
)


def test_middle_layers_uses_relative_depth():
    eff = effects_table({}, {}, n_layers=11)
    mid = middle_layers.score({"addition": key_table(eff, ["L4H0", "L5H1", "L6H2"], [])}, 11, CFG)
    assert mid[0]["verdict"] == "holds" and mid[0]["value"] == pytest.approx(50.0)
    late = middle_layers.score({"addition": key_table(eff, ["L9H0", "L10H1"], [])}, 11, CFG)
    assert late[0]["verdict"] == "does not hold"
    some = middle_layers.score({"addition": key_table(eff, ["L5H0", "L9H1", "L10H1"], [])}, 11, CFG)
    assert some[0]["verdict"] == "partly"


def test_middle_band_is_the_papers_layers_12_to_17_of_32():
    # the band is fixed by the paper's own numbers (LLaMA2-7B, 32 layers), on the depth scale the rule uses
    low, high = CFG["middle_band"]
    assert (middle_layers.depth(12, 32) == pytest.approx(low, abs=5e-4)
            and middle_layers.depth(17, 32) == pytest.approx(high, abs=5e-4))
    # key heads at depth 0.6-0.7 (a wider 0.3-0.7 band called this "holds") lie outside it
    eff = effects_table({}, {}, n_layers=11)
    wide = middle_layers.score({"addition": key_table(eff, ["L6H0", "L7H1", "L7H2"], [])}, 11, CFG)
    assert wide[0]["verdict"] == "does not hold"

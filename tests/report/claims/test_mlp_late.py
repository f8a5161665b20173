"""Claim mlp_late on small tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import (
    mlp_late,
)
from claim_tables import (
    CFG,
    effects_table,
    key_table,
)


def test_mlp_late_compares_mlps_before_and_after_the_first_key_head():
    eff = effects_table({(2, 0): -0.01}, {0: (0.005, 0.004, 0.006), 3: (-0.03, -0.04, -0.02)})
    rows = mlp_late.score({"addition": key_table(eff, ["L2H0"], [])}, {"addition": eff}, CFG)
    assert rows[1]["value"] == pytest.approx(6.0) and rows[1]["verdict"] == "holds"
    # effects at their intervals' precision
    assert rows[1]["note"].startswith("later: L3MLP -3.0% [-4.0, -2.0]; earlier: L0MLP 0.50% in size")
    early = effects_table({(2, 0): -0.01}, {0: (0.05, 0.04, 0.06), 3: (-0.03, -0.04, -0.02)})
    rows = mlp_late.score({"addition": key_table(early, ["L2H0"], [])}, {"addition": early}, CFG)
    assert rows[1]["verdict"] == "does not hold"


def test_notes_print_the_same_text_when_the_last_digits_move():
    """An interval end that differs between two CPUs in its fourth digit (docs/performance.md, Reproducibility)
    leaves the note unchanged: it prints at the interval's precision, not at fixed decimals."""
    def note(ci_low):
        eff = effects_table({(2, 0): -0.01}, {0: (0.005, 0.004, 0.006), 3: (-0.1162, ci_low, -0.0576)})
        return mlp_late.score({"addition": key_table(eff, ["L2H0"], [])}, {"addition": eff}, CFG)[1]["note"]

    assert note(-0.16574) == note(-0.16576)
    assert note(-0.16574).startswith("later: L3MLP -12% [-17, -6];")

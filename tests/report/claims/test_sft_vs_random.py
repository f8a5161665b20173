"""Claim sft_vs_random on small study tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import sft_vs_random
from claim_tables import CFG, comparisons, study_table


def test_precise_against_as_many_layer_matched_random_heads():
    def row(difference: float, low: float, high: float) -> dict:
        (out,) = sft_vs_random.score(study_table(0.5, 0.2), comparisons([
            ("precise", "random_heads", "accuracy", difference, low, high)]), "add2", CFG)
        return out

    better = row(0.08, 0.03, 0.13)
    assert better["verdict"] == "holds" and better["value"] == pytest.approx(8.0) and better["scope"] == "all"
    assert row(-0.08, -0.13, -0.03)["verdict"] == "does not hold"
    assert row(0.01, -0.02, 0.04)["verdict"] == "does not hold"  # inside +-5 points: no difference that matters
    assert row(0.02, -0.06, 0.1)["verdict"] == "inconclusive"
    (missing,) = sft_vs_random.score(study_table(0.5, 0.2), comparisons([]), "add2", CFG)
    assert missing["verdict"] == "not measured" and "no precise and random_heads arms" in missing["note"]

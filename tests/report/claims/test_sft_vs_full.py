"""Claim sft_vs_full on small study tables whose answer is known."""

from __future__ import annotations

from arithmech.report.claims import sft_vs_full
from claim_tables import CFG, comparisons, study_table


def test_precise_within_the_margin_of_full_holds_and_clearly_behind_does_not():
    def row(low: float, high: float) -> dict:
        (out,) = sft_vs_full.score(study_table(0.5, 0.2), comparisons([("precise", "full", "accuracy",
                                                                         (low + high) / 2, low, high)]), "add2", CFG)
        return out

    assert row(-0.04, 0.02)["verdict"] == "holds"  # surely less than 5 points behind
    assert row(-0.3, -0.1)["verdict"] == "does not hold"  # surely behind
    close = row(-0.09, 0.01)  # may be more than 5 points behind, may be ahead
    assert close["verdict"] == "inconclusive" and "detects about" in close["note"]
    assert "above -5 points (non-inferior)" in close["rule"] and close["split"] == "test (add2)"
    assert sft_vs_full.score(study_table(0.5, 0.2), comparisons([]), "add2", CFG)[0]["note"] == (
        "the study has no precise and full arms")

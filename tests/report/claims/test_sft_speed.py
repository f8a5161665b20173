"""Claim sft_speed on small study tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import sft_speed
from claim_tables import CFG, comparisons, study_table


def test_the_step_time_ratio_of_the_chosen_runs():
    def row(full_s: float, precise_s: float) -> dict:
        (out,) = sft_speed.score(study_table(full_s, precise_s), comparisons([]), "add2", CFG)
        return out

    fast = row(0.5, 0.2)
    assert fast["verdict"] == "holds" and fast["value"] == pytest.approx(2.5)
    assert "1,179,648 against 134,515,008 trained parameters" in fast["note"]
    assert row(0.5, 0.48)["verdict"] == "partly"  # faster, less than min_speedup
    assert row(0.5, 0.6)["verdict"] == "does not hold"
    assert sft_speed.CLAIM.timing  # make docs leaves the wall-clock value out

"""Claim sft_off_target on small study tables whose answer is known."""

from __future__ import annotations

from arithmech.report.claims import sft_off_target
from claim_tables import CFG, comparisons, study_table


def test_lower_kl_and_no_worse_non_math_accuracy():
    comp = comparisons([("precise", "full", "kl_to_base", -0.02, -0.03, -0.01),
                        ("precise", "full", "social_iqa", 0.0, -0.03, 0.03),
                        ("precise", "full", "strategyqa", -0.2, -0.3, -0.1)])
    head, *subs = sft_off_target.score(study_table(0.5, 0.2), comp, "add2", CFG)
    by = {r["scope"]: r for r in subs}
    assert list(by) == ["KL to base", "social_iqa", "strategyqa"]
    assert by["KL to base"]["verdict"] == "holds" and by["KL to base"]["unit"] == "nats"
    assert by["social_iqa"]["verdict"] == "holds" and by["strategyqa"]["verdict"] == "does not hold"
    assert head["verdict"] == "partly" and "sub-rows: 2 holds, 1 does not hold" in head["note"]
    kl_only = sft_off_target.score(study_table(0.5, 0.2), comparisons([
        ("precise", "full", "kl_to_base", 0.02, 0.01, 0.03)]), "add2", CFG)
    assert kl_only[0]["verdict"] == "does not hold"  # more KL to base than full fine-tuning

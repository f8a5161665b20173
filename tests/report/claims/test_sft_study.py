"""The fine-tuning claims together on one study's tables: the study's positive control (precise learns), its
lr choice's flags and a study that did not run reach every claim that reads them (common.read_study)."""

from __future__ import annotations

import pandas as pd
import pytest

from claim_tables import (
    CFG,
    comparisons,
    study_claims,
    study_table,
)


def test_sft_claims_from_the_studys_comparisons():
    comp = comparisons([
        ("precise", "full", "accuracy", -0.01, -0.04, 0.02),  # within the 5-point margin
        ("precise", "random_heads", "accuracy", 0.08, 0.03, 0.13),
        ("precise", "full", "kl_to_base", -0.02, -0.03, -0.01),
        ("precise", "full", "social_iqa", 0.0, -0.15, 0.15),  # too few items
    ])
    rows = pd.DataFrame(study_claims(study_table(0.5, 0.2), comp, "add2", CFG))
    verdict = rows[rows["scope"] == "all"].set_index("claim")["verdict"]
    assert verdict["sft_vs_full"] == "holds" and verdict["sft_vs_random"] == "holds"
    assert verdict["sft_off_target"] == "partly" and verdict["sft_speed"] == "holds"
    social = rows[rows["scope"] == "social_iqa"].iloc[0]
    assert social["verdict"] == "inconclusive" and "detects about" in social["note"]
    speed = rows[rows["claim"] == "sft_speed"].iloc[0]
    assert speed["value"] == pytest.approx(2.5) and "1,179,648" in speed["note"]


def test_full_fine_tuning_clearly_better_does_not_hold():
    comp = comparisons([("precise", "full", "accuracy", -0.2, -0.3, -0.1)])
    rows = study_claims(study_table(0.5, 0.6), comp, "add2", CFG)
    by_claim = {r["claim"]: r["verdict"] for r in rows if r["scope"] == "all"}
    assert by_claim["sft_vs_full"] == "does not hold" and by_claim["sft_speed"] == "does not hold"
    assert by_claim["sft_vs_random"] == "not measured"


def test_precise_that_does_not_beat_the_base_model_reads_no_exact_match_verdict():
    """The positive control of the lr choice: with precise's chosen run no better than the base model on the
    trained format, the exact-match comparisons of precise with other arms are inconclusive, and say why."""
    rows = [("precise", "full", "accuracy", -0.2, -0.3, -0.1),
            ("precise", "random_heads", "accuracy", 0.08, 0.03, 0.13),
            ("precise", "base", "accuracy", 0.01, -0.03, 0.05)]
    by = {r["claim"]: r for r in study_claims(study_table(0.5, 0.2), comparisons(rows, learns=False), "add2",
                                                     CFG) if r["scope"] == "all"}
    for claim in ("sft_vs_full", "sft_vs_random"):
        assert by[claim]["verdict"] == "inconclusive"
        assert "precise does not beat the base model (the arms may not learn): precise - base +1.0" in by[claim]["note"]
    assert by["sft_speed"]["verdict"] == "holds"  # step time needs no learning


def test_the_lr_choice_flags_reach_the_study_rows():
    """study.parquet's lr_note and measured (sft.design.select_lr): an arm whose every lr collapsed leaves the rows
    that read it not measured, saying so; a chosen lr at its grid's edge is noted on the rows that read its arm."""
    study = study_table(0.5, 0.2).assign(lr_note=["lr 0.003 at the grid's lower edge: the best may lie below", ""],
                                         measured=[True, True])
    comp = comparisons([("precise", "full", "accuracy", -0.01, -0.04, 0.02),
                        ("precise", "random_heads", "accuracy", 0.08, 0.03, 0.13)])
    by = {r["claim"]: r for r in study_claims(study, comp, "add2", CFG) if r["scope"] == "all"}
    assert by["sft_vs_full"]["verdict"] == "holds"
    assert "precise: lr 0.003 at the grid's lower edge: the best may lie below" in by["sft_vs_full"]["note"]
    assert "precise learns: precise - base +30.0 points [+25.0, +35.0]" in by["sft_vs_full"]["note"]
    lost = study.assign(lr_note=["", "not measured: every learning rate of the grid collapsed (...)"],
                        measured=[True, False])
    by = {r["claim"]: r for r in study_claims(lost, comp, "add2", CFG) if r["scope"] == "all"}
    for claim in ("sft_vs_full", "sft_off_target", "sft_speed"):
        assert by[claim]["verdict"] == "not measured"
        assert by[claim]["note"].startswith("full: not measured: every learning rate of the grid collapsed")
    assert by["sft_vs_random"]["verdict"] == "holds"


def test_without_the_study_every_sft_claim_is_not_measured_and_says_why():
    rows = study_claims(None, None, "add2", CFG)
    assert {r["claim"] for r in rows} == {"sft_vs_full", "sft_vs_random", "sft_circuit_vs_precise", "sft_off_target",
                                          "sft_speed"}
    assert all(r["verdict"] == "not measured" and "did not run" in r["note"] for r in rows)

"""Claim sft_circuit_vs_precise on small study tables whose answer is known."""

from __future__ import annotations

import pandas as pd
import pytest

from claim_tables import (
    CFG,
    circuit_row,
    comparisons,
    study_claims,
    study_table,
)


def test_the_circuit_arm_against_the_precise_arm():
    comp = comparisons([("circuit", "precise", "accuracy", 0.08, 0.03, 0.13)])
    study = pd.concat([study_table(0.5, 0.2), study_table(0.5, 0.2).iloc[:1].assign(arm="circuit")])
    study = study.assign(model_dtype="float32", master_dtype="float32")
    (row,) = [r for r in study_claims(study, comp, "add2", CFG) if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "holds" and row["value"] == pytest.approx(8.0) and row["scope"] == "all"
    assert "circuit float32 / float32, precise float32 / float32" in row["note"]
    worse = comparisons([("circuit", "precise", "accuracy", -0.08, -0.13, -0.03),
                         ("precise", "low_effect", "accuracy", 0.1, 0.05, 0.15)])  # with its positive control
    (row,) = [r for r in study_claims(study, worse, "add2", CFG) if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "does not hold"
    close = comparisons([("circuit", "precise", "accuracy", 0.0, -0.09, 0.09)])  # reaches 5 points both ways
    (row,) = [r for r in study_claims(study, close, "add2", CFG) if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "inconclusive" and "detects about" in row["note"]
    # a study without the circuit arm: the row says the arm did not run, the other rows are unaffected
    rows = study_claims(study_table(0.5, 0.2),
                               comparisons([("precise", "full", "accuracy", -0.01, -0.04, 0.02)]), "add2", CFG)
    (row,) = [r for r in rows if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "not measured" and "circuit arm did not run" in row["note"]
    assert {r["claim"]: r["verdict"] for r in rows if r["scope"] == "all"}["sft_vs_full"] == "holds"


def test_the_circuit_arm_reads_does_not_hold_only_with_a_positive_control():
    """circuit - precise inside +-5 points is "does not hold" only when the same study separates the key heads from
    the negative control (precise - low_effect above 0); without that arm, or with the control failing, it is
    inconclusive, and the note says which. A circuit arm that beats precise needs no control: that is a separation."""
    study = pd.concat([study_table(0.5, 0.2),
                       study_table(0.5, 0.2).iloc[:1].assign(arm="circuit", n_heads=16, overlap_precise=13,
                                                              jaccard_precise=13 / 19)])
    same = ("circuit", "precise", "accuracy", -0.002, -0.03, 0.028)  # the default run's -0.2 [-3.2, +2.8]
    no_control = circuit_row(study, [same])
    assert no_control["verdict"] == "inconclusive"
    assert "no positive control: the study ran no low_effect arm" in no_control["note"]
    assert POSITIVE_CONTROL in no_control["rule"]
    failed = circuit_row(study, [same, ("precise", "low_effect", "accuracy", 0.01, -0.02, 0.04)])
    assert failed["verdict"] == "inconclusive" and "positive control failed" in failed["note"]
    passed = circuit_row(study, [same, ("precise", "low_effect", "accuracy", 0.12, 0.08, 0.16),
                                  ("circuit_disjoint", "precise", "accuracy", -0.05, -0.09, -0.01)])
    assert passed["verdict"] == "does not hold"
    assert "positive control passed: precise - low_effect +12.0 points [+8.0, +16.0]" in passed["note"]
    assert "circuit shares 13 of its 16 heads with precise (Jaccard 0.68)" in passed["note"]
    assert "circuit_disjoint - precise -5.0 points [-9.0, -1.0]" in passed["note"]
    better = circuit_row(study, [("circuit", "precise", "accuracy", 0.08, 0.03, 0.13)])
    assert better["verdict"] == "holds"


POSITIVE_CONTROL = "stands only if the same study's positive control holds"

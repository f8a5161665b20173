"""Claim circuit_sufficient on small tables whose answer is known."""

from __future__ import annotations

import pytest

from arithmech.report.claims import (
    circuit_sufficient,
)
from claim_tables import (
    CFG,
    circuit_items,
    tf_circuit_items,
)


def test_circuit_sufficient_without_teacher_forced_scores_is_not_measured():
    """An operator whose discover items lack the teacher-forced columns, or has none, is not measured; the scorecard
    without the discover rule's items says the rule did not run."""
    rows = circuit_sufficient.score({"addition": circuit_items(0.95, 0.1), "division": None}, CFG, seed=0)
    by = {r["scope"]: r for r in rows}
    assert by["addition"]["verdict"] == by["division"]["verdict"] == "not measured"
    assert "no teacher-forced scores" in by["division"]["note"] and rows[0]["claim"] == "circuit_sufficient"


def test_circuit_sufficient_on_the_teacher_forced_protocol():
    """The key circuit read on the teacher-forced columns with the discovered circuit's rule (size aside): every
    outcome the rule names, from the discover rule's per-item table layout."""
    def verdict(items):
        return circuit_sufficient.score({"addition": items}, CFG, seed=0)[1]

    holds = verdict(tf_circuit_items(0.95, 0.1))
    assert holds["verdict"] == "holds" and holds["value"] == pytest.approx(95.0) and holds["n"] == 120
    assert "resample: holds" in holds["note"] and "older protocol" not in holds["note"]
    assert verdict(tf_circuit_items(0.95, 0.1, n=40))["verdict"] == "inconclusive"  # fewer than 96 pairs
    assert verdict(tf_circuit_items(0.95, 0.1, logprob_f=1.5))["verdict"] == "does not hold"  # overshoot
    assert verdict(tf_circuit_items(0.3, 0.1))["verdict"] == "does not hold"  # keeps far less than 80%
    assert verdict(tf_circuit_items(0.95, 0.8))["verdict"] == "does not hold"  # no better than random by 0.3
    assert verdict(tf_circuit_items(0.95, 0.1, resample_key=0.3))["verdict"] == "inconclusive"  # ablations disagree
    failed = verdict(tf_circuit_items(0.95, 0.1, failed="one random node"))
    assert failed["verdict"] == "inconclusive"
    assert failed["note"].startswith("inconclusive: the resample ablation failed a sanity check, so its numbers cannot "
                                     "decide (one random node)")
    # a failed check decides the row whatever the other ablation says: here both would not hold
    both_fail = verdict(tf_circuit_items(0.3, 0.1, failed="one random node"))
    assert both_fail["verdict"] == "inconclusive" and "one random node" in both_fail["note"]

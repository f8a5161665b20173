"""Claim circuit_faithful on small discover summaries whose answer is known."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from arithmech.report.claims import (
    circuit_faithful,
)
from claim_tables import (
    CFG,
    discover_summary,
    tf_columns,
)


def test_a_small_faithful_circuit_on_the_teacher_forced_protocol():
    """The rule fixed before the numbers: >= 96 pairs, small, full-answer faithfulness's lower end >= 80%, log-prob
    faithfulness in [0.8, 1.2] (overshoot is not free), >= 0.3 over random circuits, the same under both ablations."""
    cases = {
        "holds": tf_columns(),
        "few pairs": tf_columns(tf_n_items=48),
        "overshoot": tf_columns(logprob=(1.4, 1.3, 1.5)),
        "below 80%": tf_columns(correct=(0.6, 0.5, 0.7)),
        "straddles 80%": tf_columns(correct=(0.85, 0.7, 0.95)),
        "random as good": tf_columns(random_diff=(0.1, -0.05, 0.2)),
        "ablations disagree": tf_columns(kinds=("resample",)) | tf_columns(correct=(0.5, 0.4, 0.6), kinds=("mean",)),
        "sanity failed": tf_columns(tf_resample_sanity_failed="one node ablated: 0.94 < 0.95",
                                    tf_mean_sanity_failed=""),
    }
    summary = pd.concat([discover_summary(task, [cols]) for task, cols in cases.items()], ignore_index=True)
    summary = pd.concat([summary, discover_summary("too large", [tf_columns() | {"share": 0.4}])], ignore_index=True)
    rows = circuit_faithful.score(summary, CFG)
    by = {r["scope"]: r for r in rows[1:]}
    assert by["holds"]["verdict"] == "holds" and by["holds"]["value"] == pytest.approx(90.0)
    assert by["few pairs"]["verdict"] == "inconclusive" and "fewer than the 96" in by["few pairs"]["note"]
    assert by["overshoot"]["verdict"] == "does not hold"
    assert by["below 80%"]["verdict"] == "does not hold"
    assert by["straddles 80%"]["verdict"] == "inconclusive"
    assert by["random as good"]["verdict"] == "does not hold"
    assert by["ablations disagree"]["verdict"] == "inconclusive"
    assert by["sanity failed"]["verdict"] == "inconclusive"
    assert by["sanity failed"]["note"].startswith("inconclusive: the resample ablation failed a sanity check")
    assert "one node ablated: 0.94 < 0.95" in by["sanity failed"]["note"]
    assert by["too large"]["verdict"] == "does not hold"
    assert "older protocol" not in by["holds"]["note"] and rows[0]["verdict"] == "partly"


def test_the_shared_circuit_is_its_own_sub_row():
    """The shared circuit (task 'shared': pruned on every operator's pairs together) is a sub-row of its own after
    the union, judged by the same rule, its note saying what it was pruned on; a fit gap above max_fit_gap makes it
    inconclusive as it does an operator's row."""
    summary = pd.concat([discover_summary("addition", [tf_columns()]),
                         discover_summary("union", [tf_columns() | {"target": math.nan}]),
                         discover_summary("shared", [tf_columns() | {"target": 0.9}])], ignore_index=True)
    rows = circuit_faithful.score(summary, CFG)
    by = {r["scope"]: r for r in rows[1:]}
    assert list(by) == ["addition", "union of the operators", "shared circuit of the operators"]
    shared = by["shared circuit of the operators"]
    assert shared["verdict"] == "holds" and shared["value"] == pytest.approx(90.0)
    assert "found at target 0.9 of the tf_mean_logprob on every operator's identification pairs together" in (
        shared["note"])
    gap = CFG["max_fit_gap"] + 0.05  # fitted that much better on its pruning pairs than on validation (0.9)
    fitted = summary.assign(tf_mean_correct_identification=[math.nan, math.nan, 0.9 + gap],
                            tf_mean_gap=[math.nan, math.nan, gap])
    assert circuit_faithful.score(fitted, CFG)[-1]["verdict"] == "inconclusive"


def test_the_chosen_targets_circuit_and_its_size():
    """Per operator the chosen target's row (the smallest chosen), or the largest target's where none was chosen, said
    in the note; a circuit above max_circuit_share does not hold, however faithful."""
    summary = pd.concat([
        discover_summary("addition", [{}]),
        # too large: a quarter of the nodes is the most a small circuit may have
        discover_summary("subtraction", [{"share": 0.4, "n_heads": 100, "n_mlps": 20}]),
        # no target kept 80% of the full answers: the largest target's circuit is scored, and falls short
        discover_summary("division", [tf_columns(target=0.8, chosen=False),
                                      tf_columns(correct=(0.6, 0.5, 0.7), target=0.95, chosen=False)]),
        # the chosen target's row, not the others
        discover_summary("union", [tf_columns(correct=(0.6, 0.5, 0.7), target=0.8, chosen=False),
                                   {"target": 0.9, "chosen": True}, {"target": 0.95, "chosen": True}]),
    ], ignore_index=True)
    rows = circuit_faithful.score(summary, CFG)
    by = {r["scope"]: r for r in rows}
    assert list(by) == ["all", "addition", "subtraction", "division", "union of the operators"]
    assert by["addition"]["verdict"] == "holds" and by["addition"]["value"] == pytest.approx(90.0)
    assert by["addition"]["ci_low"] == pytest.approx(85.0) and by["addition"]["n"] == 120
    assert "20 heads + 10 MLPs (10.0% of nodes)" in by["addition"]["note"]
    assert "resample: holds; full answers 90% [85, 95]" in by["addition"]["note"]
    assert "circuit - random +60 [+50, +70] points" in by["addition"]["note"]
    assert by["subtraction"]["verdict"] == "does not hold" and "more than 25%" in by["subtraction"]["note"]
    assert by["division"]["verdict"] == "does not hold" and "target 0.95" in by["division"]["note"]
    assert "the largest target's is scored" in by["division"]["note"]
    assert (by["union of the operators"]["verdict"] == "holds"
            and "found at target 0.9 " in by["union of the operators"]["note"])
    assert rows[0]["verdict"] == "partly" and rows[0]["claim"] == "circuit_faithful"
    # no more than max_circuit_share: the same circuit is too large under a stricter setting
    strict = circuit_faithful.score(discover_summary("addition", [{}]), CFG | {"max_circuit_share": 0.05})
    assert strict[1]["verdict"] == "does not hold"


def test_a_circuit_without_its_discovery_is_not_run():
    rows = circuit_faithful.score(None, CFG)
    assert len(rows) == 1 and rows[0]["verdict"] == "not measured" and "did not run" in rows[0]["note"]
    # the model answers nothing in full: faithfulness is undefined under both ablations
    nan = {f"tf_{k}_correct{x}": math.nan for k in ("resample", "mean") for x in ("", "_low", "_high")}
    undefined = circuit_faithful.score(discover_summary("addition", [nan]), CFG)
    assert undefined[1]["verdict"] == "not measured" and undefined[1]["value"] == pytest.approx(10.0)
    # a summary without a column the claim reads fails naming it, rather than scoring something else
    renamed = discover_summary("addition", [{}]).rename(columns={"tf_mean_random_diff_low": "ci_low"})
    with pytest.raises(ValueError, match="tf_mean_random_diff_low"):
        circuit_faithful.score(renamed, CFG)
    named = circuit_faithful.score(discover_summary("addition", [{"pruned_on": "tf_mean_kl"}]), CFG)
    assert "found at target 0.8 of the tf_mean_kl;" in named[1]["note"]
    # as the discover rule writes them: a chosen target that reached no share, and the union without a target
    written = pd.concat([discover_summary("addition", [{"target": 0.95, "share_reached": False}]),
                         discover_summary("union", [{"target": math.nan, "share_reached": math.nan}])],
                        ignore_index=True)
    notes = {r["scope"]: r["note"] for r in circuit_faithful.score(written, CFG)}
    assert notes["addition"].startswith("found at target 0.95 of the tf_mean_logprob (no target's circuit kept enough")
    assert (notes["union of the operators"].startswith("the union of the operators' chosen circuits;")
            and "nan" not in notes["union of the operators"])


def test_a_circuit_fitted_to_its_pruning_pairs_is_inconclusive_naming_the_gap():
    """tf_<kind>_gap (identification minus validation full-answer faithfulness) above claims.max_fit_gap: the row is
    inconclusive, naming both numbers; within it, or without the columns (older tables), as before."""
    def gap_columns(ident_resample, ident_mean):
        return tf_columns(tf_resample_correct_identification=ident_resample, tf_resample_gap=ident_resample - 0.9,
                          tf_mean_correct_identification=ident_mean, tf_mean_gap=ident_mean - 0.9)

    summary = pd.concat([discover_summary("addition", [gap_columns(1.0, 0.95)]),
                         discover_summary("subtraction", [gap_columns(0.95, 0.92)]),
                         discover_summary("division", [tf_columns()])], ignore_index=True)
    by = {r["scope"]: r for r in circuit_faithful.score(summary, CFG)}
    assert by["addition"]["verdict"] == "holds" and "fitted" not in by["addition"]["note"]  # 0.1 is not above 0.1
    summary.loc[0, "tf_resample_correct_identification"], summary.loc[0, "tf_resample_gap"] = 1.0, 0.25
    by = {r["scope"]: r for r in circuit_faithful.score(summary, CFG)}
    assert by["addition"]["verdict"] == "inconclusive"
    assert by["addition"]["note"].startswith("inconclusive: resample: fitted 100% on identification, 90% on "
                                             "validation: gap 25 points above 10: the circuit is fitted to its "
                                             "pruning pairs")
    assert by["subtraction"]["verdict"] == "holds" and "fitted" not in by["subtraction"]["note"]
    assert by["division"]["verdict"] == "holds"
    assert "more than 10 points" in by["addition"]["rule"]
    # a stricter setting makes the subtraction circuit's gap of 5 points too large
    strict = {r["scope"]: r for r in circuit_faithful.score(summary, CFG | {"max_fit_gap": 0.02})}
    assert strict["subtraction"]["verdict"] == "inconclusive"
    assert "gap 5 points above 2" in strict["subtraction"]["note"]


def test_the_pruning_orders_flag_is_a_note_on_the_circuit_rows():
    flag = "the union (36 nodes, f 0.76 [0.69, 0.83]) lies above the order's curve at 20% of the nodes (0.28)"
    summary = pd.concat([discover_summary("addition", [tf_columns(cpr_order_flag=flag)]),
                         discover_summary("division", [tf_columns(cpr_order_flag="")])], ignore_index=True)
    by = {r["scope"]: r for r in circuit_faithful.score(summary, CFG)}
    assert "pruning order: " + flag in by["addition"]["note"] and by["addition"]["verdict"] == "holds"
    assert "pruning order" not in by["division"]["note"]

"""The verdict logic the claims share (arithmech.report.claims.common): directional tests, combining sub-rows,
degenerate comparisons, and a failed sanity check, across the claims that read them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from arithmech.report.claims import (
    circuit_faithful,
    circuit_sufficient,
    common,
    heads_via_mlps,
    knockout_collapse,
    transfer,
)
from claim_tables import (
    CFG,
    FAILED,
    circuit_row,
    comparisons,
    discover_summary,
    knockout_items,
    path_cuts,
    study_claims,
    study_table,
    tf_circuit_items,
    tf_columns,
    transfer_items,
)


@pytest.mark.parametrize(
    "low, high, direction, expected",
    [
        (-0.3, -0.1, -1, "holds"),
        (0.1, 0.3, -1, "does not hold"),  # the wrong side of 0
        (-0.01, 0.02, -1, "does not hold"),  # inside +-0.05: no difference that matters
        (-0.2, 0.02, -1, "inconclusive"),  # includes 0 and reaches -0.05
        (0.1, 0.3, +1, "holds"),
        (-0.2, 0.02, +1, "inconclusive"),
        (math.nan, 0.1, +1, "not measured"),
    ],
)
def test_directional_verdicts(low, high, direction, expected):
    assert common.directional(low, high, direction=direction, min_effect=0.05) == expected


def test_an_underpowered_interval_is_never_does_not_hold():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        low = rng.uniform(-1, 0)
        high = rng.uniform(0, 1)
        verdict = common.directional(low, high, direction=-1, min_effect=0.05)
        reaches = low <= -0.05 or high >= 0.05
        assert verdict == ("inconclusive" if reaches else "does not hold")


def test_detectable_difference_is_143_half_widths():
    assert common.detectable(-0.1, 0.1) == pytest.approx(0.1 * 2.8016 / 1.96, rel=1e-3)


@pytest.mark.parametrize(
    "parts, expected",
    [
        (["holds", "holds"], "holds"),
        (["holds", "not measured"], "holds"),
        (["holds", "does not hold"], "partly"),
        (["does not hold", "inconclusive"], "does not hold"),
        (["inconclusive", "inconclusive"], "inconclusive"),
        (["partly", "does not hold"], "partly"),
        (["not measured"], "not measured"),
        ([], "not measured"),
    ],
)
def test_combine(parts, expected):
    assert common.combine(parts) == expected


def test_a_zero_width_interval_at_0_is_not_measured_never_a_power_statement():
    """Arms that answer identically on every item give every resample the same 0: no verdict, no power statement."""
    assert common.directional(0.0, 0.0, direction=+1, min_effect=0.05) == "not measured"
    assert common.directional(-0.2, -0.2, direction=-1, min_effect=0.05) == "holds"  # every item lost: measured
    assert common.non_inferior(pd.Series({"ci_low": 0.0, "ci_high": 0.0}), 0.05) == "not measured"
    for verdict in common.VERDICTS:
        assert common.interval_note(0.0, 0.0, verdict) == common.IDENTICAL


def test_every_paired_comparison_names_identical_arms():
    """Knockout, transfer, the circuit rows and the study's rows: identical arms read "not measured: the arms
    answered identically", and no row anywhere says "detects about 0.0"."""
    rows = []
    # knockout: the top K and the random heads right on the same items
    same = knockout_items("addition", 1.0, 1.0)
    ko = knockout_collapse.score({"addition": same}, CFG, seed=0)
    assert ko[1]["verdict"] == "not measured" and common.IDENTICAL in ko[1]["note"]
    rows += ko
    # transfer: key and random heads keep every item
    tr = {r["scope"]: r for r in transfer.score(
        transfer_items({"operator": 1.0, "svamp": 1.0, "non_math": 1.0},
                       {"operator": 1.0, "svamp": 1.0, "non_math": 1.0}), CFG, seed=0)}
    for scope in ("other operators", "SVAMP", "non-math control"):
        assert tr[scope]["verdict"] == "not measured" and common.IDENTICAL in tr[scope]["note"]
    rows += list(tr.values())
    # the study: Gemma's circuit - precise 0.0 [0.0, 0.0]
    study = pd.concat([study_table(0.5, 0.2), study_table(0.5, 0.2).iloc[:1].assign(arm="circuit")])
    circuit = circuit_row(study, [("circuit", "precise", "accuracy", 0.0, 0.0, 0.0)])
    assert circuit["verdict"] == "not measured" and circuit["note"].startswith(common.IDENTICAL)
    sft = study_claims(study_table(0.5, 0.2), comparisons([
        ("precise", "full", "accuracy", 0.0, 0.0, 0.0), ("precise", "random_heads", "accuracy", 0.0, 0.0, 0.0),
        ("precise", "full", "social_iqa", 0.0, 0.0, 0.0)]), "add2", CFG)
    for r in sft:
        if r["claim"] in ("sft_vs_full", "sft_vs_random") or r["scope"] == "social_iqa":
            assert r["verdict"] == "not measured" and common.IDENTICAL in r["note"], r
    rows += [circuit, *sft]
    # the discovered circuit against random circuits that score exactly as it does: no evidence either way
    tf = circuit_faithful.score(discover_summary("addition", [tf_columns(random_diff=(0.0, 0.0, 0.0))]), CFG)[1]
    assert tf["verdict"] == "inconclusive" and "circuit - random " + common.IDENTICAL in tf["note"]
    rows += [tf]
    assert not any("detects about 0.0 " in r["note"] or "detects about 0 " in r["note"] for r in rows)


def test_a_failed_sanity_check_makes_every_row_on_that_ablation_inconclusive():
    """Every row read from an ablation whose check failed (circuit.discover.sanity: warn) is inconclusive and names
    the check: the discovered circuits (per operator and their union, even one that would not hold on its size),
    the key circuit, and the key heads' path cuts; the headline says which rows."""
    failed = {"tf_resample_sanity_failed": FAILED, "tf_mean_sanity_failed": ""}
    summary = pd.concat([discover_summary("addition", [tf_columns(**failed)]),
                         discover_summary("subtraction", [tf_columns(**failed) | {"share": 0.4}]),
                         discover_summary("multiplication", [tf_columns(tf_resample_sanity_failed="",
                                                                        tf_mean_sanity_failed="")]),
                         discover_summary("union", [tf_columns(tf_resample_sanity_failed="addition: " + FAILED,
                                                               tf_mean_sanity_failed="") | {"target": math.nan}])],
                        ignore_index=True)
    rows = circuit_faithful.score(summary, CFG)
    by = {r["scope"]: r for r in rows}
    for scope in ("addition", "subtraction", "union of the operators"):
        assert by[scope]["verdict"] == "inconclusive", scope
        assert by[scope]["note"].startswith("inconclusive: the resample ablation failed a sanity check"), scope
        assert "'one node ablated'" in by[scope]["note"]
    assert by["multiplication"]["verdict"] == "holds"
    assert ("the resample ablation failed a sanity check on addition, subtraction, union of the operators"
            in by["all"]["note"])
    # the key circuit, from the discover rule's per-item table
    items = tf_circuit_items(0.95, 0.1, failed=FAILED)
    key = circuit_sufficient.score({"addition": items}, CFG, seed=0)
    assert key[1]["verdict"] == "inconclusive" and "'one node ablated'" in key[1]["note"]
    assert "the resample ablation failed a sanity check on addition" in key[0]["note"]
    # the key heads' edges, cut under the same ablations: the discover rule's checks decide them too
    cuts = {"addition": path_cuts(0.5, 0.1, 0.6), "subtraction": path_cuts(0.5, 0.1, 0.6)}
    clean = heads_via_mlps.score(cuts, CFG, seed=0)
    assert {r["scope"]: r["verdict"] for r in clean}["addition"] == "holds"
    paths = heads_via_mlps.score(cuts, CFG, seed=0, sanity={"addition": {"mean": FAILED}, "subtraction": {}})
    by = {r["scope"]: r for r in paths}
    assert by["addition"]["verdict"] == "inconclusive" and by["addition"]["note"].startswith(
        "inconclusive: the mean ablation failed a sanity check")
    assert by["subtraction"]["verdict"] == "holds"
    assert common.failed_checks(items, ("resample", "mean")) == {"resample": FAILED}
    assert common.failed_checks(None, ("resample", "mean")) == {}


def test_a_failed_check_on_a_model_that_answers_nothing_leaves_the_row_not_measured():
    """Nothing to read (the full model gets no item right: every faithfulness 0/0) stays "not measured" when a check
    failed too (the tiny workflow's random model); the note still names the check. Measured, it is inconclusive."""
    items = tf_circuit_items(0.95, 0.1, failed=FAILED)
    for kind in ("resample", "mean"):
        items[f"tf_{kind}_tail_correct"] = 0.0
    row = circuit_sufficient.score({"addition": items}, CFG, seed=0)[1]
    assert row["verdict"] == "not measured" and "'one node ablated'" in row["note"]
    measured = circuit_sufficient.score({"addition": tf_circuit_items(0.95, 0.1, failed=FAILED)}, CFG, seed=0)
    assert measured[1]["verdict"] == "inconclusive"
    nan = {c: math.nan for c in tf_columns() if c.startswith("tf_") and not c.endswith("sanity_failed")
           and c != "tf_n_items"}
    summary = discover_summary("addition", [tf_columns(tf_resample_sanity_failed=FAILED, tf_mean_sanity_failed="")
                                            | nan])
    faithful = {r["scope"]: r for r in circuit_faithful.score(summary, CFG)}["addition"]
    assert faithful["verdict"] == "not measured" and "'one node ablated'" in faithful["note"]

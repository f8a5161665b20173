"""Claim transfer on small tables whose answer is known."""

from __future__ import annotations

import pandas as pd

from arithmech.report.claims import (
    transfer,
)
from claim_tables import (
    CFG,
    transfer_items,
)


def test_transfer_hurts_math_and_spares_non_math():
    items = transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.9},
                           {"operator": 0.9, "svamp": 0.8, "non_math": 0.9})
    rows = transfer.score(items, CFG, seed=0)
    by_scope = {r["scope"]: r["verdict"] for r in rows}
    assert by_scope["other operators"] == "holds" and by_scope["SVAMP"] == "holds"
    assert by_scope["non-math control"] in ("holds", "inconclusive")
    assert rows[0]["scope"] == "all"
    hurt = transfer.score(transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.2},
                                          {"operator": 0.9, "svamp": 0.8, "non_math": 0.9}), CFG, seed=0)
    assert {r["scope"]: r["verdict"] for r in hurt}["non-math control"] == "does not hold"
    assert hurt[0]["verdict"] == "partly"


def test_transfer_scores_only_the_items_the_intact_model_gets_right():
    items = transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.9},
                           {"operator": 0.9, "svamp": 0.8, "non_math": 0.9})
    wrong = (items["heads"] == "none") & (items["target_kind"] == "svamp")
    items.loc[wrong, "correct"] = False  # the intact model answers no SVAMP item
    rows = {r["scope"]: r for r in transfer.score(items, CFG, seed=0)}
    assert rows["SVAMP"]["verdict"] == "not measured" and "answers none" in rows["SVAMP"]["note"]
    half = items.copy()
    half.loc[(half["heads"] == "none") & (half["target_kind"] == "operator") & (half["item"] % 2 == 1),
             "correct"] = False
    assert {r["scope"]: r for r in transfer.score(half, CFG, seed=0)}["other operators"]["n"] == 40


def test_transfer_leaves_out_a_source_operators_own_pairs():
    items = transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.9},
                           {"operator": 0.9, "svamp": 0.8, "non_math": 0.9})
    own = items[items["target_kind"] == "operator"].assign(target="addition")  # the source's own pairs
    rows = transfer.score(pd.concat([items[items["target_kind"] != "operator"], own]), CFG, seed=0)
    assert "other operators" not in {r["scope"] for r in rows}

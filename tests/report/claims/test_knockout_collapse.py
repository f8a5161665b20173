"""Claim knockout_collapse on small tables whose answer is known."""

from __future__ import annotations

import re

import pytest

from arithmech.report.claims import (
    knockout_collapse,
)
from claim_tables import (
    CFG,
    knockout_items,
)


def test_knockout_collapse_against_random_heads():
    items = knockout_items("addition", 0.2, 0.95)
    rows = knockout_collapse.score({"addition": items}, CFG, seed=0)
    head, subs = rows[0], rows[1:]
    assert [s["scope"] for s in subs] == ["addition · end · full answer", "addition · end · first token"]
    assert all(s["verdict"] == "holds" for s in subs) and head["verdict"] == "holds"
    # the value: top-K accuracy minus the layer-matched draws' mean accuracy, in points
    top = items[(items["curve"] == "top_heads") & (items["k"] == 3)]["full_correct"].mean()
    matched = items[items["curve"] == "random_layer_matched"]["full_correct"].mean()
    assert subs[0]["value"] == pytest.approx(100 * (top - matched))
    assert subs[0]["ci_low"] < subs[0]["value"] < subs[0]["ci_high"] < 0
    assert subs[0]["unit"] == "points" and subs[0]["n"] == 120
    # accuracies are counts (exact); the resampled differences print at their intervals' precision
    assert re.search(r"accuracy 100\.0% -> \d+\.\d% .*layer-matched \d+\.\d% \(difference -\d+ \[-\d+, -\d+\]\)",
                     subs[0]["note"]), subs[0]["note"]


def test_a_small_drop_that_random_heads_share_is_not_a_collapse():
    rows = knockout_collapse.score({"addition": knockout_items("addition", 0.9, 0.9)}, CFG, seed=0)
    assert rows[0]["verdict"] in ("does not hold", "inconclusive")
    # beating random heads without a 50% drop is only partly the paper's claim
    rows = knockout_collapse.score({"addition": knockout_items("addition", 0.7, 0.97)}, CFG, seed=0)
    assert rows[1]["verdict"] == "partly"


def test_knockout_too_few_items_is_inconclusive_with_the_detectable_difference():
    rows = knockout_collapse.score({"addition": knockout_items("addition", 0.85, 0.95, n_pairs=4, per_pair=2)},
                                    CFG, seed=1)
    sub = rows[1]
    assert sub["verdict"] == "inconclusive" and "detects about" in sub["note"]
    # two significant digits, like the interval's width it comes from
    assert re.search(r"detects about \d\d points with 80% power", sub["note"]), sub["note"]


def test_knockout_of_a_model_that_answers_nothing_is_not_measured():
    items = knockout_items("addition", 0.0, 0.0)
    items["full_correct"] = items["first_correct"] = False
    rows = knockout_collapse.score({"addition": items}, CFG, seed=0)
    assert all(r["verdict"] == "not measured" for r in rows)

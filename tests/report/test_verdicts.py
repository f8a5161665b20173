"""The claims scorecard: the verdict rules, and each claim on small tables whose answer is known."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import yaml

from arithmech.report import verdicts
from helpers import ROOT

CFG = yaml.safe_load(open("config.yaml"))["claims"] | {"bootstrap": 400}


# ------------------------------------------------------------------------------------------------ rules
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
    assert verdicts.directional(low, high, direction=direction, min_effect=0.05) == expected


def test_an_underpowered_interval_is_never_does_not_hold():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        low = rng.uniform(-1, 0)
        high = rng.uniform(0, 1)
        verdict = verdicts.directional(low, high, direction=-1, min_effect=0.05)
        reaches = low <= -0.05 or high >= 0.05
        assert verdict == ("inconclusive" if reaches else "does not hold")


def test_detectable_difference_is_143_half_widths():
    assert verdicts.detectable(-0.1, 0.1) == pytest.approx(0.1 * 2.8016 / 1.96, rel=1e-3)


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
    assert verdicts.combine(parts) == expected


# ------------------------------------------------------------------------------------------------ identify
def effects_table(head_effects: dict[tuple[int, int], float], mlp_effects: dict[int, tuple[float, float, float]],
                  n_layers: int = 4, n_heads: int = 4) -> pd.DataFrame:
    rows = []
    for l in range(n_layers):
        for h in range(n_heads):
            e = head_effects.get((l, h), 0.0)
            rows.append({"node": f"L{l}H{h}", "layer": l, "head": h, "component": "head", "mean_effect": e,
                         "ci_low": e - 0.001, "ci_high": e + 0.001, "n": 50})
        m, lo, hi = mlp_effects.get(l, (0.0, -0.001, 0.001))
        rows.append({"node": f"L{l}MLP", "layer": l, "head": np.nan, "component": "mlp", "mean_effect": m,
                     "ci_low": lo, "ci_high": hi, "n": 50})
    return pd.DataFrame(rows)


def key_table(effects: pd.DataFrame, heads: list[str], mlps: list[str]) -> pd.DataFrame:
    return effects[effects["node"].isin(heads + mlps)].copy()


def test_few_key_heads_counts_the_share_and_the_papers_threshold():
    eff = effects_table({(2, 1): -0.08, (2, 2): -0.02}, {}, n_layers=10, n_heads=4)  # 40 heads
    rows = verdicts.few_key_heads({"addition": key_table(eff, ["L2H1"], [])}, {"addition": eff}, CFG)
    head, sub = rows
    assert sub["value"] == pytest.approx(100 / 40) and sub["verdict"] == "holds"
    assert "1 pass the paper's -5% threshold" in sub["note"]
    assert head["verdict"] == "holds" and head["scope"] == "all"
    # three of forty heads is 7.5%: more than 5%
    many = key_table(eff, ["L0H0", "L1H1", "L2H1"], [])
    assert verdicts.few_key_heads({"addition": many}, {"addition": eff}, CFG)[1]["verdict"] == "does not hold"


def test_no_key_head_is_said_in_the_row_and_nothing_fails():
    eff = effects_table({}, {3: (-0.1, -0.12, -0.08)})
    keys = {"addition": key_table(eff, [], [])}
    assert "selected no head" in verdicts.few_key_heads(keys, {"addition": eff}, CFG)[1]["note"]
    middle = verdicts.middle_layers(keys, 4, CFG)
    assert middle[0]["verdict"] == "not measured"
    assert verdicts.mlp_late(keys, {"addition": eff}, CFG)[1]["verdict"] == "not measured"


def test_middle_layers_uses_relative_depth():
    eff = effects_table({}, {}, n_layers=11)
    mid = verdicts.middle_layers({"addition": key_table(eff, ["L4H0", "L5H1", "L6H2"], [])}, 11, CFG)
    assert mid[0]["verdict"] == "holds" and mid[0]["value"] == pytest.approx(50.0)
    late = verdicts.middle_layers({"addition": key_table(eff, ["L9H0", "L10H1"], [])}, 11, CFG)
    assert late[0]["verdict"] == "does not hold"
    some = verdicts.middle_layers({"addition": key_table(eff, ["L5H0", "L9H1", "L10H1"], [])}, 11, CFG)
    assert some[0]["verdict"] == "partly"


def test_middle_band_is_the_papers_layers_12_to_17_of_32():
    # the band is fixed by the paper's own numbers (LLaMA2-7B, 32 layers), on the depth scale the rule uses
    low, high = CFG["middle_band"]
    assert (verdicts.depth(12, 32) == pytest.approx(low, abs=5e-4)
            and verdicts.depth(17, 32) == pytest.approx(high, abs=5e-4))
    # key heads at depth 0.6-0.7 (a wider 0.3-0.7 band called this "holds") lie outside it
    eff = effects_table({}, {}, n_layers=11)
    wide = verdicts.middle_layers({"addition": key_table(eff, ["L6H0", "L7H1", "L7H2"], [])}, 11, CFG)
    assert wide[0]["verdict"] == "does not hold"


def test_mlp_late_compares_mlps_before_and_after_the_first_key_head():
    eff = effects_table({(2, 0): -0.01}, {0: (0.005, 0.004, 0.006), 3: (-0.03, -0.04, -0.02)})
    rows = verdicts.mlp_late({"addition": key_table(eff, ["L2H0"], [])}, {"addition": eff}, CFG)
    assert rows[1]["value"] == pytest.approx(6.0) and rows[1]["verdict"] == "holds"
    # effects at their intervals' precision
    assert rows[1]["note"].startswith("later: L3MLP -3.0% [-4.0, -2.0]; earlier: L0MLP 0.50% in size")
    early = effects_table({(2, 0): -0.01}, {0: (0.05, 0.04, 0.06), 3: (-0.03, -0.04, -0.02)})
    rows = verdicts.mlp_late({"addition": key_table(early, ["L2H0"], [])}, {"addition": early}, CFG)
    assert rows[1]["verdict"] == "does not hold"


def test_notes_print_the_same_text_when_the_last_digits_move():
    """An interval end that differs between two CPUs in its fourth digit (docs/performance.md, Reproducibility)
    leaves the note unchanged: it prints at the interval's precision, not at fixed decimals."""
    def note(ci_low):
        eff = effects_table({(2, 0): -0.01}, {0: (0.005, 0.004, 0.006), 3: (-0.1162, ci_low, -0.0576)})
        return verdicts.mlp_late({"addition": key_table(eff, ["L2H0"], [])}, {"addition": eff}, CFG)[1]["note"]

    assert note(-0.16574) == note(-0.16576)
    assert note(-0.16574).startswith("later: L3MLP -12% [-17, -6];")


# ------------------------------------------------------------------------------------------------ validate
def knockout_items(task: str, top_acc: float, random_acc: float, n_pairs: int = 40, per_pair: int = 3,
                   K: int = 3, seed: int = 0) -> pd.DataFrame:
    """Per-item knockout rows like stages.validate.knockout_items: nothing knocked out is always right, the top K
    heads are right with probability top_acc, random heads with random_acc (two draws each control)."""
    rng = np.random.default_rng(seed)
    n = n_pairs * per_pair
    sets = [("top_heads", -1, 0, 1.0), ("top_heads", -1, K, top_acc)]
    sets += [(c, s, K, random_acc) for c in ("random_heads", "random_layer_matched") for s in range(2)]
    rows = []
    for curve, s, k, p in sets:
        correct = rng.random(n) < p
        rows.append(pd.DataFrame({"curve": curve, "seed": s, "k": k, "sample_id": np.arange(n),
                                  "cluster": [f"{i // per_pair},1" for i in range(n)], "first_correct": correct,
                                  "full_correct": correct, "positions": "end"}))
    items = pd.concat(rows, ignore_index=True)
    return items.assign(item_key=task + ":" + items["sample_id"].astype(str), cluster=task + ":" + items["cluster"])


def test_knockout_collapse_against_random_heads():
    items = knockout_items("addition", 0.2, 0.95)
    rows = verdicts.knockout_collapse({"addition": items}, CFG, seed=0)
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
    rows = verdicts.knockout_collapse({"addition": knockout_items("addition", 0.9, 0.9)}, CFG, seed=0)
    assert rows[0]["verdict"] in ("does not hold", "inconclusive")
    # beating random heads without a 50% drop is only partly the paper's claim
    rows = verdicts.knockout_collapse({"addition": knockout_items("addition", 0.7, 0.97)}, CFG, seed=0)
    assert rows[1]["verdict"] == "partly"


def test_knockout_too_few_items_is_inconclusive_with_the_detectable_difference():
    rows = verdicts.knockout_collapse({"addition": knockout_items("addition", 0.85, 0.95, n_pairs=4, per_pair=2)},
                                    CFG, seed=1)
    sub = rows[1]
    assert sub["verdict"] == "inconclusive" and "detects about" in sub["note"]
    # two significant digits, like the interval's width it comes from
    assert re.search(r"detects about \d\d points with 80% power", sub["note"]), sub["note"]


def transfer_items(key_acc: dict[str, float], random_acc: dict[str, float], n: int = 80, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    targets = {"operator": "division", "svamp": "SVAMP", "non_math": "qa_wikidata"}
    for kind, target in targets.items():
        for heads, acc in (("none", 1.0), ("key", key_acc[kind]), ("random", random_acc[kind])):
            source = "none" if heads == "none" else "addition"
            rows.append(pd.DataFrame({"source": source, "heads": heads, "seed": 0 if heads == "random" else -1,
                                      "target": target, "target_kind": kind, "item": np.arange(n),
                                      "cluster": [str(i) for i in range(n)], "correct": rng.random(n) < acc}))
    return pd.concat(rows, ignore_index=True)


def test_transfer_hurts_math_and_spares_non_math():
    items = transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.9},
                           {"operator": 0.9, "svamp": 0.8, "non_math": 0.9})
    rows = verdicts.transfer(items, CFG, seed=0)
    by_scope = {r["scope"]: r["verdict"] for r in rows}
    assert by_scope["other operators"] == "holds" and by_scope["SVAMP"] == "holds"
    assert by_scope["non-math control"] in ("holds", "inconclusive")
    assert rows[0]["scope"] == "all"
    hurt = verdicts.transfer(transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.2},
                                          {"operator": 0.9, "svamp": 0.8, "non_math": 0.9}), CFG, seed=0)
    assert {r["scope"]: r["verdict"] for r in hurt}["non-math control"] == "does not hold"
    assert hurt[0]["verdict"] == "partly"


def test_transfer_scores_only_the_items_the_intact_model_gets_right():
    items = transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.9},
                           {"operator": 0.9, "svamp": 0.8, "non_math": 0.9})
    wrong = (items["heads"] == "none") & (items["target_kind"] == "svamp")
    items.loc[wrong, "correct"] = False  # the intact model answers no SVAMP item
    rows = {r["scope"]: r for r in verdicts.transfer(items, CFG, seed=0)}
    assert rows["SVAMP"]["verdict"] == "not measured" and "answers none" in rows["SVAMP"]["note"]
    half = items.copy()
    half.loc[(half["heads"] == "none") & (half["target_kind"] == "operator") & (half["item"] % 2 == 1),
             "correct"] = False
    assert {r["scope"]: r for r in verdicts.transfer(half, CFG, seed=0)}["other operators"]["n"] == 40


def test_knockout_of_a_model_that_answers_nothing_is_not_measured():
    items = knockout_items("addition", 0.0, 0.0)
    items["full_correct"] = items["first_correct"] = False
    rows = verdicts.knockout_collapse({"addition": items}, CFG, seed=0)
    assert all(r["verdict"] == "not measured" for r in rows)


def test_transfer_leaves_out_a_source_operators_own_pairs():
    items = transfer_items({"operator": 0.3, "svamp": 0.2, "non_math": 0.9},
                           {"operator": 0.9, "svamp": 0.8, "non_math": 0.9})
    own = items[items["target_kind"] == "operator"].assign(target="addition")  # the source's own pairs
    rows = verdicts.transfer(pd.concat([items[items["target_kind"] != "operator"], own]), CFG, seed=0)
    assert "other operators" not in {r["scope"] for r in rows}


# ------------------------------------------------------------------------------------------------ analyze
def roles_all(key_share: float, other_share: float, n_heads: int = 40, n_key: int = 3) -> pd.DataFrame:
    rows = []
    roles = ("operand_a", "operand_b", "operator", "equals", "prefix", "other")
    rng = np.random.default_rng(0)
    for i in range(n_heads):
        analysed = i < n_key
        s = np.clip((key_share if analysed else other_share) + rng.normal(0, 0.02), 0, 1)
        weights = [s / 3] * 3 + [(1 - s) / 3] * 3
        rows += [{"layer": i // 4, "head": i % 4, "role": r, "attention": w, "analysed": analysed,
                  "selection": "key"} for r, w in zip(roles, weights)]
    return pd.DataFrame(rows)


def test_key_attention_against_the_other_heads():
    rows = verdicts.key_attention({"addition": roles_all(0.7, 0.2)}, CFG, seed=0)
    assert rows[1]["verdict"] == "holds" and rows[1]["value"] == pytest.approx(50, abs=3)
    rows = verdicts.key_attention({"addition": roles_all(0.2, 0.2)}, CFG, seed=0)
    assert rows[1]["verdict"] in ("does not hold", "inconclusive")
    assert rows[1]["ci_low"] < 0 < rows[1]["ci_high"]


def probes(c: float, a: float, layer: int = 3) -> pd.DataFrame:
    rows = []
    for target, mean in (("a", a), ("b", a - 0.01), ("c", c)):
        rows.append({"variant": "paper", "subset": "all", "layer": layer, "vector": "output", "target": target,
                     "mean": mean, "std": 0.02, "n": 60, "n_texts": 60})
    return pd.DataFrame(rows)


def test_mlp_answer_reads_the_key_mlps():
    eff = effects_table({}, {3: (-0.1, -0.12, -0.08)})
    keys = {"addition": key_table(eff, [], ["L3MLP"])}
    rows = verdicts.mlp_answer({"addition": probes(0.2, 0.05)}, keys, CFG)
    assert rows[1]["verdict"] == "holds" and rows[1]["value"] == pytest.approx(0.15)
    rows = verdicts.mlp_answer({"addition": probes(0.05, 0.2)}, keys, CFG)
    assert rows[1]["verdict"] == "does not hold"


# ------------------------------------------------------------------------------------------------ finetune
LEARNS = ("precise", "base", "accuracy", 0.3, 0.25, 0.35)  # the study's first positive control: precise learns


def comparisons(rows: list[tuple], learns: bool = True) -> pd.DataFrame:
    """A comparisons table of `rows`, with LEARNS unless `learns` is False."""
    rows = rows + [LEARNS] if learns else rows
    return pd.DataFrame([{"arm_a": a, "arm_b": b, "metric": m, "difference": d, "ci_low": lo, "ci_high": hi,
                          "p_value": 0.01, "p_holm": 0.04, "test": "mcnemar_exact", "n_items": 500}
                         for a, b, m, d, lo, hi in rows])


def study_table(full_s: float, precise_s: float) -> pd.DataFrame:
    return pd.DataFrame([
        {"arm": "precise", "run": "chosen", "mean_step_s": precise_s, "steps": 24, "trainable_params": 1_179_648},
        {"arm": "full", "run": "chosen", "mean_step_s": full_s, "steps": 24, "trainable_params": 134_515_008},
    ])


def test_sft_claims_from_the_studys_comparisons():
    comp = comparisons([
        ("precise", "full", "accuracy", -0.01, -0.04, 0.02),  # within the 5-point margin
        ("precise", "random_heads", "accuracy", 0.08, 0.03, 0.13),
        ("precise", "full", "kl_to_base", -0.02, -0.03, -0.01),
        ("precise", "full", "social_iqa", 0.0, -0.15, 0.15),  # too few items
    ])
    rows = pd.DataFrame(verdicts.sft_claims(study_table(0.5, 0.2), comp, "add2", CFG))
    verdict = rows[rows["scope"] == "all"].set_index("claim")["verdict"]
    assert verdict["sft_vs_full"] == "holds" and verdict["sft_vs_random"] == "holds"
    assert verdict["sft_off_target"] == "partly" and verdict["sft_speed"] == "holds"
    social = rows[rows["scope"] == "social_iqa"].iloc[0]
    assert social["verdict"] == "inconclusive" and "detects about" in social["note"]
    speed = rows[rows["claim"] == "sft_speed"].iloc[0]
    assert speed["value"] == pytest.approx(2.5) and "1,179,648" in speed["note"]


def test_the_circuit_arm_against_the_precise_arm():
    comp = comparisons([("circuit", "precise", "accuracy", 0.08, 0.03, 0.13)])
    study = pd.concat([study_table(0.5, 0.2), study_table(0.5, 0.2).iloc[:1].assign(arm="circuit")])
    study = study.assign(model_dtype="float32", master_dtype="float32")
    (row,) = [r for r in verdicts.sft_claims(study, comp, "add2", CFG) if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "holds" and row["value"] == pytest.approx(8.0) and row["scope"] == "all"
    assert "circuit float32 / float32, precise float32 / float32" in row["note"]
    worse = comparisons([("circuit", "precise", "accuracy", -0.08, -0.13, -0.03),
                         ("precise", "low_effect", "accuracy", 0.1, 0.05, 0.15)])  # with its positive control
    (row,) = [r for r in verdicts.sft_claims(study, worse, "add2", CFG) if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "does not hold"
    close = comparisons([("circuit", "precise", "accuracy", 0.0, -0.09, 0.09)])  # reaches 5 points both ways
    (row,) = [r for r in verdicts.sft_claims(study, close, "add2", CFG) if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "inconclusive" and "detects about" in row["note"]
    # a study without the circuit arm: the row says the arm did not run, the other rows are unaffected
    rows = verdicts.sft_claims(study_table(0.5, 0.2),
                               comparisons([("precise", "full", "accuracy", -0.01, -0.04, 0.02)]), "add2", CFG)
    (row,) = [r for r in rows if r["claim"] == "sft_circuit_vs_precise"]
    assert row["verdict"] == "not measured" and "circuit arm did not run" in row["note"]
    assert {r["claim"]: r["verdict"] for r in rows if r["scope"] == "all"}["sft_vs_full"] == "holds"


def _circuit_row(study: pd.DataFrame, rows: list[tuple]) -> dict:
    (row,) = [r for r in verdicts.sft_claims(study, comparisons(rows), "add2", CFG)
              if r["claim"] == "sft_circuit_vs_precise"]
    return row


def test_the_circuit_arm_reads_does_not_hold_only_with_a_positive_control():
    """circuit - precise inside +-5 points is "does not hold" only when the same study separates the key heads from
    the negative control (precise - low_effect above 0); without that arm, or with the control failing, it is
    inconclusive, and the note says which. A circuit arm that beats precise needs no control: that is a separation."""
    study = pd.concat([study_table(0.5, 0.2),
                       study_table(0.5, 0.2).iloc[:1].assign(arm="circuit", n_heads=16, overlap_precise=13,
                                                              jaccard_precise=13 / 19)])
    same = ("circuit", "precise", "accuracy", -0.002, -0.03, 0.028)  # the default run's -0.2 [-3.2, +2.8]
    no_control = _circuit_row(study, [same])
    assert no_control["verdict"] == "inconclusive"
    assert "no positive control: the study ran no low_effect arm" in no_control["note"]
    assert POSITIVE_CONTROL in no_control["rule"]
    failed = _circuit_row(study, [same, ("precise", "low_effect", "accuracy", 0.01, -0.02, 0.04)])
    assert failed["verdict"] == "inconclusive" and "positive control failed" in failed["note"]
    passed = _circuit_row(study, [same, ("precise", "low_effect", "accuracy", 0.12, 0.08, 0.16),
                                  ("circuit_disjoint", "precise", "accuracy", -0.05, -0.09, -0.01)])
    assert passed["verdict"] == "does not hold"
    assert "positive control passed: precise - low_effect +12.0 points [+8.0, +16.0]" in passed["note"]
    assert "circuit shares 13 of its 16 heads with precise (Jaccard 0.68)" in passed["note"]
    assert "circuit_disjoint - precise -5.0 points [-9.0, -1.0]" in passed["note"]
    better = _circuit_row(study, [("circuit", "precise", "accuracy", 0.08, 0.03, 0.13)])
    assert better["verdict"] == "holds"


POSITIVE_CONTROL = "stands only if the same study's positive control holds"


def test_full_fine_tuning_clearly_better_does_not_hold():
    comp = comparisons([("precise", "full", "accuracy", -0.2, -0.3, -0.1)])
    rows = verdicts.sft_claims(study_table(0.5, 0.6), comp, "add2", CFG)
    by_claim = {r["claim"]: r["verdict"] for r in rows if r["scope"] == "all"}
    assert by_claim["sft_vs_full"] == "does not hold" and by_claim["sft_speed"] == "does not hold"
    assert by_claim["sft_vs_random"] == "not measured"


def test_precise_that_does_not_beat_the_base_model_reads_no_exact_match_verdict():
    """The positive control of the lr choice: with precise's chosen run no better than the base model on the
    trained format, the exact-match comparisons of precise with other arms are inconclusive, and say why."""
    rows = [("precise", "full", "accuracy", -0.2, -0.3, -0.1),
            ("precise", "random_heads", "accuracy", 0.08, 0.03, 0.13),
            ("precise", "base", "accuracy", 0.01, -0.03, 0.05)]
    by = {r["claim"]: r for r in verdicts.sft_claims(study_table(0.5, 0.2), comparisons(rows, learns=False), "add2",
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
    by = {r["claim"]: r for r in verdicts.sft_claims(study, comp, "add2", CFG) if r["scope"] == "all"}
    assert by["sft_vs_full"]["verdict"] == "holds"
    assert "precise: lr 0.003 at the grid's lower edge: the best may lie below" in by["sft_vs_full"]["note"]
    assert "precise learns: precise - base +30.0 points [+25.0, +35.0]" in by["sft_vs_full"]["note"]
    lost = study.assign(lr_note=["", "not measured: every learning rate of the grid collapsed (...)"],
                        measured=[True, False])
    by = {r["claim"]: r for r in verdicts.sft_claims(lost, comp, "add2", CFG) if r["scope"] == "all"}
    for claim in ("sft_vs_full", "sft_off_target", "sft_speed"):
        assert by[claim]["verdict"] == "not measured"
        assert by[claim]["note"].startswith("full: not measured: every learning rate of the grid collapsed")
    assert by["sft_vs_random"]["verdict"] == "holds"


def test_without_the_study_every_sft_claim_is_not_measured_and_says_why():
    rows = verdicts.sft_claims(None, None, "add2", CFG)
    assert {r["claim"] for r in rows} == {"sft_vs_full", "sft_vs_random", "sft_circuit_vs_precise", "sft_off_target",
                                          "sft_speed"}
    assert all(r["verdict"] == "not measured" and "did not run" in r["note"] for r in rows)


def circuit_items(key_full: float, random_full: float, n: int = 40) -> pd.DataFrame:
    """A per-item table of the key circuit's sets (the discover rule's layout, before its teacher-forced columns):
    the model right on every item, the empty circuit on none, the key circuit on a share key_full of them, two
    random draws on random_full."""
    rows = []
    for curve, mlps, k, seed, share in [("model", "all", 24, -1, 1.0), ("empty", "none", 0, -1, 0.0),
                                        ("key", "key", 3, -1, key_full), ("random", "key", 3, 0, random_full),
                                        ("random", "key", 3, 1, random_full), ("top", "key", 24, -1, key_full),
                                        ("top", "all", 24, -1, 1.0)]:
        for i in range(n):
            right = float(i < round(share * n))
            rows.append({"curve": curve, "mlps": mlps, "k": k, "seed": seed, "sample_id": i, "cluster": str(i),
                         "first_correct": right, "full_correct": right, "answer_logit": 20 + 10 * right})
    return pd.DataFrame(rows)


def test_circuit_sufficient_without_teacher_forced_scores_is_not_measured():
    """An operator whose discover items lack the teacher-forced columns, or has none, is not measured; the scorecard
    without the discover rule's items says the rule did not run."""
    rows = verdicts.circuit_sufficient({"addition": circuit_items(0.95, 0.1), "division": None}, CFG, seed=0)
    by = {r["scope"]: r for r in rows}
    assert by["addition"]["verdict"] == by["division"]["verdict"] == "not measured"
    assert "no teacher-forced scores" in by["division"]["note"] and rows[0]["claim"] == "circuit_sufficient"


def tf_circuit_items(key: float, random: float, n: int = 120, logprob_f: float = 1.0, resample_key: float | None = None,
                     failed: str = "") -> pd.DataFrame:
    """`circuit_items` with the teacher-forced columns of both ablations: the key circuit right on a share `key` of
    the items (`resample_key` under resample ablation), random draws on `random`; the log-probability's
    faithfulness logprob_f for the key circuit (model -1, empty -10 per item); `failed`: resample's failed sanity
    checks."""
    items = circuit_items(key, random, n)
    rank = items["sample_id"].to_numpy()
    share = {"model": 1.0, "empty": 0.0, "random": random, "top": key}
    for kind in ("resample", "mean"):
        mine = {**share, "key": resample_key if kind == "resample" and resample_key is not None else key}
        items[f"tf_{kind}_tail_correct"] = [float(i < round(mine[c] * n)) for c, i in zip(items["curve"], rank)]
        f = {"model": 1.0, "empty": 0.0, "random": random, "top": key, "key": logprob_f}
        items[f"tf_{kind}_tail_logprob"] = [-10 + 9 * f[c] for c in items["curve"]]
        items[f"sanity_{kind}_failed"] = failed if kind == "resample" else ""
    return items


def test_circuit_sufficient_on_the_teacher_forced_protocol():
    """The key circuit read on the teacher-forced columns with the discovered circuit's rule (size aside): every
    outcome the rule names, from the discover rule's per-item table layout."""
    def verdict(items):
        return verdicts.circuit_sufficient({"addition": items}, CFG, seed=0)[1]

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


def path_cuts(via: float, direct: float, both: float, *, kinds=("resample", "mean"), n: int = 60,
              noise: float = 0.02, seed: int = 0) -> pd.DataFrame:
    """Per-item path cuts (the edges rule's `{task}_edge_paths`): log-probability lost with the key heads' edges into
    the MLPs (via), into the logits (direct) or both cut, around the given means, per kind."""
    rng = np.random.default_rng(seed)
    rows = []
    for kind in kinds:
        model = rng.normal(-1.0, 0.3, n)
        rows.append(pd.DataFrame({"sample_id": np.arange(n), "cluster": [f"{i},{i}" for i in range(n)], "kind": kind,
                                  "model": model, "via_mlps": model - via - rng.normal(0, noise, n),
                                  "direct": model - direct - rng.normal(0, noise, n),
                                  "both": model - both - rng.normal(0, noise, n)}))
    return pd.concat(rows, ignore_index=True)


def test_heads_via_mlps_reads_the_key_heads_cut_paths_under_both_ablations():
    split = path_cuts(0.5, 0.1, 0.6)
    unequal = pd.concat([path_cuts(0.5, 0.1, 0.6, kinds=("resample",)), path_cuts(0.02, 0.5, 0.6, kinds=("mean",))])
    rows = verdicts.heads_via_mlps({"addition": split, "subtraction": path_cuts(0.3, 0.5, 0.8),
                                  "multiplication": path_cuts(0.0, 0.5, 0.5), "division": unequal,
                                  "none": None}, CFG, seed=0)
    by = {r["scope"]: r for r in rows}
    assert by["addition"]["verdict"] == "holds" and by["addition"]["value"] == pytest.approx(100 * 0.5 / 0.6, abs=2)
    assert "resample: holds" in by["addition"]["note"]
    assert by["subtraction"]["verdict"] == "partly"  # through the MLPs, but less than directly
    assert by["multiplication"]["verdict"] == "does not hold"  # nothing through the MLPs
    assert by["division"]["verdict"] == "inconclusive"  # the two ablations disagree
    assert by["none"]["verdict"] == "not measured"
    # edges that carry nothing: no share to read
    nothing = verdicts.heads_via_mlps({"addition": path_cuts(0.0, 0.0, 0.0, noise=0.2)}, CFG, seed=0)
    assert nothing[1]["verdict"] in ("inconclusive", "does not hold")


def discover_summary(task: str, rows: list[dict]) -> pd.DataFrame:
    """The discover rule's summary (one row per task and target) with the columns the claim reads; each dict
    overrides a faithful, small circuit that beats random ones under both ablations (chosen at target 0.8)."""
    base = {"task": task, "target": 0.8, "chosen": True, "n_heads": 20, "n_mlps": 10, "share": 0.1,
            "pruned_on": "tf_mean_logprob", "draws": 5, **tf_columns()}
    return pd.DataFrame([base | r for r in rows])


def tf_columns(correct=(0.9, 0.85, 0.95), logprob=(1.0, 0.9, 1.1), random_diff=(0.6, 0.5, 0.7),
               kinds=("resample", "mean"), **override) -> dict:
    """The teacher-forced columns of one discover summary row (a circuit that holds under both ablations)."""
    row = {"tf_n_items": 120}
    for kind in kinds:
        for name, (v, lo, hi) in (("correct", correct), ("logprob", logprob), ("random_diff", random_diff)):
            row |= {f"tf_{kind}_{name}": v, f"tf_{kind}_{name}_low": lo, f"tf_{kind}_{name}_high": hi}
    return row | override


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
    rows = verdicts.circuit_faithful(summary, CFG)
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
    rows = verdicts.circuit_faithful(summary, CFG)
    by = {r["scope"]: r for r in rows[1:]}
    assert list(by) == ["addition", "union of the operators", "shared circuit of the operators"]
    shared = by["shared circuit of the operators"]
    assert shared["verdict"] == "holds" and shared["value"] == pytest.approx(90.0)
    assert "found at target 0.9 of the tf_mean_logprob on every operator's identification pairs together" in (
        shared["note"])
    gap = CFG["max_fit_gap"] + 0.05  # fitted that much better on its pruning pairs than on validation (0.9)
    fitted = summary.assign(tf_mean_correct_identification=[math.nan, math.nan, 0.9 + gap],
                            tf_mean_gap=[math.nan, math.nan, gap])
    assert verdicts.circuit_faithful(fitted, CFG)[-1]["verdict"] == "inconclusive"


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
    rows = verdicts.circuit_faithful(summary, CFG)
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
    strict = verdicts.circuit_faithful(discover_summary("addition", [{}]), CFG | {"max_circuit_share": 0.05})
    assert strict[1]["verdict"] == "does not hold"


def test_a_circuit_without_its_discovery_is_not_run():
    rows = verdicts.circuit_faithful(None, CFG)
    assert len(rows) == 1 and rows[0]["verdict"] == "not measured" and "did not run" in rows[0]["note"]
    # the model answers nothing in full: faithfulness is undefined under both ablations
    nan = {f"tf_{k}_correct{x}": math.nan for k in ("resample", "mean") for x in ("", "_low", "_high")}
    undefined = verdicts.circuit_faithful(discover_summary("addition", [nan]), CFG)
    assert undefined[1]["verdict"] == "not measured" and undefined[1]["value"] == pytest.approx(10.0)
    # a summary without a column the claim reads fails naming it, rather than scoring something else
    renamed = discover_summary("addition", [{}]).rename(columns={"tf_mean_random_diff_low": "ci_low"})
    with pytest.raises(ValueError, match="tf_mean_random_diff_low"):
        verdicts.circuit_faithful(renamed, CFG)
    named = verdicts.circuit_faithful(discover_summary("addition", [{"pruned_on": "tf_mean_kl"}]), CFG)
    assert "found at target 0.8 of the tf_mean_kl;" in named[1]["note"]
    # as the discover rule writes them: a chosen target that reached no share, and the union without a target
    written = pd.concat([discover_summary("addition", [{"target": 0.95, "share_reached": False}]),
                         discover_summary("union", [{"target": math.nan, "share_reached": math.nan}])],
                        ignore_index=True)
    notes = {r["scope"]: r["note"] for r in verdicts.circuit_faithful(written, CFG)}
    assert notes["addition"].startswith("found at target 0.95 of the tf_mean_logprob (no target's circuit kept enough")
    assert (notes["union of the operators"].startswith("the union of the operators' chosen circuits;")
            and "nan" not in notes["union of the operators"])


def test_the_scorecard_without_discovery_or_circuit_arm_says_not_run():
    """The two new claims are in the table, not measured, when their inputs are absent (the workflow wires
    them when the rules run)."""
    eff = effects_table({(2, 1): -0.08}, {3: (-0.1, -0.12, -0.08)})
    table = verdicts.scorecard(
        keys={"addition": key_table(eff, ["L2H1"], ["L3MLP"])}, effects={"addition": eff},
        knockout_items={"addition": None}, transfer_items=None, roles_all={"addition": roles_all(0.7, 0.2)},
        probes={"addition": probes(0.2, 0.05)}, study=None, comparisons=None, train_format=None, cfg=CFG, seed=0)
    head = table[table["scope"] == "all"].set_index("claim")
    assert list(head.index) == list(verdicts.CLAIMS)  # every claim once, in order
    assert head.loc["circuit_faithful", "verdict"] == "not measured"
    assert "discover rule did not run" in head.loc["circuit_faithful", "note"]
    assert head.loc["circuit_sufficient", "verdict"] == "not measured"
    assert "discover rule did not run" in head.loc["circuit_sufficient", "note"]
    assert head.loc["sft_circuit_vs_precise", "verdict"] == "not measured"
    with_discovery = verdicts.scorecard(
        keys={"addition": key_table(eff, ["L2H1"], ["L3MLP"])}, effects={"addition": eff},
        knockout_items={"addition": None}, transfer_items=None, roles_all={"addition": roles_all(0.7, 0.2)},
        probes={"addition": probes(0.2, 0.05)}, study=None, comparisons=None, train_format=None, cfg=CFG, seed=0,
        discover=discover_summary("addition", [{}]))
    assert with_discovery.set_index(["claim", "scope"]).loc[("circuit_faithful", "all"), "verdict"] == "holds"


PAPER_TEXT = ROOT.parent / "shared" / "paper"  # the paper's text, beside the checkout


def paper_text() -> str:
    """The paper's text as the checks read it: LaTeX's \\% and \\pm as written here, curly quotes straight,
    whitespace collapsed."""
    text = " ".join(p.read_text(encoding="utf-8") for p in sorted(PAPER_TEXT.glob("*.txt")))
    for a, b in (("\\%", "%"), ("\\pm", "+-"), ("’", "'"), ("“", '"'), ("”", '"'), ("–", "-")):
        text = text.replace(a, b)
    return " ".join(text.split())


def numbers(text: str) -> list[str]:
    """Every number of a text with its percent sign, thousands separators dropped: "1,024 heads, 5%" ->
    ["1024", "5%"]."""
    return [n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?%?", text)]


@pytest.mark.skipif(not PAPER_TEXT.is_dir(), reason=f"the paper's text is not at {PAPER_TEXT}")
def test_every_number_of_the_paper_column_is_in_the_papers_text():
    """The scorecard's "paper" column quotes the paper: each of its numbers (with its percent sign) appears in
    the text available here (../shared/paper, whose README lists what is missing, e.g. Table 1), and each quoted
    phrase appears there word for word; a claim whose number is not there says so instead of giving one."""
    text = paper_text()
    in_text = set(numbers(text))
    for claim in verdicts.CLAIMS.values():
        missing = [n for n in numbers(claim.paper) if n not in in_text]
        assert not missing, f"{claim.id}: {missing} of {claim.paper!r} are not in {PAPER_TEXT}"
        for quote in re.findall(r'"([^"]+)"', claim.paper):
            assert quote in text, f"{claim.id}: the quote {quote!r} is not in {PAPER_TEXT}"
    # the check can fail: Table 1's numbers are not in the text
    assert "48.1%" not in in_text and "1000" not in in_text


def test_the_paper_column_says_where_a_number_is_not_available():
    """The claims whose numbers are only in Table 1 or the knockout figures say so."""
    for claim in ("knockout_collapse", "sft_vs_full", "sft_off_target"):
        assert "not available here" in verdicts.CLAIMS[claim].paper
    assert "no time is given" in verdicts.CLAIMS["sft_speed"].paper
    assert "Table 1: not available here" in verdicts.CLAIMS["sft_vs_full"].paper


# ------------------------------------------------------------------------------------------------ degenerate
def test_a_zero_width_interval_at_0_is_not_measured_never_a_power_statement():
    """Arms that answer identically on every item give every resample the same 0: no verdict, no power statement."""
    assert verdicts.directional(0.0, 0.0, direction=+1, min_effect=0.05) == "not measured"
    assert verdicts.directional(-0.2, -0.2, direction=-1, min_effect=0.05) == "holds"  # every item lost: measured
    assert verdicts._non_inferior(pd.Series({"ci_low": 0.0, "ci_high": 0.0}), 0.05) == "not measured"
    for verdict in verdicts.VERDICTS:
        assert verdicts._interval_note(0.0, 0.0, verdict) == verdicts.IDENTICAL


def test_every_paired_comparison_names_identical_arms():
    """Knockout, transfer, the circuit rows and the study's rows: identical arms read "not measured: the arms
    answered identically", and no row anywhere says "detects about 0.0"."""
    rows = []
    # knockout: the top K and the random heads right on the same items
    same = knockout_items("addition", 1.0, 1.0)
    ko = verdicts.knockout_collapse({"addition": same}, CFG, seed=0)
    assert ko[1]["verdict"] == "not measured" and verdicts.IDENTICAL in ko[1]["note"]
    rows += ko
    # transfer: key and random heads keep every item
    tr = {r["scope"]: r for r in verdicts.transfer(
        transfer_items({"operator": 1.0, "svamp": 1.0, "non_math": 1.0},
                       {"operator": 1.0, "svamp": 1.0, "non_math": 1.0}), CFG, seed=0)}
    for scope in ("other operators", "SVAMP", "non-math control"):
        assert tr[scope]["verdict"] == "not measured" and verdicts.IDENTICAL in tr[scope]["note"]
    rows += list(tr.values())
    # the study: Gemma's circuit - precise 0.0 [0.0, 0.0]
    study = pd.concat([study_table(0.5, 0.2), study_table(0.5, 0.2).iloc[:1].assign(arm="circuit")])
    circuit = _circuit_row(study, [("circuit", "precise", "accuracy", 0.0, 0.0, 0.0)])
    assert circuit["verdict"] == "not measured" and circuit["note"].startswith(verdicts.IDENTICAL)
    sft = verdicts.sft_claims(study_table(0.5, 0.2), comparisons([
        ("precise", "full", "accuracy", 0.0, 0.0, 0.0), ("precise", "random_heads", "accuracy", 0.0, 0.0, 0.0),
        ("precise", "full", "social_iqa", 0.0, 0.0, 0.0)]), "add2", CFG)
    for r in sft:
        if r["claim"] in ("sft_vs_full", "sft_vs_random") or r["scope"] == "social_iqa":
            assert r["verdict"] == "not measured" and verdicts.IDENTICAL in r["note"], r
    rows += [circuit, *sft]
    # the discovered circuit against random circuits that score exactly as it does: no evidence either way
    tf = verdicts.circuit_faithful(discover_summary("addition", [tf_columns(random_diff=(0.0, 0.0, 0.0))]), CFG)[1]
    assert tf["verdict"] == "inconclusive" and "circuit - random " + verdicts.IDENTICAL in tf["note"]
    rows += [tf]
    assert not any("detects about 0.0 " in r["note"] or "detects about 0 " in r["note"] for r in rows)


# ------------------------------------------------------------------------------------------------ sanity
FAILED = "sanity check 'one node ablated' failed: the median draw keeps 0.500 of the model's accuracy (needs 0.95)"


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
    rows = verdicts.circuit_faithful(summary, CFG)
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
    key = verdicts.circuit_sufficient({"addition": items}, CFG, seed=0)
    assert key[1]["verdict"] == "inconclusive" and "'one node ablated'" in key[1]["note"]
    assert "the resample ablation failed a sanity check on addition" in key[0]["note"]
    # the key heads' edges, cut under the same ablations: the discover rule's checks decide them too
    cuts = {"addition": path_cuts(0.5, 0.1, 0.6), "subtraction": path_cuts(0.5, 0.1, 0.6)}
    clean = verdicts.heads_via_mlps(cuts, CFG, seed=0)
    assert {r["scope"]: r["verdict"] for r in clean}["addition"] == "holds"
    paths = verdicts.heads_via_mlps(cuts, CFG, seed=0, sanity={"addition": {"mean": FAILED}, "subtraction": {}})
    by = {r["scope"]: r for r in paths}
    assert by["addition"]["verdict"] == "inconclusive" and by["addition"]["note"].startswith(
        "inconclusive: the mean ablation failed a sanity check")
    assert by["subtraction"]["verdict"] == "holds"
    assert verdicts.failed_checks(items, ("resample", "mean")) == {"resample": FAILED}
    assert verdicts.failed_checks(None, ("resample", "mean")) == {}


def test_a_failed_check_on_a_model_that_answers_nothing_leaves_the_row_not_measured():
    """Nothing to read (the full model gets no item right: every faithfulness 0/0) stays "not measured" when a check
    failed too (the tiny workflow's random model); the note still names the check. Measured, it is inconclusive."""
    items = tf_circuit_items(0.95, 0.1, failed=FAILED)
    for kind in ("resample", "mean"):
        items[f"tf_{kind}_tail_correct"] = 0.0
    row = verdicts.circuit_sufficient({"addition": items}, CFG, seed=0)[1]
    assert row["verdict"] == "not measured" and "'one node ablated'" in row["note"]
    measured = verdicts.circuit_sufficient({"addition": tf_circuit_items(0.95, 0.1, failed=FAILED)}, CFG, seed=0)
    assert measured[1]["verdict"] == "inconclusive"
    nan = {c: math.nan for c in tf_columns() if c.startswith("tf_") and not c.endswith("sanity_failed")
           and c != "tf_n_items"}
    summary = discover_summary("addition", [tf_columns(tf_resample_sanity_failed=FAILED, tf_mean_sanity_failed="")
                                            | nan])
    faithful = {r["scope"]: r for r in verdicts.circuit_faithful(summary, CFG)}["addition"]
    assert faithful["verdict"] == "not measured" and "'one node ablated'" in faithful["note"]


def test_the_scorecard_carries_the_discover_rules_checks_to_the_path_cuts():
    """`scorecard` reads the failed checks of the discover rule's per-item tables into heads_via_mlps."""
    items = tf_circuit_items(0.95, 0.1, failed=FAILED)
    rows = verdicts.heads_via_mlps({"addition": path_cuts(0.5, 0.1, 0.6)}, CFG, seed=0,
                                   sanity={"addition": verdicts.failed_checks(items, ("resample", "mean"))})
    assert rows[1]["verdict"] == "inconclusive" and "resample ablation" in rows[1]["note"]
    import inspect

    assert "failed_checks(i, protocol.KINDS)" in inspect.getsource(verdicts.scorecard)


# ------------------------------------------------------------------------------------------------ fit gap
def test_a_circuit_fitted_to_its_pruning_pairs_is_inconclusive_naming_the_gap():
    """tf_<kind>_gap (identification minus validation full-answer faithfulness) above claims.max_fit_gap: the row is
    inconclusive, naming both numbers; within it, or without the columns (older tables), as before."""
    def gap_columns(ident_resample, ident_mean):
        return tf_columns(tf_resample_correct_identification=ident_resample, tf_resample_gap=ident_resample - 0.9,
                          tf_mean_correct_identification=ident_mean, tf_mean_gap=ident_mean - 0.9)

    summary = pd.concat([discover_summary("addition", [gap_columns(1.0, 0.95)]),
                         discover_summary("subtraction", [gap_columns(0.95, 0.92)]),
                         discover_summary("division", [tf_columns()])], ignore_index=True)
    by = {r["scope"]: r for r in verdicts.circuit_faithful(summary, CFG)}
    assert by["addition"]["verdict"] == "holds" and "fitted" not in by["addition"]["note"]  # 0.1 is not above 0.1
    summary.loc[0, "tf_resample_correct_identification"], summary.loc[0, "tf_resample_gap"] = 1.0, 0.25
    by = {r["scope"]: r for r in verdicts.circuit_faithful(summary, CFG)}
    assert by["addition"]["verdict"] == "inconclusive"
    assert by["addition"]["note"].startswith("inconclusive: resample: fitted 100% on identification, 90% on "
                                             "validation: gap 25 points above 10: the circuit is fitted to its "
                                             "pruning pairs")
    assert by["subtraction"]["verdict"] == "holds" and "fitted" not in by["subtraction"]["note"]
    assert by["division"]["verdict"] == "holds"
    assert "more than 10 points" in by["addition"]["rule"]
    # a stricter setting makes the subtraction circuit's gap of 5 points too large
    strict = {r["scope"]: r for r in verdicts.circuit_faithful(summary, CFG | {"max_fit_gap": 0.02})}
    assert strict["subtraction"]["verdict"] == "inconclusive"
    assert "gap 5 points above 2" in strict["subtraction"]["note"]


def test_the_pruning_orders_flag_is_a_note_on_the_circuit_rows():
    flag = "the union (36 nodes, f 0.76 [0.69, 0.83]) lies above the order's curve at 20% of the nodes (0.28)"
    summary = pd.concat([discover_summary("addition", [tf_columns(cpr_order_flag=flag)]),
                         discover_summary("division", [tf_columns(cpr_order_flag="")])], ignore_index=True)
    by = {r["scope"]: r for r in verdicts.circuit_faithful(summary, CFG)}
    assert "pruning order: " + flag in by["addition"]["note"] and by["addition"]["verdict"] == "holds"
    assert "pruning order" not in by["division"]["note"]

"""The study's circuit arm: the discovered circuits' union ranked as precise ranks all heads."""

import pandas as pd
import pytest

from arithmech.interp.nodes import circuit_first, parse_nodes
from arithmech.sft import design as sd
from arithmech.sft.methods import HEAD_METHODS, RECIPE_METHODS, layer_matched_weakest, select_nodes
from helpers import prepared_model_dir, tiny_config


def test_parse_nodes_round_trips_the_circuit_tables():
    from arithmech.interp.nodes import CircuitSet

    written = CircuitSet("discovered", "all", 2, -1, ((3, 2), (0, 1)), (5, 0)).nodes()
    assert parse_nodes(written) == ([(3, 2), (0, 1)], [5, 0])
    assert parse_nodes("") == ([], [])
    with pytest.raises(ValueError, match="'X3'"):
        parse_nodes("L1H2 X3")


def test_circuit_first_keeps_the_ranking_within_each_group():
    ranked = [(2, 1), (0, 3), (1, 1), (2, 0), (1, 0)]
    assert circuit_first(ranked, [(1, 0), (0, 3)]) == [(0, 3), (1, 0), (2, 1), (1, 1), (2, 0)]


def _tables():
    return {"addition": pd.DataFrame({"target": [0.8, 0.9], "chosen": [False, True],
                                      "nodes": ["L1H1", "L1H1 L2H0 L0MLP"]}),
            "subtraction": pd.DataFrame({"target": [0.8], "chosen": [True], "nodes": ["L2H0 L0H3"]})}


def test_circuit_arm_trains_the_union_strongest_first_as_precise():
    ranked = [(2, 1), (0, 3), (1, 1), (2, 0), (1, 0)]
    ranking, note = sd.circuit_ranking(ranked, _tables(), n=2)
    assert note is None
    assert ranking[:3] == [(0, 3), (1, 1), (2, 0)]  # the union {L1H1, L2H0, L0H3} in effect order
    study = {"heads": 2, "mlps": 1, "kv": "none", "lora": {}}
    nodes = {"ranked_mlps": [2, 0], "n_layers": 3, "n_heads": 4, "seed": 0}
    spec = sd.arm_method("circuit", "lr0", study, ranked_heads=ranking, **nodes)
    # trains as precise does, with no MLP (as the precise arm), the circuit's two strongest heads
    assert spec == {"method": "precise", "heads": [[0, 3], [1, 1]], "mlp_layers": [], "train_kv": False}
    assert spec["heads"] != sd.arm_method("precise", "lr0", study, ranked_heads=ranked, **nodes)["heads"]
    assert "circuit" in HEAD_METHODS and "circuit" not in RECIPE_METHODS
    assert select_nodes("circuit", ranking, [2], heads=2, mlps=0, n_layers=3, n_heads=4, seed=0)[0] == [(0, 3), (1, 1)]


def test_circuit_arm_says_when_the_union_is_smaller_than_the_arm():
    ranking, note = sd.circuit_ranking([(2, 1), (0, 3), (1, 1), (2, 0), (1, 0)], _tables(), n=4)
    assert "3 heads, fewer than study.heads = 4" in note and ranking[3] == (2, 1)
    bad = {"addition": pd.DataFrame({"target": [0.8], "chosen": [False], "nodes": ["L1H1"]})}
    with pytest.raises(ValueError, match="'addition' marks 0 circuits"):
        sd.circuit_ranking([(1, 1)], bad, n=1)


def test_the_study_compares_the_circuit_arm_with_precise():
    assert ("circuit", "precise") in sd.COMPARISONS and ("circuit", "random_heads") in sd.COMPARISONS


# ------------------------------------------------------------------------------------------------ head-set arms
RANKED = [(2, 1), (0, 3), (1, 1), (2, 0), (1, 0)]  # by patching effect; the key heads (study.heads = 2): the first two
ARM_NODES = {"ranked_mlps": [2, 0], "n_layers": 3, "n_heads": 4, "seed": 0}
STUDY = {"heads": 2, "mlps": 1, "kv": "none", "lora": {}}


def test_circuit_disjoint_trains_the_circuits_heads_outside_the_key_heads():
    """Where the circuit arm shares its heads with precise, circuit_disjoint trains none of precise's: the union's
    heads outside the top study.heads, strongest first, at most as many as precise; fewer when the union has
    fewer (said, never filled up with heads of neither set); an error naming the arm when it has none."""
    union = sd.discovered_union(_tables())
    assert union == {(1, 1), (2, 0), (0, 3)}
    spec = sd.arm_method("circuit_disjoint", "seed1", STUDY, ranked_heads=RANKED, circuit_heads=union, **ARM_NODES)
    assert spec == {"method": "precise", "heads": [[1, 1], [2, 0]], "mlp_layers": [], "train_kv": False}
    assert sd.head_overlap(spec["heads"], RANKED[:2]) == {"n_heads": 2, "overlap_precise": 0, "jaccard_precise": 0.0}
    circuit = sd.arm_method("circuit", "lr0", STUDY, ranked_heads=sd.circuit_ranking(RANKED, _tables(), 2)[0],
                            **ARM_NODES)
    assert sd.head_overlap(circuit["heads"], RANKED[:2]) == {"n_heads": 2, "overlap_precise": 1,
                                                             "jaccard_precise": pytest.approx(1 / 3)}
    assert sd.circuit_disjoint_note(RANKED, union, 2) is None
    few = {(0, 3), (1, 0)}  # one head outside the key heads
    heads, _ = select_nodes("circuit_disjoint", RANKED, [], heads=2, mlps=0, n_layers=3, n_heads=4, seed=0,
                            circuit=few)
    assert heads == [(1, 0)]
    assert "1 heads outside the 2 key heads, fewer than study.heads = 2" in sd.circuit_disjoint_note(RANKED, few, 2)
    with pytest.raises(ValueError, match="'circuit_disjoint' has no head to train.*drop it from study.arms"):
        select_nodes("circuit_disjoint", RANKED, [], heads=2, mlps=0, n_layers=3, n_heads=4, seed=0,
                     circuit={(2, 1)}, section="study")
    assert {"circuit_disjoint", "low_effect"} <= set(HEAD_METHODS) and "low_effect" not in RECIPE_METHODS


def _effects(values: dict[tuple[int, int], float], n_layers: int = 3, n_heads: int = 4) -> pd.DataFrame:
    rows = [{"node": f"L{l}H{h}", "layer": l, "head": h, "component": "head", "mean_effect": values.get((l, h), 0.0)}
            for l in range(n_layers) for h in range(n_heads)]
    rows += [{"node": f"L{l}MLP", "layer": l, "head": float("nan"), "component": "mlp", "mean_effect": -0.01 * l}
             for l in range(n_layers)]
    return pd.DataFrame(rows)


def test_low_effect_is_the_weakest_head_of_each_key_heads_layer():
    """The negative control: as many heads as precise, in the key heads' layers, each the head whose largest
    |effect| over the operators is smallest; a head strong in opposite directions on two operators is not weak."""
    base = {(l, h): -0.001 * (1 + l + 2 * h) for l in range(3) for h in range(4)}  # weaker with lower l and h
    add = _effects(base | {(2, 3): -0.5, (1, 2): -0.4, (2, 0): 0.3})
    sub = _effects(base | {(2, 3): -0.5, (1, 2): -0.4, (2, 0): -0.3})  # L2H0: +0.3 and -0.3, mean 0
    effects = {"addition": add, "subtraction": sub}
    from arithmech.interp.nodes import ranked_nodes

    ranked, mlps = ranked_nodes(effects)
    assert ranked[:2] == [(2, 3), (1, 2)]
    weakest = sd.weakest_heads(effects)
    assert weakest[0] == (0, 0) and weakest.index((2, 0)) > weakest.index((2, 2))
    spec = sd.arm_method("low_effect", "lr0", STUDY, ranked_heads=ranked, ranked_mlps=mlps, n_layers=3, n_heads=4,
                         seed=0, weakest_heads=weakest)
    # layer 2: L2H1 (L2H0 averages to 0 but is strong on both operators); layer 1: L1H0
    assert spec == {"method": "precise", "heads": [[2, 1], [1, 0]], "mlp_layers": [], "train_kv": False}
    assert sd.head_overlap(spec["heads"], ranked[:2])["overlap_precise"] == 0
    # a layer with no head left: the nearest layer's weakest, the lower first
    assert layer_matched_weakest([(1, 0), (1, 1)], [(0, 0), (2, 0), (1, 0), (1, 1)], n_layers=3) == [(0, 0), (2, 0)]


def test_head_overlap_counts_and_jaccard():
    assert sd.head_overlap([[0, 1], [0, 2], [1, 1]], [(0, 1), (1, 1), (2, 2), (2, 3)]) == {
        "n_heads": 3, "overlap_precise": 2, "jaccard_precise": 2 / 5}
    assert sd.head_overlap([], [])["n_heads"] == 0


def test_the_study_has_a_positive_control_and_compares_the_disjoint_arm():
    assert ("precise", "low_effect") in sd.COMPARISONS and ("circuit_disjoint", "precise") in sd.COMPARISONS
    assert ("circuit", "low_effect") in sd.COMPARISONS


def test_the_page_says_the_study_trains_another_operand_range_and_why():
    study = {"splits": {"train": 1000, "validation": 150, "test": 500}, "n_shots": 2}
    add2 = {"name": "add2", "task": "addition", "a_range": (10, 99), "b_range": (10, 99)}
    note = sd.operand_range_note(add2, {"min": 1, "max": 9}, study)
    assert "found on operands 1-9" in note and "`add2`, a in 10-99, b in 10-99. Not that range" in note
    assert "81 addition pairs in all, fewer than the 1652" in note
    inside = sd.operand_range_note(add2 | {"a_range": (2, 9), "b_range": (1, 9)}, {"min": 1, "max": 9}, study)
    assert inside.endswith("inside that range.")


def test_a_training_run_records_its_heads_overlap_with_precise(tiny_dir, tmp_path):
    """stats.json of a head arm's run says how many heads it trains and how many of them precise trains too."""
    import json

    from arithmech.stages.study import run_study_items, run_study_train

    model_dir = prepared_model_dir(tiny_dir, tmp_path)
    pairs = tmp_path / "pairs.parquet"
    pd.DataFrame({"a": [10], "b": [10]}).to_parquet(pairs)
    study = tiny_config()["study"] | {"heads": 2}
    study["train"] = study["train"] | {"max_steps": 1, "checkpoint_every": None}
    items = tmp_path / "items.parquet"
    run_study_items(model_dir=model_dir, pairs_paths={"addition": pairs}, study=study,
                    prompts={"shot_separator": ".\n"}, seed=0, out_items=items)
    effects = {"addition": tmp_path / "effects.parquet"}
    base = {(l, h): -0.001 * (1 + l + 2 * h) for l in range(3) for h in range(4)}
    _effects(base | {(2, 3): -0.5, (1, 2): -0.4}).to_parquet(effects["addition"])
    discover = {"addition": tmp_path / "discover.parquet"}
    pd.DataFrame({"target": [0.8], "chosen": [True], "nodes": ["L2H3 L0H1 L1MLP"]}).to_parquet(discover["addition"])
    compute = {"device": "cpu", "dtype": "float32", "batch_size": 4}
    def train(arm: str) -> dict:
        study["lr_grid"] = study["lr_grid"] | {arm: [1e-3]}
        run_study_train(model_dir=model_dir, items_path=items, effects_paths=effects, arm=arm, run="lr0", study=study,
                        compute=compute, seed=0, selection_path=None, out_dir=tmp_path / arm,
                        checkpoint_root=tmp_path / "ckpt", discover_paths=discover)
        return json.loads((tmp_path / arm / "stats.json").read_text())

    records = {"low_effect": train("low_effect")}
    with pytest.warns(UserWarning, match="1 heads outside the 2 key heads"):
        records["circuit_disjoint"] = train("circuit_disjoint")
    assert records["low_effect"]["spec"]["heads"] == [[2, 0], [1, 0]]
    assert {k: records["low_effect"][k] for k in ("n_heads", "overlap_precise", "jaccard_precise")} == {
        "n_heads": 2, "overlap_precise": 0, "jaccard_precise": 0.0}
    # the union {L2H3, L0H1} has one head outside the key heads {L2H3, L1H2}: trained alone, and said
    assert records["circuit_disjoint"]["spec"]["heads"] == [[0, 1]]
    assert records["circuit_disjoint"]["n_heads"] == 1
    assert "fewer than study.heads" in records["circuit_disjoint"]["circuit_note"]

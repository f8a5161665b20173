"""The study's circuit arm: the discovered circuits' union ranked as precise ranks all heads."""

import pandas as pd
import pytest

from arithmech.interp.nodes import circuit_first, parse_nodes
from arithmech.sft import design as sd
from arithmech.sft.methods import HEAD_METHODS, RECIPE_METHODS, select_nodes


def test_parse_nodes_round_trips_the_circuit_tables():
    from arithmech.interp.sufficiency import CircuitSet

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

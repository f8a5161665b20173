"""Tests for arithmech.interp.sufficiency (torch-free): the circuits' node sets, faithfulness with its intervals, the
key circuit against random ones; and the edges stage on the tiny model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from arithmech.interp import sufficiency

N_LAYERS, N_HEADS = 4, 6
RANKED = [(l, h) for h in reversed(range(N_HEADS)) for l in reversed(range(N_LAYERS))]  # L3H5 L2H5 ... L0H0
KEY = RANKED[:3]


def _sets():
    """The model, the empty circuit and the key heads with the key MLPs and with every MLP."""
    every = tuple(range(N_LAYERS))
    return [sufficiency.CircuitSet("model", "all", len(RANKED), -1, tuple(RANKED), every),
            sufficiency.CircuitSet("empty", "none", 0, -1, (), ()),
            sufficiency.CircuitSet("key", "key", len(KEY), -1, tuple(KEY), (2, 3)),
            sufficiency.CircuitSet("key", "all", len(KEY), -1, tuple(KEY), every)]


def test_circuit_set_ablates_every_node_it_does_not_keep():
    model, empty, key_key, _ = _sets()
    assert model.ablated(N_LAYERS, N_HEADS) == ([], [])
    heads, mlps = empty.ablated(N_LAYERS, N_HEADS)
    assert len(heads) == N_LAYERS * N_HEADS and mlps == list(range(N_LAYERS))
    kept_h, kept_m = key_key.ablated(N_LAYERS, N_HEADS)
    assert set(kept_h) == {(l, h) for l in range(N_LAYERS) for h in range(N_HEADS)} - set(KEY) and kept_m == [0, 1]
    assert key_key.nodes() == "L3H5 L2H5 L1H5 L2MLP L3MLP"


def test_faithfulness_table_and_intervals():
    sets = _sets()
    rng = np.random.default_rng(0)
    n = 40
    model, empty = np.ones(n), np.zeros(n)
    half = (np.arange(n) % 2).astype(float)  # keeps half of the behaviour
    values = {"full": np.stack([model, empty, half, model]),
              "logit": np.stack([30 + rng.random(n), 20 + rng.random(n), 25 + rng.random(n), 20 + rng.random(n)])}
    clusters = np.arange(n) // 2  # two items per operand pair
    table = sufficiency.faithfulness_table(sets, values, clusters, n_boot=500, seed=0, confidence=0.95)
    assert list(table["curve"]) == ["model", "empty", "key", "key"]
    assert table["faithfulness_full"].tolist() == [1.0, 0.0, 0.5, 1.0]
    # a whole cluster holds one kept and one lost item: every resample keeps exactly half
    assert table.loc[2, "faithfulness_full_low"] == table.loc[2, "faithfulness_full_high"] == 0.5
    f = table["faithfulness_logit"]
    expected = ((values["logit"].mean(1) - values["logit"][1].mean())
                / (values["logit"][0].mean() - values["logit"][1].mean()))
    np.testing.assert_allclose(f, expected)
    assert ((table["faithfulness_logit_low"] <= f + 1e-12).all()
            and (f <= table["faithfulness_logit_high"] + 1e-12).all())
    assert table.loc[2, "faithfulness_logit_high"] - table.loc[2, "faithfulness_logit_low"] > 0.01
    # the model and the empty circuit alike: undefined, not a division by zero
    flat = sufficiency.faithfulness_table(sets, {"first": np.ones((4, n))}, clusters, n_boot=50, seed=0,
                                          confidence=0.95)
    assert flat["faithfulness_first"].isna().all()
    with pytest.raises(ValueError, match="exactly one 'model'"):
        sufficiency.faithfulness_table(sets[1:], {"full": values["full"][1:]}, clusters, n_boot=10, seed=0,
                                       confidence=0.95)


def _items(key_value, random_values, n=30):
    rows = []
    for curve, mlps, k, seed, value in [("model", "all", 24, -1, 1.0), ("empty", "none", 0, -1, 0.0),
                                        ("key", "key", 3, -1, key_value),
                                        *[("random", "key", 3, d, v) for d, v in enumerate(random_values)]]:
        for i in range(n):
            rows.append({"curve": curve, "mlps": mlps, "k": k, "seed": seed, "sample_id": i, "cluster": str(i // 3),
                         "full_correct": float(value if isinstance(value, float) else value[i]),
                         "answer_logit": 10.0 * float(value if isinstance(value, float) else value[i])})
    return pd.DataFrame(rows)


def test_key_vs_random():
    res = sufficiency.key_vs_random(_items(0.9, [0.2, 0.4]), measure="full", mlps="key", n_boot=200, seed=0,
                                    confidence=0.95)
    assert res["key"] == pytest.approx(0.9) and res["random"] == pytest.approx(0.3)
    assert res["difference"] == pytest.approx(0.6) and res["ci_low"] == pytest.approx(0.6)  # constant per item
    assert res["draws"] == 2 and res["n_items"] == 30 and res["n_clusters"] == 10
    mixed = np.r_[np.ones(15), np.zeros(15)]
    res = sufficiency.key_vs_random(_items(mixed, [np.zeros(30)]), measure="logit", mlps="key", n_boot=300, seed=0,
                           confidence=0.95)
    assert res["difference"] == pytest.approx(0.5) and res["ci_low"] < 0.5 < res["ci_high"]
    assert sufficiency.key_vs_random(_items(0.9, [0.2]), measure="full", mlps="all", n_boot=10, seed=0,
                                     confidence=0.95) is None
    alone = sufficiency.key_vs_random(_items(0.9, []), measure="full", mlps="key", n_boot=50, seed=0, confidence=0.95)
    assert alone["key"] == pytest.approx(0.9) and alone["draws"] == 0  # no random draw: its own numbers, NaN diff
    assert np.isnan(alone["difference"]) and np.isnan(alone["ci_low"]) and np.isnan(alone["random"])


def test_pooled_values_keep_each_set_on_its_own_items_when_groups_differ_in_size():
    """Pooled over operators that score 3 and 2 pairs: set s's row is set s's values of the first operator's pairs,
    then of the second's, and the clusters follow (a reshape by operator count mixes sets once the counts differ)."""
    rows = []
    for task, n in (("addition", 3), ("division", 2)):
        for s in range(2):  # set-major, as the stages write a per-item table
            rows += [{"task": task, "cluster": f"{task}:{i}", "full_correct": 100 * s + 10 * (task == "division") + i}
                     for i in range(n)]
    items = pd.DataFrame(rows)
    values, clusters = sufficiency.pooled_values(items, 2, {"full": "full_correct"}, groups=["addition", "division"])
    np.testing.assert_array_equal(values["full"], [[0, 1, 2, 10, 11], [100, 101, 102, 110, 111]])
    assert clusters.tolist() == ["addition:0", "addition:1", "addition:2", "division:0", "division:1"]
    with pytest.raises(ValueError, match="'division': 3 rows are not 2 sets"):
        sufficiency.pooled_values(items.iloc[:-1], 2, {"full": "full_correct"}, groups=["addition", "division"])


# ------------------------------------------------------------------------------------------------ the stages
from helpers import COMPUTE  # noqa: E402


def test_edges_stage_cuts_the_key_heads_paths(prepared, tmp_path):  # noqa: F811
    """Per scored validation pair and ablation: the answer's teacher-forced log-probability with the key heads' edges
    kept and cut (`edges.path_cuts`), the same items and model under both ablations."""
    from arithmech.data.arithmetic import split_pairs
    from arithmech.stages.circuit import PATH_CUT_COLUMNS, run_edges

    pd.DataFrame({"component": ["head", "head", "mlp"], "layer": [1, 1, 0], "head": [3, 2, -1]}).to_parquet(
        tmp_path / "key.parquet")
    run_edges(model="tiny", model_dir=prepared / "model", tasks=["division"], pairs_paths=[prepared / "pairs.parquet"],
              key_paths=[tmp_path / "key.parquet"], edges={"max_samples": 6}, compute=COMPUTE, seed=0,
              out_paths=[tmp_path / "ep.parquet"])
    cuts = pd.read_parquet(tmp_path / "ep.parquet")
    assert list(cuts.columns) == PATH_CUT_COLUMNS and set(cuts["kind"]) == {"resample", "mean"}
    by_kind = {k: part.reset_index(drop=True) for k, part in cuts.groupby("kind")}
    pd.testing.assert_series_equal(by_kind["mean"]["model"], by_kind["resample"]["model"])
    assert (by_kind["mean"]["both"] != by_kind["mean"]["model"]).any()
    pairs = split_pairs(pd.read_parquet(prepared / "pairs.parquet"), "validation", "pairs")
    assert set(cuts["sample_id"]) <= set(pairs["sample_id"])
    # no key head: no rows, the columns kept
    pd.DataFrame({"component": ["mlp"], "layer": [0], "head": [-1]}).to_parquet(tmp_path / "none.parquet")
    run_edges(model="tiny", model_dir=prepared / "model", tasks=["division"], pairs_paths=[prepared / "pairs.parquet"],
              key_paths=[tmp_path / "none.parquet"], edges={"max_samples": 6}, compute=COMPUTE, seed=0,
              out_paths=[tmp_path / "none_ep.parquet"])
    empty = pd.read_parquet(tmp_path / "none_ep.parquet")
    assert empty.empty and list(empty.columns) == PATH_CUT_COLUMNS


def test_sanity_stop_stops_on_every_ablation_the_verdicts_read():
    """`circuit.discover.sanity: stop`: a failed check of either ablation stops the rule (the verdicts read both);
    `warn`: none stops, the failures are recorded and the verdicts say inconclusive."""
    from arithmech.interp import protocol

    assert sufficiency.strict_kinds("stop") == list(protocol.KINDS) == ["resample", "mean"]
    assert sufficiency.strict_kinds("warn") == []

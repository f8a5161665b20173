"""The shared circuit (`stages.discover.run_discover_shared`) on the tiny model: one circuit pruned on two operators'
identification pairs together, its tables and its summary row (`run_discover_union` appends it to the summary:
tests/workflow/test_workflow.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from arithmech.interp import protocol
from helpers import COMPUTE

# small targets: the chosen circuit is small enough for disjoint random circuits of its size
DISCOVER = {"tf_measure": "logprob", "tf_ablation": "mean", "sanity_draws": 4, "sanity_samples": None,
            "sanity": "warn", "protocol": "teacher_forced", "measure": "logit_diff", "targets": [0.3, 0.5],
            "min_full_share": 0.8, "selection_samples": 2, "max_samples": 4, "validation_samples": 6,
            "random_draws": 2, "max_trials": 1000, "max_passes": 3, "ig_steps": 4, "bootstrap": 50,
            "confidence": 0.95}
TASKS = ["division", "halves"]  # the second operator: division's pairs again under another name


def test_shared_circuit_is_pruned_on_every_operator_and_scored_like_theirs(prepared, tmp_path):  # noqa: F811
    from arithmech.stages.discover import SHARED, run_discover_shared

    out = {name: tmp_path / f"shared{name}.parquet" for name in ("", "_validation", "_items", "_summary")}
    # the random tiny model answers no full answer right: no target keeps 80% of it, the largest is taken, warned
    with pytest.warns(UserWarning, match="min_full_share"):
        run_discover_shared(model="tiny", model_dir=prepared / "model", tasks=TASKS,
                            pairs_paths=[prepared / "pairs.parquet"] * 2, discover=DISCOVER, compute=COMPUTE,
                            seed=0, out_table=out[""], out_validation=out["_validation"], out_items=out["_items"],
                            out_summary=out["_summary"])
    table = pd.read_parquet(out[""])
    assert table["target"].tolist() == [0.3, 0.5] and table["chosen"].tolist() == [False, True]
    assert (abs(1 - table["faithfulness"]) <= 1 - table["target"] + 1e-9).all() and table["minimal"].all()
    assert (table["pruned_on"] == "tf_mean_logprob").all()
    # pruned on max_samples (4) pairs in all, 2 of each operator's draw (fewer where a terminator continues the
    # number): not 4 per operator
    assert (table["n_identification"] <= 4).all() and (table["n_identification"] > 2).all()
    for kind in protocol.KINDS:
        assert table[f"tf_{kind}_correct_identification"].notna().all() or table["model_full_accuracy"].eq(0).all()
    validation = pd.read_parquet(out["_validation"])
    assert validation["task"].unique().tolist() == [*TASKS, SHARED]
    for task, rows in validation.groupby("task", sort=False):
        assert sorted(rows["curve"].unique()) == ["discovered", "empty", "model", "random", "share"], task
        found = rows[rows["curve"] == "discovered"]
        assert found["nodes"].tolist() == table["nodes"].tolist() and found["target"].tolist() == [0.3, 0.5]
        random = rows[rows["curve"] == "random"]
        chosen = table[table["chosen"]].iloc[0]
        assert len(random) == 2 and (random["n_heads"] == chosen["n_heads"]).all()
        assert (rows.loc[rows["curve"] == "share", "node_share"].to_numpy() > 0).all()
        model = rows[rows["curve"] == "model"].iloc[0]
        for kind in protocol.KINDS:
            assert model[f"faithfulness_tf_{kind}_tail_logprob"] == pytest.approx(1)
    # the pooled rows: every operator's items, sample ids named by their operator
    items = pd.read_parquet(out["_items"])
    per_task = validation.groupby("task", sort=False)["tf_n_items"].first()
    assert per_task[SHARED] == per_task[TASKS].sum()
    assert items["sample_id"].str.split(":").str[0].unique().tolist() == TASKS
    # the two operators are the same pairs: every circuit's faithfulness is theirs, pooled or not
    for column in ("faithfulness_tf_mean_tail_logprob", "faithfulness_tf_resample_tail_logprob"):
        per = validation[validation["task"] == TASKS[0]][column].to_numpy()
        np.testing.assert_allclose(validation[validation["task"] == TASKS[1]][column].to_numpy(), per)
        np.testing.assert_allclose(validation[validation["task"] == SHARED][column].to_numpy(), per, rtol=1e-6)
    summary = pd.read_parquet(out["_summary"])
    row = summary.iloc[0]
    assert len(summary) == 1 and row["task"] == SHARED and row["target"] == 0.5 and row["draws"] == 2
    assert row["n_heads"] == chosen["n_heads"] and row["share"] == pytest.approx(chosen["n_nodes"] / 10)
    for kind in protocol.KINDS:
        assert row[f"tf_{kind}_gap"] == pytest.approx(
            row[f"tf_{kind}_correct_identification"] - row[f"tf_{kind}_correct"], nan_ok=True)
        for column in ("correct", "logprob", "random_diff"):
            for suffix in ("", "_low", "_high"):
                assert f"tf_{kind}_{column}{suffix}" in summary


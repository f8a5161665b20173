"""The circuit rules' entry points (`arithmech.stages.circuit`) on the tiny model."""

import pandas as pd

from helpers import COMPUTE


def test_edges_stage_cuts_the_key_heads_paths(prepared, tmp_path):
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

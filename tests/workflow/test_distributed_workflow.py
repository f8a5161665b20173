"""The tiny workflow's fine-tuning with `gpus: 2` (two gloo processes on CPU) through Snakemake's local executor:
the same evaluation table (Table 1) as with one process, within tolerance, and the same study runs (training
with learning-curve evaluations on every rank)."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers import ROOT, TINY_CONFIG, copy_project, snakemake

pytestmark = pytest.mark.slow  # whole workflow runs

TARGET = "results/tiny/eval/summary.parquet"
MARKER = "hf_arithmechMarkerNotARealToken0123"
STUDY_RUNS = ["results/tiny/finetune/study/runs/full/lr0", "results/tiny/finetune/study/runs/lora/lr0"]


def overlay(work, name, gpus):
    """The smoke configuration with full fine-tuning (FSDP2 over 2 ranks) and LoRA (data parallel), whose
    fine-tuning jobs ask for `gpus`; one operator and two evaluation sets (a generated answer and a perplexity)
    keep the jobs that only read the fine-tuned weights few."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"run": {"tasks": ["addition"]}, "finetune": {"methods": ["full", "lora"]},
                                    "evaluation": {"datasets": ["gsm8k", "wikitext"]},
                                    "models": {"tiny": {"resources": {"finetune": {"gpus": gpus}}}}}))
    return path.name


def test_finetune_on_two_processes_gives_the_one_process_table(tmp_path):
    (tmp_path / "checkout").mkdir()
    work = copy_project(tmp_path / "checkout")
    shutil.copy2(ROOT / "config.yaml", work / "config.yaml")
    (work / "tests/config").mkdir(parents=True)
    shutil.copy2(TINY_CONFIG, work / "tests/config/tiny.yaml")
    common = ["--cores", "2", "--max-threads", "1", "--configfile", "tests/config/tiny.yaml"]  # as `make run`
    one = snakemake(work, TARGET, *STUDY_RUNS, *common, overlay(work, "one", 1))
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-5000:]
    table_one = pd.read_parquet(work / TARGET)
    stats_one = json.loads((work / "results/tiny/finetune/full/stats.json").read_text())
    study_one = {run: (json.loads((work / run / "stats.json").read_text()), pd.read_parquet(work / run / "val.parquet"))
                 for run in STUDY_RUNS}

    two = snakemake(work, TARGET, *STUDY_RUNS, "--forcerun", "finetune", "study_train", *common,
                    overlay(work, "two", 2), env={"HF_TOKEN": MARKER})
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-5000:]
    # an exported token stays out of the jobs and their ranks (arithmech.tools.hub_token): no log or output has it
    assert "HF_TOKEN is kept out of the jobs' environment" in two.stderr and MARKER not in two.stdout + two.stderr
    assert [p for p in work.rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()] == []
    table_two = pd.read_parquet(work / TARGET)
    for method in ("full", "lora"):
        stats = json.loads((work / f"results/tiny/finetune/{method}/stats.json").read_text())
        assert stats["world_size"] == 2, method
        log = (work / f"results/tiny/logs/finetune/{method}.log").read_text()
        assert "training over 2 processes (gloo)" in log and f"{method}: " in log, log[-2000:]  # rank 0's own lines
    stats_two = json.loads((work / "results/tiny/finetune/full/stats.json").read_text())
    assert stats_two["model_dtype"] == stats_one["model_dtype"] == "float32"
    np.testing.assert_allclose(stats_two["losses"], stats_one["losses"], rtol=1e-5)
    assert not list((work / "results/tiny/finetune").glob(".*tmp*"))  # nothing half-written left
    for run, (stats, val) in study_one.items():
        stats_two = json.loads((work / run / "stats.json").read_text())
        assert stats_two["world_size"] == 2 and stats["world_size"] == 1, run
        np.testing.assert_allclose(stats_two["losses"], stats["losses"], rtol=1e-5, err_msg=run)
        curve = [e["val_nll"] for e in stats["evaluations"]]
        np.testing.assert_allclose([e["val_nll"] for e in stats_two["evaluations"]], curve, rtol=1e-4, err_msg=run)
        val_two = pd.read_parquet(work / run / "val.parquet")
        assert list(val_two["correct"]) == list(val["correct"]), run
        np.testing.assert_allclose(val_two["nll"], val["nll"], rtol=1e-4, err_msg=run)

    assert list(table_two["method"]) == list(table_one["method"]) == ["base", "full", "lora"]
    timing = {"mean_step_s", "train_time_s", "peak_memory_mb", "peak_memory_kind", "artifact_mb"}
    for column in table_one.columns.difference(list(timing)):
        if pd.api.types.is_float_dtype(table_one[column]):
            np.testing.assert_allclose(table_two[column], table_one[column], rtol=1e-4, err_msg=column)
        else:
            assert list(table_two[column]) == list(table_one[column]), column

"""The rehearsal's pieces (arithmech.rehearsal): the Hub-layout directories read by `datasets` and the
loaders as fetch_dataset reads them, the overlay config the schema accepts, and the per-job table of the
stand-in sbatch's records. The rehearsal itself (`make rehearsal`) is too long for the suite."""

import json

import pandas as pd
import pytest
import yaml

from arithmech import rehearsal
from arithmech.data import fetch_hub, load_commonsense_qa, load_mmlu
from arithmech.plan import load_config


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return rehearsal.hub_layout(tmp_path_factory.mktemp("hub"))


@pytest.mark.parametrize("name, loader, rows", [("mmlu", load_mmlu, rehearsal.MMLU_ROWS),
                                                ("commonsense_qa", load_commonsense_qa, rehearsal.COMMONSENSE_QA_ROWS)])
def test_hub_layout_is_read_as_fetch_dataset_reads_the_hub(hub, tmp_path, monkeypatch, name, loader, rows):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / f"{name}.parquet"
    fetch_hub(hub[name], out, loader)  # load_dataset on the directory, then the set's own loader as a check
    table = loader(out)
    assert len(table) == rows
    assert table["correct"].between(0, table["choices"].map(len) - 1).all()


def test_check_fetchable_names_the_set_and_what_is_wrong(hub, tmp_path, monkeypatch):
    """What the Snakefile's onstart runs for every Hub set not yet fetched (tests/test_workflow.py has the
    run it stops)."""
    from arithmech.eval_sets import check_fetchable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    check_fetchable("mmlu", hub["mmlu"])
    check_fetchable("commonsense_qa", hub["commonsense_qa"])
    with pytest.raises(RuntimeError, match=r"'evaluation.mmlu.hub.split'\): .* has no split 'dev'; it has test"):
        check_fetchable("mmlu", {**hub["mmlu"], "split": "dev"})
    with pytest.raises(RuntimeError, match=r"evaluation data set 'mmlu' \(config key 'evaluation.mmlu.hub': .*"
                                           r"cannot be fetched"):
        check_fetchable("mmlu", {**hub["mmlu"], "path": str(tmp_path / "nothing")})


def test_overlay_passes_the_schema_over_the_paper_config(tmp_path, hub):
    for size in ("quick", "full"):
        extra = rehearsal.overlay(tmp_path / "model", hub, size)
        path = tmp_path / f"{size}.yaml"
        path.write_text(yaml.safe_dump(extra))
        config = load_config([rehearsal.ROOT / "configs/paper.yaml", path], root=rehearsal.ROOT)
        assert config["run"]["models"] == ["rehearsal"]
        assert config["prompts"]["keep_only_correct"] is False
        # the paper's shape stays: its templates, operator words, caps, threshold and fine-tuned components
        assert len(config["prompts"]["templates"]) == 12
        assert all(len(words) == 3 for words in config["prompts"]["operators"].values())
        assert config["prompts"]["splits"]["max_samples"] == {"identification": 1000, "validation": 1000}
        heads = config["key_components"]["heads"]
        assert (heads["rule"], heads["threshold"]) == ("threshold", -0.05)
        assert (config["finetune"]["heads"], config["finetune"]["mlps"]) == (32, 2)
        assert config["evaluation"]["mmlu"]["hub"]["path"] == hub["mmlu"]["path"]
        quick = size == "quick"
        assert (config["finetune"]["data"]["n"] == 128) is quick
        assert (config["evaluation"]["gsm8k"]["n"] is None) is not quick


def test_job_table_reads_the_stand_in_records(tmp_path):
    (tmp_path / "call_101").write_text("--parsable --comment rule_knockout_wildcards_rehearsal_addition -A x")
    (tmp_path / "usage_101").write_text(json.dumps({"wall_s": 12.5, "max_rss_mb": 900.0, "exit": 0}))
    (tmp_path / "state_101").write_text("COMPLETED\n")
    (tmp_path / "call_102").write_text("--comment rule_knockout_wildcards_rehearsal_division")
    (tmp_path / "state_102").write_text("RUNNING\n")
    (tmp_path / "call_103").write_text("--comment rule_edges_wildcards_rehearsal")
    (tmp_path / "usage_103").write_text(json.dumps({"wall_s": 3.0, "max_rss_mb": 400.0, "exit": 0}))
    jobs = rehearsal.job_table(tmp_path)
    assert list(jobs["rule"]) == ["knockout", "knockout", "edges"]
    assert list(jobs["wildcards"]) == ["rehearsal_addition", "rehearsal_division", "rehearsal"]
    assert jobs.loc[0, "wall_s"] == 12.5 and pd.isna(jobs.loc[1, "wall_s"])
    by_rule = rehearsal.per_rule(jobs)
    assert by_rule.loc["knockout", "jobs"] == 2 and by_rule.loc["knockout", "max_rss_mb"] == 900.0
    assert list(by_rule.index) == ["knockout", "edges"]
    with_plan = rehearsal.per_rule(jobs, {"prepare_model": 1, "knockout": 2, "edges": 1})
    assert list(with_plan.index) == ["knockout", "edges", "prepare_model"]  # a local rule: no sbatch job
    assert list(with_plan["planned"]) == [2, 1, 1] and list(with_plan["jobs"]) == [2, 1, 0]

"""The registry of evaluation data sets (arithmech.data.eval_sets): it agrees with the config schema, each entry's
loader reads its vendored file, bad `evaluation` sections fail naming the key, and a Hub fetch failure names
the set. Nothing here touches the network."""

import copy
import subprocess
import sys

import pytest
import yaml

from arithmech import hub_lock
from arithmech.config import validate_config
from arithmech.data import datasets, eval_sets
from arithmech.data.eval_sets import KIND_KEYS, REGISTRY
from helpers import ROOT

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
KIND_BLOCKS = {"math": "generation", "qa": "generation", "choice": "choice", "perplexity": "perplexity"}


def test_registry_and_schema_agree():
    """Every registry set has a schema block of its kind's shape, whose settings are the kind's keys; the
    schema has no block for a set the registry lacks."""
    evaluation = yaml.safe_load(SCHEMA.read_text())["properties"]["evaluation"]
    settings = {"datasets", "style", "n_shots", "batch_size", "confidence"}
    assert set(evaluation["properties"]) - settings == set(REGISTRY)
    for name, spec in REGISTRY.items():
        assert spec.kind in KIND_KEYS
        ref = evaluation["properties"][name]["$ref"]
        assert ref == f"#/properties/evaluation/$defs/{KIND_BLOCKS[spec.kind]}", name
        block = evaluation["$defs"][KIND_BLOCKS[spec.kind]]
        assert set(block["required"]) == set(spec.keys), name
        assert set(block["properties"]) == {"file", "hub", *spec.keys}, name


def test_default_sets_and_their_order(config):
    assert config["evaluation"]["datasets"] == ["gsm8k", "svamp", "social_iqa", "strategyqa", "qa_wikidata", "wikitext"]
    assert [n for n, s in REGISTRY.items() if s.kind == "math"] == ["gsm8k", "svamp"]
    assert {REGISTRY[n].kind for n in ("mmlu", "commonsense_qa", "social_iqa", "strategyqa")} == {"choice"}


@pytest.mark.parametrize(
    "name, path, columns",
    [
        ("gsm8k", "gsm8k/test.jsonl", ["id", "question", "answer", "solution", "gold"]),
        ("svamp", "svamp/SVAMP.json", ["id", "question", "equation", "gold", "type"]),
        ("social_iqa", "bigbench/social_iqa/task.json", ["id", "input", "choices", "correct"]),
        ("strategyqa", "bigbench/strategyqa/task.json", ["id", "input", "choices", "correct"]),
        ("qa_wikidata", "bigbench/qa_wikidata/task.json", ["id", "input", "targets"]),
    ],
)
def test_each_entrys_loader_reads_its_vendored_file(name, path, columns):
    assert list(REGISTRY[name].load(datasets.DATA_DIR / path).columns) == columns


def test_wikitext_entry_reads_the_text():
    assert REGISTRY["wikitext"].load(datasets.DATA_DIR / "wikitext-2/test.txt").startswith(" \n = Robert <unk> = \n")


def test_hub_sets_merge_into_a_valid_config(config):
    """An overlay replaces a vendored file by a Hub source with `file: null`; MMLU comes from the Hub."""
    from snakemake.utils import update_config

    update_config(config, {"evaluation": {
        "datasets": ["gsm8k", "mmlu", "wikitext"],
        "gsm8k": {"file": None, "hub": {"path": "openai/gsm8k", "name": "main", "split": "test"}},
        "mmlu": {"hub": {"path": "cais/mmlu", "name": "all", "split": "test"}, "n": 100},
    }})
    validate_config(config, SCHEMA)
    assert eval_sets.config_problems(config["evaluation"]) == []


def test_unknown_data_set_names_the_key(config, check_fails):
    config["evaluation"]["datasets"].append("gsm9k")
    check_fails(config, "config key 'evaluation.datasets.6': unknown data set 'gsm9k'", "known: gsm8k, svamp")
    config["evaluation"]["gsm9k"] = {"file": "x.jsonl", "n": 3, "max_new_tokens": 4}
    check_fails(config, "config key 'evaluation'", "'gsm9k' was unexpected")


def test_listed_set_needs_its_block(config, check_fails):
    config["evaluation"]["datasets"].append("mmlu")
    check_fails(config, "config key 'evaluation.mmlu': missing; data set 'mmlu' is in evaluation.datasets")


def test_exactly_one_of_file_and_hub(config, check_fails):
    bad = copy.deepcopy(config)
    bad["evaluation"]["svamp"]["file"] = None
    check_fails(bad, "config key 'evaluation.svamp': give exactly one of file and hub")
    bad["evaluation"]["svamp"]["hub"] = {"path": "ChilleD/SVAMP", "split": "test"}
    validate_config(bad, SCHEMA)
    bad["evaluation"]["svamp"]["file"] = "resources/data/svamp/SVAMP.json"
    check_fails(bad, "config key 'evaluation.svamp': give exactly one of file and hub")
    del config["evaluation"]["svamp"]["file"]
    check_fails(config, "config key 'evaluation.svamp': give exactly one of file and hub")


def test_hub_needs_a_split_and_a_set_whose_loader_reads_the_hub(config, check_fails):
    bad = copy.deepcopy(config)
    bad["evaluation"]["gsm8k"] = {"hub": {"path": "openai/gsm8k", "name": "main"}, "n": 3, "max_new_tokens": 4}
    check_fails(bad, "config key 'evaluation.gsm8k.hub': 'split' is a required property")
    config["evaluation"]["social_iqa"] = {"file": None, "hub": {"path": "allenai/social_i_qa", "split": "validation"},
                                          "n": 3}
    check_fails(config, "config key 'evaluation.social_iqa.hub': the social_iqa loader reads only the vendored")


def test_stride_below_window_for_perplexity_sets(config, check_fails):
    config["evaluation"]["wikitext"]["stride"] = 512
    check_fails(config, "config key 'evaluation.wikitext.stride': must be smaller than max_length")


def test_fetch_failure_names_the_set(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr("datasets.load_dataset", offline)  # Hugging Face datasets
    monkeypatch.setattr(hub_lock, "resolve_commit", lambda *args: "ab" * 20)  # the Hub's answer to the revision
    out = tmp_path / "results/data/mmlu.parquet"
    with pytest.raises(RuntimeError, match=r"evaluation data set 'mmlu' \(config key 'evaluation.mmlu.hub': "
                                           r"cais/mmlu \(config all\), split test\): ConnectionError: no network"):
        eval_sets.fetch("mmlu", {"path": "cais/mmlu", "name": "all", "split": "test"}, out)
    assert list(out.parent.iterdir()) == []


def test_registry_imports_no_torch():
    """The Snakefile reads the registry and the config checks when it builds the DAG."""
    code = ("import sys, arithmech.data.eval_sets, arithmech.config; "
            "sys.exit('torch' in sys.modules or 'datasets' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_evaluate_runs_hub_layout_sets_by_their_kind(tmp_path):
    """run_evaluate on the tiny model: MMLU (choice) and GSM8K (math, few-shot) read from local Parquet files
    in the Hub's layout, as fetch_dataset leaves them."""
    import pandas as pd
    from datasets import Dataset

    from arithmech.stages.finetune import run_evaluate
    from arithmech.stages.identify import run_prepare_model

    model_dir = tmp_path / "model"
    run_prepare_model(source={"tiny": {"n_layers": 2}}, out_dir=model_dir)
    mmlu = tmp_path / "data/mmlu.parquet"
    mmlu.parent.mkdir()
    Dataset.from_dict({"question": ["2 + 3 =", "1 + 1 =", "4 - 1 ="], "subject": ["math"] * 3,
                       "choices": [["4", "5"], ["2", "3", "4"], ["3", "5"]], "answer": [1, 0, 0]}).to_parquet(str(mmlu))
    gsm8k = tmp_path / "data/gsm8k.parquet"
    records = [{"question": "What is 2 + 3?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"},
               {"question": "What is 4 - 1?", "answer": "4 - 1 = 3\n#### 3"}]
    Dataset.from_list(records).to_parquet(str(gsm8k))
    common = {"model": "tiny", "model_dir": model_dir, "method": "base", "finetune_dir": None,
              "compute": {"device": "cpu", "dtype": "float32", "batch_size": 4}, "seed": 0}
    evaluation = {"style": "plain", "batch_size": 2, "n_shots": 1, "mmlu": {"n": 2},
                  "gsm8k": {"n": None, "max_new_tokens": 3}}
    run_evaluate(**common, dataset="mmlu", data_path=mmlu, shots_path=None, evaluation=evaluation,
                 out_path=tmp_path / "mmlu.parquet")
    rows = pd.read_parquet(tmp_path / "mmlu.parquet")
    assert len(rows) == 2 and set(rows["id"]) <= {"mmlu-0", "mmlu-1", "mmlu-2"}
    assert set(rows["dataset"]) == {"mmlu"} and rows["correct"].dtype == bool
    run_evaluate(**common, dataset="gsm8k", data_path=gsm8k, shots_path=datasets.DATA_DIR / "gsm8k/train.jsonl",
                 evaluation=evaluation, out_path=tmp_path / "gsm8k.parquet")
    rows = pd.read_parquet(tmp_path / "gsm8k.parquet")
    assert rows["id"].tolist() == ["gsm8k-gsm8k-0", "gsm8k-gsm8k-1"] and rows["gold"].tolist() == [5.0, 3.0]
    assert rows["prompt"].str.endswith("Question: What is 2 + 3?\nAnswer:").iloc[0]
    with pytest.raises(ValueError, match="unknown evaluation data set 'gsm9k'"):
        run_evaluate(**common, dataset="gsm9k", data_path=gsm8k, shots_path=None, evaluation=evaluation,
                     out_path=tmp_path / "x.parquet")

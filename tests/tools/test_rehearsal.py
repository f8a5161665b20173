"""The rehearsal's pieces (arithmech.tools.rehearsal): the Hub-layout directories read by `datasets` and the
loaders as fetch_dataset reads them, the overlay config the schema accepts, and the per-job table: the jobs the
SLURM executor plugin logs as submitted, with what the test suite's real Slurm (`slurm_cluster`) recorded for them
in `sacct`. The rehearsal itself (`make rehearsal`) is too long for the suite."""

import json
import os
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from arithmech.data.datasets import fetch_hub, load_commonsense_qa, load_mmlu
from arithmech.tools import rehearsal
from arithmech.tools.plan import load_config, read_records
from helpers import ROOT


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
    """What the Snakefile's onstart runs for every Hub set not yet fetched (tests/workflow/test_workflow.py has the
    run it stops)."""
    from arithmech.data.eval_sets import check_fetchable

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
        config = load_config([ROOT / "configs/paper.yaml", path], root=ROOT)
        assert config["run"]["models"] == ["rehearsal"]
        assert config["prompts"]["keep_only_correct"] is False
        assert config["circuit"]["discover"]["sanity"] == "warn"  # the random model gets nothing right
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
        # the study keeps its jobs (arms, grids, seeds, draws, heads); quick trains fewer steps on fewer items
        study, paper_study = config["study"], load_config([ROOT / "configs/paper.yaml"], root=ROOT)["study"]
        for key in ("arms", "lr_grid", "seeds", "random_draws", "heads", "train_format"):
            assert study[key] == paper_study[key]
        assert (study["train"]["max_steps"] == 20) is quick and paper_study["train"]["max_steps"] == 60
        assert study["format_choice"]["items"] <= study["splits"]["validation"]


def test_peak_keeps_the_full_runs_largest_batches(tmp_path, hub):
    from transformers import AutoTokenizer

    from arithmech.model.tiny import build_tiny_model

    paper = load_config([ROOT / "configs/paper.yaml"], root=ROOT)
    build_tiny_model(tmp_path / "model", seed=0, **{**rehearsal.TOPOLOGY, "n_layers": 1})
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    peak = rehearsal.peak_overlay(tmp_path, paper, tokenizer, root=ROOT)
    path = tmp_path / "peak.yaml"
    path.write_text(yaml.safe_dump(rehearsal.overlay(tmp_path / "model", hub, "peak", peak)))
    config = load_config([ROOT / "configs/paper.yaml", path], root=ROOT)
    train, ev = config["finetune"]["train"], config["evaluation"]
    assert train["max_length"] == paper["finetune"]["train"]["max_length"] == 512  # not QUICK's 256
    assert (ev["gsm8k"]["max_new_tokens"], ev["svamp"]["max_new_tokens"]) == (256, 128)
    assert config["transfer"] == paper["transfer"]  # the transfer keeps its full sets
    assert ev["mmlu"]["n"] == rehearsal.QUICK["evaluation"]["mmlu"]["n"]  # sets whose batch does not grow: quick
    assert config["finetune"]["data"]["n"] is None and ev["gsm8k"]["n"] is None and ev["svamp"]["n"] is None
    # one optimizer step of the longest training examples the finetune job keeps (it drops what does not fit)
    step = train["batch_size"] * train["grad_accumulation"]
    everything = rehearsal.finetune_lengths(ROOT / paper["finetune"]["data"]["file"], paper, tokenizer)
    assert None in everything  # byte-level tokens: some GSM8K examples are longer than 512, and are dropped
    kept = rehearsal.finetune_lengths(Path(config["finetune"]["data"]["file"]), config, tokenizer)
    assert len(kept) == step and None not in kept
    assert sorted(kept) == sorted(n for n in everything if n is not None)[-step:]
    # one batch of the longest test questions, at their full answer lengths
    for name, text in [("gsm8k", lambda r: r["question"]), ("svamp", lambda r: f"{r['Body']} {r['Question']}")]:
        source = sorted(len(text(r)) for r in read_records(ROOT / paper["evaluation"][name]["file"]))
        kept = sorted(len(text(r)) for r in read_records(Path(ev[name]["file"])))
        assert kept == source[-ev["batch_size"]:], name


def test_longest_records_keeps_the_format_and_refuses_too_few(tmp_path):
    (tmp_path / "three.jsonl").write_text("".join(json.dumps({"q": "x" * i}) + "\n" for i in range(3)))
    rehearsal.longest_records(tmp_path / "three.jsonl", tmp_path / "two.jsonl", 2, [0, 1, 2])
    assert [json.loads(line)["q"] for line in (tmp_path / "two.jsonl").read_text().splitlines()] == ["xx", "x"]
    (tmp_path / "three.json").write_text(json.dumps([{"q": "a"}, {"q": "b"}, {"q": "c"}]))
    rehearsal.longest_records(tmp_path / "three.json", tmp_path / "one.json", 1, [5, None, 1])
    assert json.loads((tmp_path / "one.json").read_text()) == [{"q": "a"}]
    with pytest.raises(ValueError, match="2 of its 3 records can be kept, fewer than the 3 a batch holds"):
        rehearsal.longest_records(tmp_path / "three.jsonl", tmp_path / "out.jsonl", 3, [0, None, 2])
    assert not (tmp_path / "out.jsonl").exists()
    with pytest.raises(ValueError, match="needs its overlay"):
        rehearsal.overlay(tmp_path / "model", {}, "peak")


def test_seed_work_copies_a_rehearsals_model_and_results_with_their_times(tmp_path):
    source, work = tmp_path / "quick", tmp_path / "peak"
    (source / "model").mkdir(parents=True)
    (source / "model" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="results is missing: run a rehearsal"):
        rehearsal.seed_work(work, source)
    (source / "results" / "rehearsal").mkdir(parents=True)
    old = source / "results" / "rehearsal" / "effects.parquet"
    old.write_text("x")
    os.utime(old, (1_000_000_000, 1_000_000_000))
    rehearsal.seed_work(work, source)
    copied = work / "results" / "rehearsal" / "effects.parquet"
    assert copied.read_text() == "x" and copied.stat().st_mtime == 1_000_000_000  # Snakemake sees it up to date
    assert (work / "model" / "config.json").is_file()


def plugin_log(jobs: list[tuple[str, str, str]], logdir: Path) -> str:
    """Snakemake's log lines for jobs (Slurm id, rule, wildcards) as the SLURM executor plugin writes them."""
    return "".join(f"Job {i} has been submitted with SLURM jobid {job} (log: "
                   f"{logdir / f'rule_{rule}' / wildcards / f'{job}.log'}).\nSelect jobs to execute...\n"
                   for i, (job, rule, wildcards) in enumerate(jobs))


def test_submissions_name_each_jobs_rule_and_wildcards(tmp_path):
    log = plugin_log([("12", "evaluate", "rehearsal_base_gsm8k"), ("13", "findings", "")], tmp_path / "logs/slurm")
    assert rehearsal.submissions(log) == [(12, "evaluate", "rehearsal_base_gsm8k"), (13, "findings", "")]
    assert rehearsal.submissions("Select jobs to execute...\n") == []
    # a group job (the SLURM profile's groups): its folder is group_<group>_<its rules>
    grouped = (f"Job 3 has been submitted with SLURM jobid 14 (log: {tmp_path}/logs/slurm/"
               "group_identify_build_pairs_cache_activations_patch_all_layers/14.log).\n")
    assert rehearsal.submissions(grouped) == [(14, "identify", "")]


def test_sacct_times_and_sizes():
    assert rehearsal.slurm_seconds("00:01:05") == 65 and rehearsal.slurm_seconds("1-02:00:00") == 93600
    assert rehearsal.slurm_megabytes("2048K") == 2 and rehearsal.slurm_megabytes("1.5G") == 1536
    assert pd.isna(rehearsal.slurm_megabytes(""))


@pytest.mark.slow  # real jobs: about 15 s
def test_job_table_reads_what_slurm_recorded(slurm_cluster, tmp_path):
    holds = "import time; x = b'x' * (300 << 20); time.sleep(4)"
    ok = slurm_cluster.sbatch("--mem=1000M", "-o", str(tmp_path / "%j.out"), "--wrap", f'{sys.executable} -c "{holds}"')
    killed = slurm_cluster.sbatch("--mem=100M", "-o", str(tmp_path / "%j.out"), "--wrap",
                                  f'{sys.executable} -c "{holds}"')
    for job in (ok, killed):
        slurm_cluster.wait(job, timeout=120)
    log = plugin_log([(ok, "knockout", "rehearsal_addition"), (killed, "knockout", "rehearsal_division"),
                      ("999999", "edges", "rehearsal")], tmp_path / "logs/slurm")
    submitted = rehearsal.submissions(log)
    jobs = rehearsal.job_table(submitted, rehearsal.sacct_usage([job for job, _, _ in submitted], slurm_cluster.env))
    assert list(jobs["rule"]) == ["knockout", "knockout", "edges"]
    assert list(jobs["wildcards"]) == ["rehearsal_addition", "rehearsal_division", "rehearsal"]
    assert list(jobs["state"]) == ["COMPLETED", "OUT_OF_MEMORY", ""]  # sacct knows no job 999999
    assert jobs.loc[0, "wall_s"] >= 4 and 300 < jobs.loc[0, "peak_rss_mb"] < 1000  # MaxRSS of its largest step
    assert pd.isna(jobs.loc[2, "wall_s"]) and pd.isna(jobs.loc[2, "peak_rss_mb"])


def test_per_rule_counts_jobs_beside_the_plan():
    jobs = pd.DataFrame({"job": [101, 102, 103], "rule": ["knockout", "knockout", "edges"],
                         "wildcards": ["rehearsal_addition", "rehearsal_division", "rehearsal"],
                         "wall_s": [12.5, float("nan"), 3.0], "peak_rss_mb": [900.0, float("nan"), 400.0],
                         "state": ["COMPLETED", "", "COMPLETED"]}, columns=rehearsal.JOB_COLUMNS)
    by_rule = rehearsal.per_rule(jobs)
    assert by_rule.loc["knockout", "jobs"] == 2 and by_rule.loc["knockout", "max_rss_mb"] == 900.0
    assert list(by_rule.index) == ["knockout", "edges"]
    with_plan = rehearsal.per_rule(jobs, {"prepare_model": 1, "knockout": 2, "edges": 1})
    assert list(with_plan.index) == ["knockout", "edges", "prepare_model"]  # a local rule: no sbatch job
    assert list(with_plan["planned"]) == [2, 1, 1] and list(with_plan["jobs"]) == [2, 1, 0]


def test_summary_is_written_into_the_docs_generated_block(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    pd.DataFrame({"job": [101, 102, 103], "rule": ["knockout", "knockout", "edges"],
                  "wildcards": ["rehearsal_addition", "rehearsal_division", "rehearsal"],
                  "wall_s": [12.5, 30.0, 3.0], "peak_rss_mb": [900.0, 1200.0, 400.0],
                  "state": ["COMPLETED", "FAILED", "COMPLETED"]}).to_csv(work / "jobs.tsv", sep="\t", index=False)
    (work / "plan.json").write_text(json.dumps({"rules": [  # make plan's report: GPU rules have a memory estimate
        {"rule": "prepare_model", "kind": "local", "jobs": 1, "gpu_gb": 0.0},
        {"rule": "knockout", "kind": "gpu", "jobs": 2, "gpu_gb": 1.5},
        {"rule": "edges", "kind": "cpu", "jobs": 1, "gpu_gb": 0.0}]}))
    (work / "rehearsal.yaml").write_text(yaml.safe_dump({"run": {"tasks": ["addition", "division"]}}))
    results = work / "results" / "rehearsal"  # the identify stage's results for addition only
    (results / "pairs").mkdir(parents=True)
    (results / "key_components").mkdir()
    split = pd.DataFrame({"split": ["identification"] * 3 + ["validation"] * 2})
    split.to_parquet(results / "pairs" / "addition.parquet")
    pd.DataFrame({"component": ["head", "head", "mlp"], "n_heads_total": [1024, 1024, 1024]}).to_parquet(
        results / "key_components" / "addition.parquet")
    docs = tmp_path / "rehearsal.md"
    begin, end = rehearsal.MARKERS
    docs.write_text(f"# Title\n\n{begin}\nold, typed numbers\n{end}\n\nAfter.\n")
    with pytest.raises(FileNotFoundError, match="run.json"):  # a rehearsal that never ended has no summary
        rehearsal.summary_markdown(work)
    (work / "run.json").write_text(json.dumps({
        "started": "2026-11-24 14:28 UTC", "wall_s": 3725.0, "size": "quick", "jobs": 1, "machine": "a CPU, 2 cores",
        "snakemake_exit": 1, "command": "python -m arithmech.tools.rehearsal --size quick --jobs 1"}))
    rehearsal.main(["--work", str(work), "--report-only", "--docs", str(docs)])
    text = docs.read_text()
    assert "old, typed numbers" not in text and text.startswith("# Title\n") and text.endswith("After.\n")
    assert ("3 jobs through Slurm (2 COMPLETED, 1 FAILED, as `sacct` reports them) in 1 h 2 min; Snakemake exit 1."
            in text)
    assert "| `knockout` | 2 | 2 | 42 | 30 | 1,200 | 1,500 |" in text
    assert "| `edges` | 1 | 1 | 3 | 3 | 400 |  |" in text  # no GPU: no estimate
    assert "| `prepare_model` | 0 | 1 |  |  |  |  |" in text  # a local rule: planned, not run through sbatch
    assert "| total | 3 | 4 | 46 | 30 | 1,200 |  |" in text
    assert "| addition | 3 / 2 | 2 of 1,024 | 1 |" in text and "| division |" not in text  # no results: no row
    with pytest.raises(FileNotFoundError, match="jobs.tsv"):
        rehearsal.main(["--work", str(tmp_path / "nowhere"), "--report-only"])


def test_a_targeted_rehearsal_has_its_own_block_and_no_whole_run_counts(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    pd.DataFrame({"job": [7], "rule": ["finetune"], "wildcards": ["rehearsal_full"], "wall_s": [400.0],
                  "peak_rss_mb": [3000.0], "state": ["COMPLETED"]}).to_csv(work / "jobs.tsv", sep="\t", index=False)
    (work / "plan.json").write_text(json.dumps({"rules": [{"rule": "finetune", "kind": "gpu", "jobs": 4,
                                                           "gpu_gb": 3.8}]}))
    first = {"started": "2026-11-24 22:40 UTC", "wall_s": 1800.0, "size": "peak", "jobs": 1, "machine": "a CPU",
             "snakemake_exit": 1, "targets": ["results/rehearsal/eval/base/gsm8k.parquet"],
             "command": "python -m arithmech.tools.rehearsal --size peak --jobs 1 --targets gsm8k.parquet"}
    (work / "run.json").write_text(json.dumps({  # a second invocation in the same directory: both are counted
        **first, "started": "2026-11-25 00:00 UTC", "wall_s": 600.0, "snakemake_exit": 0, "earlier": [first],
        "command": "python -m arithmech.tools.rehearsal --size peak --jobs 1 --targets full"}))
    docs = tmp_path / "rehearsal.md"
    docs.write_text("\n".join([*rehearsal.MARKERS, "", rehearsal.PEAK_MARKERS[0], "old", rehearsal.PEAK_MARKERS[1],
                                ""]))
    rehearsal.main(["--work", str(work), "--report-only", "--docs", str(docs)])
    text = docs.read_text()
    whole, peak = text.split(rehearsal.PEAK_MARKERS[0])
    assert whole.strip() == "\n".join(rehearsal.MARKERS)  # the whole run's block is left alone
    assert "old" not in peak and "planned" not in peak  # 1 job of finetune's 4 is not a count to compare
    assert "| `finetune` | 1 | 400 | 400 | 3,000 | 3,800 |" in peak
    assert ("`python -m arithmech.tools.rehearsal --size peak --jobs 1 --targets gsm8k.parquet`, started 2026-11-24 "
            "22:40 UTC, then `python -m arithmech.tools.rehearsal --size peak --jobs 1 --targets full`, started "
            "2026-11-25 00:00 UTC on a CPU: 1 jobs through Slurm (1 COMPLETED, as `sacct` reports them) in 0 h 40 min; "
            "Snakemake exit 1, then 0."
            ) in peak


def test_the_workflow_root_is_the_checkout_or_names_the_option(tmp_path, monkeypatch):
    """Installed, the rehearsal finds no checkout next to its code: it runs the workflow of --root, by default
    the current directory, and says so when that has no Snakefile."""
    assert rehearsal.workflow_root(ROOT) == ROOT.resolve()
    monkeypatch.chdir(ROOT)
    assert rehearsal.workflow_root() == ROOT.resolve()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"no Snakefile in {re.escape(str(tmp_path.resolve()))}: .* --root"):
        rehearsal.workflow_root()
    with pytest.raises(FileNotFoundError, match="--root"):
        rehearsal.main(["--report-only"])


def test_planned_jobs_sum_a_rule_over_models():
    report = {"rules": [{"rule": "evaluate", "jobs": 40}, {"rule": "all", "jobs": 1}, {"rule": "evaluate", "jobs": 8}]}
    assert rehearsal.planned_jobs(report) == {"evaluate": 48, "all": 1}
    grouped = {"rules": [{"rule": "build_pairs", "jobs": 4, "group": "identify", "allocations": 1},
                         {"rule": "cache_activations", "jobs": 4, "group": "identify", "allocations": 0},
                         {"rule": "evaluate", "jobs": 40, "group": "", "allocations": 40}]}
    assert rehearsal.planned_jobs(grouped) == {"identify": 1, "evaluate": 40}

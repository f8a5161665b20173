"""End to end: the real Snakefile on the tiny model, in a temporary directory, through snakemake."""

import hashlib
import html
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from arithmech.io import read_parquet_meta
from helpers import ROOT, TINY_CONFIG, copy_project, snakemake, tiny_config

pytestmark = pytest.mark.slow  # the workflow runs whole: make test-fast leaves these out

TASKS = ["addition", "division"]  # two operators keep the run short; all four share the code


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The smoke configuration run as a user runs it, as `make run` does (two jobs at once, one thread each):
    `snakemake --cores 2 --max-threads 1 --configfile tests/config/tiny.yaml` in a checkout (a copy of this one).
    Its merged config is then saved as the checkout's config.yaml, so the dry runs below (`--configfile
    edited.yaml`) start from exactly what ran."""
    work = copy_project(tmp_path_factory.mktemp("checkout"))
    shutil.copy2(ROOT / "config.yaml", work / "config.yaml")
    (work / "tests/config").mkdir(parents=True)
    shutil.copy2(TINY_CONFIG, work / "tests/config/tiny.yaml")
    proc = snakemake(work, "--cores", "2", "--max-threads", "1", "--configfile", "tests/config/tiny.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # key order kept: Snakemake compares dict params in order, so a sorted dump would look like new params
    (work / "config.yaml").write_text(yaml.safe_dump(tiny_config(), sort_keys=False))
    again = snakemake(work, "--cores", "1", "--dry-run")
    assert "Nothing to be done" in again.stdout + again.stderr  # the same config
    return work


def test_all_outputs_written(run):
    res = run / "results/tiny"
    for task in TASKS:
        for path in [f"pairs/{task}.parquet", f"pairs/{task}_dropped.parquet", f"activations/{task}.safetensors",
                     f"effects/{task}.parquet", f"effects/{task}.png", f"key_components/{task}.parquet"]:
            assert (res / path).stat().st_size > 0, path
        # direct mode (the tiny config's): one table of all layers, from one job (patch_all_layers)
        assert sorted(p.name for p in (res / f"patching/{task}").iterdir()) == ["all_layers.parquet"]
    assert (res / "key_components/shared.png").read_bytes()[:4] == b"\x89PNG"


def test_tables_are_consistent(run):
    res = run / "results/tiny"
    pairs = pd.read_parquet(res / "pairs/addition.parquet")
    # 9 operand pairs x 2 templates: 4 pairs held out (8 prompts, 6 kept), 5 for identification (10, 8 kept)
    assert pairs["split"].value_counts().to_dict() == {"identification": 8, "validation": 6}
    layers = pd.read_parquet(res / "patching/addition/all_layers.parquet")
    assert len(layers) == 8 * 3 * (4 + 1)  # identification samples x layers x (heads + MLP)
    assert layers["layer"].is_monotonic_increasing
    assert set(layers["sample_id"]) == set(pairs.loc[pairs["split"] == "identification", "sample_id"])
    effects = pd.read_parquet(res / "effects/addition.parquet")
    assert len(effects) == 3 * 4 + 3
    l1h2 = effects[(effects["layer"] == 1) & (effects["head"] == 2)]
    rows = layers[(layers["layer"] == 1) & (layers["head"] == 2)]
    assert l1h2["mean_effect"].item() == pytest.approx((rows["logit_p"] - rows["logit_o"]).mean())  # logit_diff
    assert l1h2["ci_low"].item() <= l1h2["mean_effect"].item() <= l1h2["ci_high"].item()
    assert effects["stability"].between(0, 1).all()
    assert read_parquet_meta(res / "effects/addition.parquet")["excluded_nonpositive_logit_o"] == 0
    key = pd.read_parquet(res / "key_components/addition.parquet")
    heads = key[key["component"] == "head"]
    assert len(heads) <= 3 and (heads["mean_effect"] < 0).all()
    assert list(heads["rank"]) == list(range(1, len(heads) + 1))
    assert heads["share_key_heads"].iloc[0] == pytest.approx(len(heads) / 12)
    shared = pd.read_parquet(res / "key_components/shared.parquet")
    assert set(shared["node"]) == set().union(
        *(set(pd.read_parquet(res / f"key_components/{t}.parquet")["node"]) for t in TASKS)
    )
    dropped = pd.read_parquet(res / "pairs/addition_dropped.parquet")
    assert set(dropped["drop_reason"]) == {"over_max_samples"}
    assert len(dropped) == 2 * 9 - 14  # 2 templates x 9 operand pairs, 14 kept
    assert "rel_effect" in layers and "prob_p" not in layers  # probabilities only for metric prob_change


def test_knockout_table(run):
    """Top-k heads, random heads over seeds and key MLPs; k = 0 is the unablated model."""
    res = run / "results/tiny"
    whole = pd.read_parquet(res / "knockout/addition.parquet")
    assert list(dict.fromkeys(whole["positions"])) == ["end", "all"] and (whole["split"] == "validation").all()
    table = whole[whole["positions"] == "end"]
    pairs = pd.read_parquet(res / "pairs/addition.parquet")
    pairs = pairs[pairs["split"] == "validation"]
    top = table[table["curve"] == "top_heads"]
    assert list(top["k"]) == list(range(0, 4))  # max_heads 3 in the tiny config
    assert top["accuracy"].iloc[0] == pytest.approx(pairs["correct"].mean())  # nothing ablated = baseline
    effects = pd.read_parquet(res / "effects/addition.parquet")
    strongest = effects[effects["component"] == "head"].nsmallest(1, "mean_effect")
    assert top["nodes"].iloc[1] == strongest["node"].item()
    random = table[table["curve"] == "random_heads"]
    assert len(random) == 2 * 3 and set(random["seed"]) == {0, 1}
    matched = table[table["curve"] == "random_layer_matched"]
    assert len(matched) == 2 * 3
    for k, nodes in zip(matched["k"], matched["nodes"]):  # the layers of the top k heads
        assert (sorted(n.split("H")[0] for n in nodes.split())
                == sorted(n.split("H")[0] for n in top["nodes"].iloc[k].split()))
    every = whole[whole["positions"] == "all"]
    assert (every["n"] == 4).all()  # ablation.all_positions_samples
    assert set(every.loc[every["curve"].str.startswith("random"), "k"]) == {3}  # controls at k = max_heads only
    assert not set(" ".join(random["nodes"]).split()) & set(top["nodes"].iloc[-1].split())  # disjoint
    key = pd.read_parquet(res / "key_components/addition.parquet")
    mlp = table[table["curve"] == "key_mlps"]
    assert mlp["nodes"].item().split() == [f"L{l}MLP" for l in key.loc[key["component"] == "mlp", "layer"]]
    for col in ("accuracy", "full_accuracy"):  # shares of the n pairs, each pair scored once
        np.testing.assert_allclose(table[col] * len(pairs), (table[col] * len(pairs)).round(), atol=1e-9)
    assert (table["n"] == len(pairs)).all()
    # full greedy answers can only be right where the first token is
    assert (table["full_accuracy"] <= table["accuracy"] + 1e-9).all()
    assert (res / "knockout/addition.png").read_bytes()[:4] == b"\x89PNG"


def test_transfer_table(run):
    res = run / "results/tiny"
    table = pd.read_parquet(res / "knockout/transfer.parquet")
    targets = [*TASKS, *(f"{t} {f}" for f in ("multi-digit", "decimal") for t in TASKS), "SVAMP", "qa_wikidata"]
    assert list(dict.fromkeys(table["target"])) == targets
    assert len(table) == len(targets) * (1 + len(TASKS) * 2)  # none + per source: key heads, 1 random set
    key = pd.read_parquet(res / "key_components/addition.parquet")
    rows = table[(table["source"] == "addition") & (table["heads"] == "key")]
    assert set(rows["nodes"]) == {" ".join(key.loc[key["component"] == "head", "node"])}
    sizes = table.groupby("target", sort=False)["n"].first()
    assert sizes[TASKS].tolist() == [6, 6] and (sizes.drop(TASKS) == 3).all()  # transfer.max_samples, the n's
    assert (res / "knockout/transfer.png").read_bytes()[:4] == b"\x89PNG"


def test_finetune_and_evaluation_outputs(run):
    from safetensors import safe_open

    from arithmech.sft.deltas import read_trained_meta

    res = run / "results/tiny"
    precise = read_trained_meta(res / "finetune/precise/trained.safetensors")
    assert len(precise["heads"]) == 2 and len(precise["mlp_layers"]) == 1
    with safe_open(str(res / "finetune/precise/trained.safetensors"), "pt") as f:
        assert sum(".head." in k for k in f.keys()) == 2 * 2  # q rows and o columns of each head
    assert (res / "finetune/full/model/config.json").is_file()
    stats = json.loads((res / "finetune/lora/stats.json").read_text())
    assert stats["steps"] == 2 and stats["n_trainable"] > 0
    assert not (res / "finetune/.checkpoints").exists() or not any((res / "finetune/.checkpoints").iterdir())
    summary = pd.read_parquet(res / "eval/summary.parquet")
    assert list(summary["method"]) == ["base", "precise", "full", "random_heads", "lora"]
    full = summary.set_index("method").loc["full", "trainable_params"]
    assert summary.set_index("method").loc["precise", "trainable_params"] < full
    assert ((summary["gsm8k_low"] <= summary["gsm8k"]) & (summary["gsm8k"] <= summary["gsm8k_high"])).all()
    rows = pd.read_parquet(res / "eval/precise/gsm8k.parquet")
    assert list(rows.columns[:6]) == ["id", "prompt", "output", "extracted", "gold", "correct"] and len(rows) == 3
    assert "| precise |" in (res / "eval/summary.md").read_text()


def test_nothing_to_do_on_rerun(run):
    proc = snakemake(run, "--cores", "1", "--dry-run")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_killed_job_reruns_identically(run):
    """A patch job killed mid-write (its result and everything after it missing, a stray temp file left): the run
    plans it and what depends on it, nothing upstream, and the job re-makes its outputs byte for byte (seeded,
    deterministic CPU). Only the job itself runs here (its file as the target): what depends on it is the rest of
    the workflow, run by the `run` fixture already; those files are put back from a copy, with the outputs' times,
    so the run is as before."""
    res = run / "results/tiny"
    target = res / "patching/division/all_layers.parquet"
    sibling = res / "patching/addition/all_layers.parquet"  # written by the same job (all tasks and layers)
    before = {path: (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
              for path in (target, sibling)}
    stray = target.with_name(".all_layers.parquet.killed.tmp")
    target.rename(stray)
    downstream = [res / name for name in (
        "effects/division.parquet", "effects/division.png", "key_components/division.parquet",
        "key_components/division.html", "key_components/shared.parquet", "key_components/shared.html",
        "key_components/shared.png", "knockout/division.parquet", "knockout/division.png")]
    kept = run.parent / f"{run.name}-downstream"
    for path in downstream:
        (kept / path.relative_to(run)).parent.mkdir(parents=True, exist_ok=True)
        path.rename(kept / path.relative_to(run))
    planned = planned_rules(snakemake(run, "--cores", "1", "--dry-run"))
    assert planned["patch_all_layers"] == 1, planned
    assert {"aggregate_effects", "summarize_key_components", "knockout"} <= planned.keys(), planned
    assert not {"prepare_model", "build_pairs", "cache_activations"} & planned.keys(), planned
    proc = snakemake(run, "--cores", "2", "--max-threads", "1", str(target.relative_to(run)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "rule patch_all_layers" in log and "rule build_pairs" not in log and "rule cache_activations" not in log
    for path, (digest, mtime_ns) in before.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, path.name
        os.utime(path, ns=(mtime_ns, mtime_ns))
    for path in downstream:
        (kept / path.relative_to(run)).rename(path)  # a rename keeps the file's times
    stray.unlink()
    again = snakemake(run, "--cores", "1", "--dry-run")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]


def test_bad_config_fails_before_any_job(tmp_path):
    config = tiny_config(tmp_path / "nowhere")
    config["compute"]["batch_size"] = 0
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "--cores", "1")
    assert proc.returncode != 0
    assert "config key 'compute.batch_size'" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_hub_data_sets_are_fetched_once_and_read_by_evaluate_dry(tmp_path):
    """A Hub-sourced set is one fetch_dataset job, shared by every method's evaluation, which reads the local
    Parquet file; a vendored set is read where it is. A dry run only: nothing is downloaded."""
    config = tiny_config(tmp_path / "nowhere")
    config["evaluation"]["datasets"] = ["gsm8k", "mmlu", "wikitext"]
    config["evaluation"]["gsm8k"] |= {"file": None, "hub": {"path": "openai/gsm8k", "name": "main", "split": "test"}}
    config["evaluation"]["mmlu"] = {"hub": {"path": "cais/mmlu", "name": "all", "split": "test"}, "n": 3}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "--cores", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = planned_rules(proc)
    assert jobs["fetch_dataset"] == 2 and jobs["evaluate"] == 3 * (1 + len(config["finetune"]["methods"]))
    assert sorted(j["dataset"] for j in planned_jobs(proc, "fetch_dataset")) == ["gsm8k", "mmlu"]
    inputs = [line.split("input: ", 1)[1].split(", ") for line in proc.stdout.splitlines() if "input: " in line]
    base = [paths for paths in inputs if paths[-1] == "results/tiny/model" and not any("finetune/" in x for x in paths)]
    assert [p for p in base if p[0] == "results/data/gsm8k.parquet"][0][1].endswith("resources/data/gsm8k/train.jsonl")
    assert ([p for p in base if p[0] == "results/data/mmlu.parquet"]
            == [["results/data/mmlu.parquet", "results/tiny/model"]])
    assert any(p[0].endswith("resources/data/wikitext-2/test.txt") for p in base)


def test_hub_set_that_cannot_be_fetched_stops_the_run_before_any_job(tmp_path):
    """A Hub set whose data set is not there fails when the run starts, with one error naming the set, and
    no job (not even the model's preparation) has run. Offline: a local directory stands in for the Hub."""
    config = tiny_config(tmp_path / "nowhere")
    config["evaluation"]["datasets"] = ["gsm8k", "mmlu"]
    config["evaluation"]["mmlu"] = {"hub": {"path": str(tmp_path / "no-such-dataset"), "name": "all", "split": "test"},
                                    "n": 3}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "--cores", "1", env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "evaluation data set 'mmlu' (config key 'evaluation.mmlu.hub': " in log and "cannot be fetched" in log
    assert not (tmp_path / "results").exists()


def test_unknown_evaluation_set_fails_before_any_job_dry(tmp_path):
    config = tiny_config(tmp_path / "nowhere")
    config["evaluation"]["datasets"].append("gsm9k")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "--cores", "1", "--dry-run")
    assert proc.returncode != 0
    assert "config key 'evaluation.datasets.4': unknown data set 'gsm9k'" in proc.stdout + proc.stderr


def test_missing_model_fails_with_one_clear_message(tmp_path):
    config = tiny_config(tmp_path / "no-such-model")
    config["run"]["tasks"] = ["addition"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "--cores", "1")
    assert proc.returncode != 0
    log = (tmp_path / "results/tiny/logs/prepare_model.log").read_text()
    assert "is not a Hugging Face model directory (no config.json)" in log
    assert not (tmp_path / "results/tiny/model").exists()


def planned_rules(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Rule name -> job count from a dry run's 'Job stats' table."""
    counts, in_stats = {}, False
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("Job stats"):
            in_stats = True
        elif in_stats and line.strip().startswith("total"):
            break
        elif in_stats and len(line.split()) == 2 and line.split()[1].isdigit():
            counts[line.split()[0]] = int(line.split()[1])
    return counts


# What a change upstream of the patching effects re-runs of stage 4: the two head methods rank heads by
# effect (full fine-tuning and LoRA do not), their evaluations (4 data sets each), and the summary.
# The study likewise: the head arms' grid runs, second seed and draw, their lr choices and evaluations.
HEAD_SFT = {"finetune": 2, "evaluate": 8, "summarize_eval": 1, "study_train": 8, "study_select": 5,
            "study_evaluate": 7, "study_summary": 1}
# What a change of the identify stage's operand pairs re-runs of the study: all of it, the measurement of the
# candidate formats (study_format leaves the identify stage's pairs out) included.
STUDY_ALL = {"study_format": 1, "study_items": 1, "study_train": 10, "study_select": 7, "study_evaluate": 10,
             "study_summary": 1}
# What new patching effects re-run: aggregation, and everything that reads the effects or key components.
FROM_EFFECTS = {
    "aggregate_effects": 2, "plot_effects": 2, "summarize_key_components": 1, "knockout": 2, "plot_knockout": 2,
    "analyze": 2, "plot_analysis": 2, "transfer": 1, "plot_transfer": 1, "edges": 1, "edge_curve": 1,
    "plot_edge_curve": 1,
    "discover": 2, "discover_union": 1, "plot_discover": 2, **HEAD_SFT, "claims": 1, "findings": 1, "all": 1,
}


def planned_jobs(proc: subprocess.CompletedProcess, rule: str) -> list[dict[str, str]]:
    """The wildcards of every job of `rule` in a dry run's log."""
    jobs, current = [], None
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith(("rule ", "localrule ", "checkpoint ")):
            current = line.split()[1].rstrip(":")
        elif current == rule and line.strip().startswith("wildcards:"):
            jobs.append(dict(part.split("=", 1)
                             for part in line.strip().removeprefix("wildcards:").strip().split(", ")))
    return jobs


def with_config(run: Path, edit) -> Path:
    """A copy of the run's config with `edit` applied, written next to it."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    edit(config)
    path = run / "edited.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def dry_run(run: Path, edit) -> subprocess.CompletedProcess:
    proc = snakemake(run, "--cores", "1", "--dry-run", "--configfile", str(with_config(run, edit)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_patching_change_reruns_patching_not_pairs_or_activations(run):
    proc = dry_run(run, lambda c: c["patching"].update(mode="total"))
    assert planned_rules(proc) == {"patch_layer": 3, **FROM_EFFECTS}


def test_metric_change_reruns_aggregation_not_patching(run):
    """logit_diff -> relative_logit changes only how the stored logits are averaged."""
    assert planned_rules(dry_run(run, lambda c: c["patching"].update(metric="relative_logit"))) == FROM_EFFECTS
    # prob_change needs the answer probabilities, which only patching can store
    assert planned_rules(dry_run(run, lambda c: c["patching"].update(metric="prob_change")))["patch_all_layers"] == 1


def test_key_rule_change_reruns_only_aggregation(run):
    assert planned_rules(dry_run(run, lambda c: c["key_components"]["heads"].update(k=2))) == FROM_EFFECTS


def test_prompt_change_reruns_from_pairs(run):
    proc = dry_run(run, lambda c: c["prompts"].update(n_shots=2))
    assert planned_rules(proc) == {"build_pairs": 2, "cache_activations": 2, "patch_all_layers": 1, **FROM_EFFECTS,
                                   "discover_shared": 1, **STUDY_ALL}


def test_ablation_change_reruns_only_knockout(run):
    proc = dry_run(run, lambda c: c["ablation"].update(random_seeds=3))
    assert planned_rules(proc) == {"knockout": 2, "plot_knockout": 2, "claims": 1, "findings": 1, "all": 1}


def test_circuit_changes_rerun_only_their_rule(run):
    """The edges and the edge curve are separate rules: a change of a setting re-runs the rules that read it, their
    figures and what reads them."""
    assert planned_rules(dry_run(run, lambda c: c["circuit"]["edges"].update(max_samples=5))) == {
        "edges": 1, "edge_curve": 1, "plot_edge_curve": 1, "claims": 1, "findings": 1, "all": 1}
    assert planned_rules(dry_run(run, lambda c: c["circuit"]["edges"].update(senders=1))) == {
        "edge_curve": 1, "plot_edge_curve": 1, "all": 1}
    # the edge curve is its own rule: turning it off re-runs nothing of the edges
    assert not {"edges", "edge_curve", "plot_edge_curve"} & set(planned_rules(dry_run(
        run, lambda c: c["circuit"]["edges"].update(curve=False))))


def test_finetune_change_reruns_only_that_method_and_its_evaluation(run):
    proc = dry_run(run, lambda c: c["finetune"]["lr"].update(precise=3e-4))
    assert planned_rules(proc) == {"finetune": 1, "evaluate": 4, "summarize_eval": 1, "all": 1}
    proc = dry_run(run, lambda c: c["finetune"]["train"].update(max_steps=3))
    assert planned_rules(proc) == {"finetune": 4, "evaluate": 16, "summarize_eval": 1, "all": 1}


def test_task_change_retrains_only_the_methods_that_rank_heads(run):
    """Full fine-tuning and LoRA never read the identify stage: dropping an operator leaves them alone."""
    proc = dry_run(run, lambda c: c["run"].update(tasks=["addition"]))
    assert sorted(j["method"] for j in planned_jobs(proc, "finetune")) == ["precise", "random_heads"]


def test_evaluation_change_reruns_only_that_data_set(run):
    proc = dry_run(run, lambda c: c["evaluation"]["gsm8k"].update(n=4))
    assert planned_rules(proc) == {"evaluate": 5, "summarize_eval": 1, "all": 1}
    assert {j["dataset"] for j in planned_jobs(proc, "evaluate")} == {"gsm8k"}  # WikiText is not recomputed
    proc = dry_run(run, lambda c: c["evaluation"].update(confidence=0.9))
    assert planned_rules(proc) == {"summarize_eval": 1, "all": 1}


def test_study_changes_rerun_only_what_they_touch(run):
    """One arm's lr grid re-runs that arm's grid run, its choice, evaluation and the summary; the
    off-target sets re-run every evaluation; the confidence level the summary and the format table (its
    intervals); the items measured per format the measurement and the summary; the candidates, with a named
    format, nothing; items all the study."""
    cases = [
        (lambda c: c["study"]["lr_grid"].update(full=[2e-4]),
         {"study_train": 1, "study_select": 1, "study_evaluate": 1, "study_summary": 1}),
        (lambda c: c["study"]["off_target"].update(svamp_n=4), {"study_evaluate": 10, "study_summary": 1}),
        (lambda c: c["study"].update(confidence=0.9), {"study_format": 1, "study_summary": 1}),
        (lambda c: c["study"]["format_choice"].update(items=3), {"study_format": 1, "study_summary": 1}),
        (lambda c: c["study"]["lora"].update(r=4),
         {"study_train": 1, "study_select": 1, "study_evaluate": 1, "study_summary": 1}),
        (lambda c: c["study"]["splits"].update(test=9), STUDY_ALL),
    ]
    for edit, expected in cases:
        # the scorecard and the findings page read the study
        assert planned_rules(dry_run(run, edit)) == {**expected, "claims": 1, "findings": 1, "all": 1}
    # a named format is measured alone: the candidates are only read with `auto`
    edit = lambda c: c["study"]["format_choice"]["candidates"]["div2_words"].update(operator="over")  # noqa: E731
    assert planned_rules(dry_run(run, edit)) == {}


def test_study_outputs(run):
    """Items split by operand pair; every scored model one row; lr chosen by validation; comparisons."""
    res = run / "results/tiny/finetune"
    items = pd.read_parquet(res / "study/items.parquet")
    trained = items[items["format"] == "add2"]
    assert trained.groupby("split").size().to_dict() == {"test": 10, "train": 12, "validation": 6}
    assert trained["pair"].is_unique
    identify = pd.read_parquet(run / "results/tiny/pairs/addition.parquet")
    assert not {f"addition:{a}:{b}" for a, b in zip(identify["a"], identify["b"])} & set(items["pair"])
    study = pd.read_parquet(res / "study.parquet")
    assert list(zip(study["arm"], study["run"])) == [
        ("base", "base"), ("precise", "chosen"), ("precise", "seed1"), ("precise_mlp", "chosen"), ("circuit", "chosen"),
        ("low_effect", "chosen"), ("random_heads", "chosen"), ("random_heads", "draw1"), ("full", "chosen"),
        ("lora", "chosen")]
    assert (study["test_n"] == 10).all() and (study.loc[study["arm"] == "base", "kl_to_base"] == 0).all()
    assert ((study["accuracy_low"] <= study["accuracy"]) & (study["accuracy"] <= study["accuracy_high"])).all()
    precise = study.set_index(["arm", "run"]).loc[("precise", "chosen")]
    choice = json.loads((res / "study/select/precise.json").read_text())
    best = max(choice["grid"], key=lambda g: (g["val_accuracy"], -g["val_nll"]))
    assert choice["run"] == best["run"] and precise["lr"] == best["lr"] and precise["trained_run"] == best["run"]
    assert study.set_index(["arm", "run"]).loc[("precise", "seed1"), "seed"] == precise["seed"] + 1
    stats = json.loads((res / f"study/runs/precise/{choice['run']}/stats.json").read_text())
    assert [p["step"] for p in stats["evaluations"]] == [1, 2] and stats["train"]["optimizer"] == "adamw"
    assert precise["trainable_params"] < study.set_index(["arm", "run"]).loc[("full", "chosen"), "trainable_params"]
    comp = pd.read_parquet(res / "comparisons.parquet")
    assert ({("precise", "random_heads"), ("precise", "full"), ("precise", "base")}
            <= set(zip(comp["arm_a"], comp["arm_b"])))
    assert comp["p_value"].between(0, 1).all() and (comp["ci_low"] <= comp["ci_high"]).all()
    assert "| precise | chosen |" in (res / "study.md").read_text()
    assert "## Training precision" in (res / "study.md").read_text()
    # every head arm's heads against precise's: the negative control shares none, precise_mlp all
    by_arm = study.set_index(["arm", "run"])
    assert by_arm.loc[("low_effect", "chosen"), "overlap_precise"] == 0
    assert by_arm.loc[("precise_mlp", "chosen"), "jaccard_precise"] == 1.0
    assert study.loc[study["arm"].isin(["base", "full", "lora"]), "n_heads"].isna().all()
    assert ("precise", "low_effect") in set(zip(comp["arm_a"], comp["arm_b"]))  # the positive control
    assert "## Head sets" in (res / "study.md").read_text() and "## Operand range" in (res / "study.md").read_text()
    trained = study[study["arm"] != "base"]
    assert set(trained["model_dtype"]) == {"float32"} and set(trained["master_dtype"]) == {"float32"}  # CPU
    for name in ("study.png", "study_curves.png"):
        assert (res / name).read_bytes()[:4] == b"\x89PNG"
    assert not any((res / "study/.checkpoints").glob("*/step-*"))
    page = (run / "results/tiny/findings.html").read_text()  # the report's first page repeats these tables
    assert all(f"<td>{task}</td>" in page for task in TASKS) and "precise - random_heads" in page
    # the named format's measurement: its first 4 validation items, never a test item
    formats = pd.read_parquet(res / "study/formats.parquet")
    assert list(formats["format"]) == ["add2"] and list(formats["n"]) == [4] and formats["chosen"].all()
    assert read_parquet_meta(res / "study/formats.parquet")["choice"]["chosen"] == "add2"
    assert "## The trained format" in (res / "study.md").read_text()
    assert read_parquet_meta(res / "study.parquet")["train_format"] == "add2"


def test_auto_format_dry_run_plans_every_study_job(tmp_path):
    """With `study.train_format: auto` the format is known only once study_format (a checkpoint) has run: a
    dry run plans it and every job of the study, as if it finds a format."""
    config = tiny_config(tmp_path / "nowhere")
    config["study"]["train_format"] = "auto"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "--cores", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = planned_rules(proc)
    assert {rule: jobs.get(rule) for rule in STUDY_ALL} == STUDY_ALL
    assert jobs["claims"] == 1 and jobs["findings"] == 1


def executed_rules(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Rule name -> jobs that started in a real run (the job banners of its log)."""
    counts: dict[str, int] = {}
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith(("rule ", "localrule ", "checkpoint ", "localcheckpoint ")) and line.endswith(":"):
            rule = line.split()[1].rstrip(":")
            counts[rule] = counts.get(rule, 0) + 1
    return counts


def test_auto_format_reruns_what_the_choice_changes_and_says_when_none_fits(run, tmp_path):
    """`auto` that chooses the format the run trained re-runs the measurement and the summary, no study job.
    With no candidate inside study.base_band nothing of the study runs but its summary, which says so and
    names the nearest format; the scorecard's study rows are `not measured` with that reason, and the rest of
    the workflow finishes."""
    from arithmech.sft import study_config
    checkout = moved_checkout(run, tmp_path)
    res = checkout / "results/tiny"
    items_before = (res / "finetune/study/items.parquet").stat().st_mtime_ns
    # the random model gets nothing right: with the band [0, 1] every candidate is as far from the middle,
    # and the first listed is chosen: add2 (tiny.yaml's keys come first in the merged config), the format
    # the run trained
    auto = with_config(checkout, lambda c: c["study"].update(train_format="auto", base_band=[0.0, 1.0]))
    proc = snakemake(checkout, "--cores", "2", "--max-threads", "1", "--configfile", str(auto))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert executed_rules(proc) == {"study_format": 1, "study_summary": 1, "claims": 1, "findings": 1, "all": 1}
    assert study_config.read_choice(res / "finetune/study/formats.parquet")["chosen"] == "add2"
    assert (res / "finetune/study/items.parquet").stat().st_mtime_ns == items_before
    assert read_parquet_meta(res / "finetune/study.parquet")["ran"] is True

    none = with_config(checkout, lambda c: c["study"].update(train_format="auto", base_band=[0.5, 1.0]))
    proc = snakemake(checkout, "--cores", "2", "--max-threads", "1", "--configfile", str(none))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert executed_rules(proc) == {"study_format": 1, "study_summary": 1, "claims": 1, "findings": 1, "all": 1}
    log = (res / "logs/study/format.log").read_text()
    assert "No format chosen: no candidate format's base exact match lies inside study.base_band [0.5, 1]" in log
    assert "nearest: add2 0.0% (below)" in log
    formats = pd.read_parquet(res / "finetune/study/formats.parquet")
    assert not formats["chosen"].any() and list(formats.loc[formats["nearest"], "format"]) == ["add2"]
    reason = read_parquet_meta(res / "finetune/study.parquet")["reason"]
    assert reason.startswith("The precise-SFT study could not run: no candidate format") and "add2" in reason
    assert pd.read_parquet(res / "finetune/study.parquet").empty
    assert reason in (res / "finetune/study.md").read_text()
    assert reason in html.unescape((res / "findings.html").read_text())
    claims = pd.read_parquet(res / "claims.parquet")
    sft = claims[claims["claim"].str.startswith("sft_")]
    assert len(sft) == 5 and (sft["verdict"] == "not measured").all() and (sft["note"] == reason).all()
    again = snakemake(checkout, "--cores", "1", "--dry-run", "--configfile", str(none))
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]


def test_transfer_change_reruns_only_transfer(run):
    assert planned_rules(dry_run(run, lambda c: c["transfer"]["formats"].update(n=4))) == {
        "transfer": 1, "plot_transfer": 1, "claims": 1, "findings": 1, "all": 1}


GPU_RULES = ("build_pairs", "cache_activations", "patch_all_layers", "knockout", "analyze", "transfer", "edges",
             "edge_curve", "finetune", "evaluate", "study_format", "study_train", "study_evaluate")
CPU_RULES = ("aggregate_effects", "plot_effects", "plot_knockout", "plot_transfer", "plot_analysis",
             "summarize_key_components", "summarize_eval", "study_items", "study_select", "study_summary",
             "plot_edge_curve", "claims", "findings")


def slurm_dry_run(run, slurm):
    """The workflow profile's dry run on the SLURM executor, without a cluster, with `slurm` as the configuration's
    `slurm` block: {rule: resources lines}. (Whether a job runs locally does not show in a dry run:
    tests/workflow/test_slurm.py checks it against a real Slurm.)"""
    def resources(c):
        c["models"]["tiny"]["resources"].update(gpus=2, gpu_model="a100", mem_mb=12000,
                                                finetune={"gpus": 4, "mem_mb": 30000}, evaluate={"runtime": 45})
        c["slurm"] = slurm
    # ungrouped (the profile's groups replaced by one of a rule that does not exist): each rule's own request
    # shows; tests/workflow/test_slurm_groups.py runs the groups
    proc = snakemake(run, "--workflow-profile", str(run / "workflow/profiles/slurm"), "--dry-run", "--forceall",
                     "--configfile", str(with_config(run, resources)), "--groups", "no_such_rule=ungrouped")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs, rule = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith(("rule ", "checkpoint ")):
            rule = line.split()[1].rstrip(":")
        elif line.strip().startswith("resources:") and rule:
            jobs.setdefault(rule, set()).add(line.strip())
    return jobs


def test_slurm_dry_run_asks_each_rule_for_its_own_resources(run):
    """The workflow profile resolved without a cluster: GPUs, memory and runtime from the model's resources and
    its per-rule blocks for the rules that run the model; CPU-only jobs no GPU and no partition (they run on the
    submitting host); account and partition passed only when set."""
    jobs = slurm_dry_run(run, {"account": "proj42", "partition": "gpu-short"})
    for rule in GPU_RULES:
        (resources,) = jobs[rule]
        assert "gpu_model=a100" in resources, rule
        assert "slurm_account=proj42" in resources and "slurm_partition=gpu-short" in resources
        gpus, mem, minutes = {"finetune": (4, 30000, 30), "study_train": (4, 30000, 30), "evaluate": (2, 12000, 45),
                              "study_evaluate": (2, 12000, 45),
                              "study_format": (2, 12000, 45)}.get(rule, (2, 12000, 30))
        assert f"gpu={gpus}" in resources and f"mem_mb={mem}" in resources and f"runtime={minutes}" in resources, rule
    for rule in CPU_RULES:
        (resources,) = jobs[rule]
        assert "gpu=" not in resources and "slurm_partition" not in resources, rule
    unset = slurm_dry_run(run, {"account": None, "partition": None})
    assert not any("slurm_account" in r or "slurm_partition" in r for lines in unset.values() for r in lines)


def test_slurm_dry_run_sends_cpu_jobs_to_the_cpu_partition_when_named(run):
    jobs = slurm_dry_run(run, {"partition": "gpu-short", "cpu_partition": "cpu-short"})
    for rule in CPU_RULES:
        (resources,) = jobs[rule]
        assert "gpu=" not in resources and "slurm_partition=cpu-short" in resources, rule
        assert "mem_mb=4000" in resources
    assert all("slurm_partition=gpu-short" in next(iter(jobs[rule])) for rule in GPU_RULES)


def test_report_contains_every_figure_and_table(run, tmp_path):
    report = tmp_path / "report.html"
    proc = snakemake(run, "--cores", "1", "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = report.read_text()
    for task in TASKS:
        assert f"effects/{task}.png" in html and f"key_components/{task}.html" in html
        assert f"knockout/{task}.png" in html
        assert all(f"analysis/{task}_{name}.png" in html for name in ("roles", "example", "probes"))
    assert "key_components/shared.png" in html and "key_components/shared.html" in html
    assert "knockout/transfer.png" in html and "eval/summary.png" in html and "eval/summary.html" in html
    assert "finetune/study.png" in html and "finetune/study_curves.png" in html and "finetune/study.html" in html
    assert "Zhang et al." in html and "Precise SFT" in html  # the workflow description, all four stages
    assert "findings.html" in html and "0. Findings" in html


def test_edges_outputs(run):
    """The edges rule on every operator: per scored validation pair and ablation, the answer's teacher-forced
    log-probability with the key heads' edges kept and cut; the retired circuit rule writes nothing."""
    from arithmech.stages.circuit import PATH_CUT_COLUMNS

    res = run / "results/tiny"
    for task in TASKS:
        cuts = pd.read_parquet(res / f"circuit/{task}_edge_paths.parquet")
        assert list(cuts.columns) == PATH_CUT_COLUMNS and set(cuts["kind"]) == {"resample", "mean"}
        by_kind = {k: part.reset_index(drop=True) for k, part in cuts.groupby("kind")}
        pd.testing.assert_series_equal(by_kind["mean"]["model"], by_kind["resample"]["model"])
        assert not (res / f"circuit/{task}.parquet").exists()


def test_analysis_outputs(run):
    """The analyze rule: role attention of the key heads (each sums to 1), MLP probes, three figures."""
    res = run / "results/tiny"
    for task in TASKS:
        roles = pd.read_parquet(res / f"analysis/{task}_roles.parquet")
        key = pd.read_parquet(res / f"key_components/{task}.parquet")
        key_heads = list(key.loc[key["component"] == "head", "node"])
        nodes = list(dict.fromkeys(roles["node"]))
        # the tiny config's rule (top 3 among negative effects) selects heads on this model; the fallback
        # for a rule that selects none is tested in test_analyze_stage
        assert key_heads and nodes == key_heads and set(roles["selection"]) == {"key"}  # in rank order
        np.testing.assert_allclose(roles.groupby("node")["attention"].sum(), 1.0, atol=1e-5)
        assert (roles["n_texts"] == 6).all()  # all 6 validation pairs (analysis.max_samples is 64)
        probes = pd.read_parquet(res / f"analysis/{task}_probes.parquet")
        paper = probes[(probes["variant"] == "paper") & (probes["subset"] == "all")]
        assert len(paper) == 3 * 3 * 4  # layers x vectors x targets
        assert set(probes["variant"]) == {"paper", "normed"}
        for name in ("roles", "example", "probes"):
            assert (res / f"analysis/{task}_{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_per_item_tables_add_up_to_the_tables(run):
    """The knockout's and the transfer's per-item tables (what the scorecard's paired intervals resample) give
    every set's accuracy exactly; the attention of every head repeats the analysed heads' rows."""
    res = run / "results/tiny"
    for task in TASKS:
        table = pd.read_parquet(res / f"knockout/{task}.parquet")
        items = pd.read_parquet(res / f"knockout/{task}_items.parquet")
        per_set = items.groupby(["positions", "curve", "seed", "k"], sort=False)[["first_correct", "full_correct"]]
        merged = table.merge(per_set.mean().reset_index(), on=["positions", "curve", "seed", "k"], validate="1:1")
        np.testing.assert_allclose(merged["accuracy"], merged["first_correct"], atol=1e-6)
        np.testing.assert_allclose(merged["full_accuracy"], merged["full_correct"], atol=1e-12)
        pairs = pd.read_parquet(res / f"pairs/{task}.parquet").set_index("sample_id")
        assert (items["cluster"] == [f"{a},{b}" for a, b in pairs.loc[items["sample_id"], ["a", "b"]].to_numpy()]).all()
        roles = pd.read_parquet(res / f"analysis/{task}_roles.parquet")
        every = pd.read_parquet(res / f"analysis/{task}_roles_all.parquet")
        assert len(every) == 3 * 4 * len(set(roles["role"]))  # every head of the tiny model, every role
        analysed = every[every["analysed"]].merge(roles, on=["layer", "head", "role"], suffixes=("", "_key"))
        assert len(analysed) == len(roles)
        np.testing.assert_allclose(analysed["attention"], analysed["attention_key"], atol=1e-6)
    transfer = pd.read_parquet(res / "knockout/transfer.parquet")
    items = pd.read_parquet(res / "knockout/transfer_items.parquet")
    keys = ["source", "heads", "seed", "target"]
    merged = transfer.merge(items.groupby(keys)["correct"].mean().reset_index(), on=keys, validate="1:1")
    np.testing.assert_allclose(merged["accuracy"], merged["correct"], atol=1e-12)


def test_discover_outputs_and_the_circuit_arm(run):
    """Discovery on every operator, their union and their shared circuit: one chosen circuit per operator, nested
    across targets and scored on validation pairs; the shared circuit pruned on every operator's pairs, its row in
    the summary and the scorecard; the study's circuit arm trains that union's strongest heads; the scorecard's two
    new rows are there; a discover setting re-runs discovery, the circuit arm and what reads them, nothing else."""
    import json

    from arithmech.interp.nodes import circuit_first, parse_nodes, ranked_nodes
    from arithmech.report.claims.common import VERDICTS

    res = run / "results/tiny"
    summary = pd.read_parquet(res / "discover/summary.parquet")
    assert set(summary["task"]) == {*TASKS, "union", "shared"}
    shared = pd.read_parquet(res / "discover/shared.parquet")
    assert shared["chosen"].sum() == 1 and (shared["task"] == "shared").all()
    row = summary[summary["task"] == "shared"].iloc[0]
    assert row["target"] == shared.loc[shared["chosen"], "target"].iloc[0]
    assert row["n_heads"] == shared.loc[shared["chosen"], "n_heads"].iloc[0]
    shared_validation = pd.read_parquet(res / "discover/shared_validation.parquet")
    assert set(shared_validation["task"]) == {*TASKS, "shared"}
    # the order check and the fit gap (report.claims.circuit_faithful and report.page read these names)
    for column in ("cpr_order_flag", *(f"tf_{k}_{m}" for k in ("mean", "resample")
                                       for m in ("correct_identification", "gap"))):
        assert column in summary, column
    union: set = set()
    for task in TASKS:
        table = pd.read_parquet(res / f"discover/{task}.parquet").sort_values("target")
        assert table["chosen"].sum() == 1 and (table["n_nodes"].diff().dropna() >= 0).all()  # nested circuits
        union |= set(parse_nodes(table.loc[table["chosen"], "nodes"].iloc[0])[0])
        validation = pd.read_parquet(res / f"discover/{task}_validation.parquet")
        assert (validation["split"] == "validation").all()
        for name in ("path", "circuit"):
            assert (res / f"discover/{task}_{name}.png").read_bytes()[:4] == b"\x89PNG"
    ranked, _ = ranked_nodes({t: pd.read_parquet(res / f"effects/{t}.parquet") for t in TASKS})
    heads = yaml.safe_load((run / "config.yaml").read_text())["study"]["heads"]
    stats = json.loads((res / "finetune/study/runs/circuit/lr0/stats.json").read_text())
    assert [tuple(h) for h in stats["spec"]["heads"]] == circuit_first(ranked, union)[:heads]
    claims = pd.read_parquet(res / "claims.parquet")
    for claim in ("circuit_faithful", "sft_circuit_vs_precise"):
        rows = claims[claims["claim"] == claim]
        assert len(rows) and rows["verdict"].isin(VERDICTS).all()
    assert "shared circuit of the operators" in set(claims.loc[claims["claim"] == "circuit_faithful", "scope"])
    assert (claims.loc[claims["claim"] == "sft_circuit_vs_precise", "verdict"] != "not measured").all()
    planned = planned_rules(dry_run(run, lambda c: c["circuit"]["discover"].update(random_draws=6)))
    assert {"discover", "discover_shared", "discover_union", "study_train", "claims", "findings"} <= set(planned)
    assert not {"edges", "knockout", "patch_all_layers"} & set(planned)


def test_claims_scorecard(run):
    """Every claim of the paper has a headline row with a verdict and its rule; rows point at files that exist;
    the Markdown and HTML name every claim."""
    from arithmech.report.claims.common import VERDICTS
    from arithmech.report.claims.registry import claims

    res = run / "results/tiny"
    table = pd.read_parquet(res / "claims.parquet")
    headline = table[table["scope"] == "all"]
    assert list(headline["claim"]) == list(claims())  # one headline per claim, in order
    assert table["verdict"].isin(VERDICTS).all() and (table["rule"].str.len() > 0).all()
    measured = table[table["verdict"] != "not measured"]
    # a measured row has a value, but for a headline that only combines its sub-rows
    assert (measured["value"].notna() | measured["measure"].str.endswith("below")).all()
    assert measured.loc[measured["scope"] != "all", "value"].notna().all()
    with_interval = measured.dropna(subset=["ci_low", "ci_high"])
    assert (with_interval["ci_low"] <= with_interval["ci_high"] + 1e-9).all()
    assert {"key_attention", "mlp_answer", "sft_vs_full", "sft_off_target"} <= set(with_interval["claim"])
    unmeasured = table[table["verdict"] == "not measured"]
    assert (unmeasured["note"].str.len() > 0).all()  # says why
    # the random tiny model answers nothing, so there is nothing to knock out: said in the row, nothing fails
    for claim in ("knockout_collapse", "transfer"):
        rows = table[(table["claim"] == claim) & (table["scope"] != "all")]
        assert (rows["verdict"] == "not measured").all() and rows["note"].str.contains("answers none").all()
    for source in table["source"][table["source"].str.len() > 0]:
        assert (res / source).exists(), source
    markdown, page = (res / "claims.md").read_text(), (res / "claims.html").read_text()
    for claim in claims().values():
        assert claim.statement[:30] in markdown and html.escape(claim.statement[:30]) in page


# ---------------------------------------------------------------------------------------------------
# Re-running exactly what changed: library code and the checkout's location


def moved_checkout(run: Path, tmp_path: Path) -> Path:
    """The whole checkout, results and Snakemake's records included, copied to another directory (a clone
    on the cluster's scratch, a renamed folder); file times are kept, as a move keeps them."""
    return Path(shutil.copytree(run, tmp_path / "elsewhere" / "renamed", symlinks=True))


def test_a_moved_checkout_reruns_nothing(run, tmp_path):
    proc = snakemake(moved_checkout(run, tmp_path), "--cores", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def test_library_edits_rerun_exactly_the_rules_that_run_the_edited_code(run, tmp_path):
    """Each rule's params carry the digest of the library code its script reaches (arithmech.code_digest):
    a figure edit re-draws figures and re-runs no model job; an edit to direct-mode patching re-runs
    patching and what reads its effects; a comment re-runs nothing."""
    checkout = moved_checkout(run, tmp_path)

    def planned_after(module: str, old: str, new: str) -> dict[str, int]:
        path = checkout / "src/arithmech" / module
        original = path.read_text()
        assert original.count(old) == 1, old
        path.write_text(original.replace(old, new))
        try:
            proc = snakemake(checkout, "--cores", "1", "--dry-run")
            assert proc.returncode == 0, proc.stderr[-2000:]
            return planned_rules(proc)
        finally:
            path.write_text(original)

    # every figure goes through plots._save
    assert planned_after("report/plots.py", "def _save(fig, path: str | Path) -> None:\n",
                         "def _save(fig, path: str | Path) -> None:\n    fig.set_dpi(fig.get_dpi())\n") == {
        "plot_effects": 2, "plot_knockout": 2, "plot_transfer": 1, "summarize_key_components": 1, "plot_analysis": 2,
        "plot_discover": 2, "plot_edge_curve": 1, "summarize_eval": 1, "study_summary": 1,
        "claims": 1, "findings": 1, "all": 1,
    }  # the summaries re-draw beside their tables and rewrite them: the scorecard and the findings page re-read
    assert planned_after("interp/patching.py", "@torch.no_grad()\ndef direct_logits(",
                         "def _unused_helper():\n    return 0\n\n\n@torch.no_grad()\ndef direct_logits(") == {}
    assert planned_after("interp/patching.py", "def direct_logits(", "# a comment\ndef direct_logits(") == {}
    assert planned_after("interp/patching.py", '"""Unembedding of final-normed',
                         '"""Unembedding of the final-normed') == {
        "patch_all_layers": 1, **FROM_EFFECTS,
    }


def test_make_docs_on_the_tiny_run(run, tmp_path):
    """`make docs`'s generator on a real run: markers replaced, README untouched outside them, numbers
    formatted, figure links resolve, a second run writes the same bytes (test_docs_results.check_docs)."""
    from helpers import check_docs

    check_docs(run / "results", "tiny", TASKS, tmp_path)

"""The paper's configuration rehearsed at its shape before a GPU hour is spent (`make rehearsal`).

A random Llama with LLaMA2-7B's topology where the code branches on it (32 layers, 32 query heads, 32
key/value heads: no grouped-query attention, 1,024 heads) but a tiny width (`arithmech.model.tiny`: head dimension
4, its byte-level tokenizer with 400 tokens), run through the real SLURM executor plugin and the profile in
workflow/profiles/slurm on a real Slurm (the one Slurm's clients reach: `make rehearsal` uses the test suite's
one-node cluster, tests/slurm/cluster.sh, unless SLURM_CONF names another; jobs go where `--account`,
`--partition` and `--cpu-partition` say, as the configuration's `slurm` block), on `configs/paper.yaml`: every template
and operator word, the 1,000-pair caps, the -5% threshold, 32 key heads with K/V and 2 MLPs, the study with
`train_format: auto`, the Hub-fetched MMLU and CommonsenseQA through rule fetch_dataset, read from local directories
laid out as the Hub serves them (`hub_layout`; generated questions of the real sizes: no network here).

What a random model cannot do is switched off, and `OVERLAY` says why: it answers nothing correctly, so
`prompts.keep_only_correct` is off, `study.base_band` is [0, 1] (else no study format qualifies and the
study's training jobs never run) and a failed teacher-forced sanity check warns (`circuit.discover.sanity`).
With `size: full` every other data size is the paper configuration's (all of GSM8K train for 2 epochs at 128 a
step, all of GSM8K test, SVAMP, MMLU, ...): hours on 2 CPU cores.
`size: quick` caps what only scales the work (`QUICK`: the fine-tuning data, the evaluation sets, the study's
training steps and scored items), for a
pass that still runs every job of the DAG. `size: peak` (`peak_overlay`) keeps, where a batch grows with the
data sizes, the full run's largest batch and only that: one fine-tuning step over the longest GSM8K training
examples that fit in its max_length, one batch of the longest GSM8K and SVAMP questions at their full answer
lengths, the transfer whole; with `targets` and `seed_from` (a quick rehearsal's directory) it runs just
those jobs, to check the plan's memory at the full sizes in a fraction of the full run's time.

The result: one row per Slurm job (rule, wildcards, and from `sacct` its State, Elapsed seconds and the largest
MaxRSS of its steps) in `jobs.tsv` of the working directory, and per rule the job count beside the count
`make plan` takes from a dry run of the same configuration (`plan.json`), total and largest wall time and
memory, printed.

It runs the workflow of a checkout, `--root` (default: the current directory): its Snakefile, config.yaml,
configs/paper.yaml, data files and SLURM profile.

    python -m arithmech.tools.rehearsal --size quick                  (make rehearsal, from the checkout)
    python -m arithmech.tools.rehearsal --root ~/arithmech --work /scratch/rehearsal
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from snakemake.utils import update_config

from arithmech import layout
from arithmech.data.eval_sets import REGISTRY
from arithmech.io import write_json
from arithmech.model.tiny import build_tiny_model
from arithmech.report.tables import markdown_table
from arithmech.tools.docs_results import replace_block, write_if_changed
from arithmech.tools.plan import data_path, load_config, plan, read_records
from arithmech.tools.plan.dryrun import profile_groups
from arithmech.tools.run_record import machine, machine_text

PROFILE = Path("workflow") / "profiles" / "slurm"  # the workflow's SLURM profile, in the checkout
# LLaMA2-7B: 32 layers, 32 heads of dimension 128 (no GQA), MLP width 11008 = 2.6875 x the model width.
TOPOLOGY = {"n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "head_dim": 4, "intermediate_size": 344,
            "max_positions": 4096}
MMLU_ROWS, COMMONSENSE_QA_ROWS = REGISTRY["mmlu"].hub_rows, REGISTRY["commonsense_qa"].hub_rows
# The random model's limits, merged over configs/paper.yaml (`overlay`).
OVERLAY = {
    "prompts": {"keep_only_correct": False},  # it answers nothing correctly: every prompt would be dropped
    "study": {"base_band": [0.0, 1.0]},  # its exact match is 0 on every format: none would lie inside the band
    # the teacher-forced sanity checks need items the full model gets right: recorded as failed, not stopping discover
    "circuit": {"discover": {"sanity": "warn"}},
}
# size quick: only what scales the work, not the shape. What costs most at this shape is attention over long
# prompts (32 heads at every layer, a byte-level tokenizer that makes GSM8K about twice as many tokens as
# LLaMA2's): fine-tuning on GSM8K is capped to 128 examples of at most 256 tokens (2 epochs of 128 a step took
# 168 s a step at 512 tokens on 2 cores), the evaluation sets to a few dozen items with shorter answers. The study
# keeps its jobs (arms, lr grids, seeds, random draws, 32 heads) but trains 20 steps instead of 60 and scores fewer
# items: at the paper's sizes a training job took 225 s on average (8 of 18 ran in the stopped rehearsal of
# 2026-11-26), which puts the study at about 1.5 h of the whole rehearsal.
QUICK = {
    "finetune": {"data": {"n": 128}, "train": {"max_length": 256}},
    "evaluation": {"gsm8k": {"n": 16, "max_new_tokens": 32}, "svamp": {"n": 16, "max_new_tokens": 32},
                   "social_iqa": {"n": 32}, "strategyqa": {"n": 32}, "qa_wikidata": {"n": 32}, "mmlu": {"n": 32},
                   "commonsense_qa": {"n": 32}, "wikitext": {"max_tokens": 2048}},
    "transfer": {"svamp": {"n": 32}, "non_math": {"n": 32}},
    "study": {"off_target": {"gsm8k_n": 8, "svamp_n": 16, "social_iqa_n": 16, "strategyqa_n": 16,
                             "qa_wikidata_n": 16, "wikitext": {"max_tokens": 2048, "window": 1024}},
              "train": {"max_steps": 20, "checkpoint_every": 10}, "curve": {"every": 10, "test_items": 32},
              "splits": {"validation": 64, "test": 128}, "transfer_test": 64, "format_choice": {"items": 64}},
}
# The generated blocks of docs/rehearsal.md (`--docs`): the last rehearsal's summary, never typed; size peak
# (a few jobs at the full run's largest batches) has a block of its own.
MARKERS = ("<!-- BEGIN GENERATED: rehearsal (make rehearsal) -->", "<!-- END GENERATED: rehearsal -->")
PEAK_MARKERS = ("<!-- BEGIN GENERATED: rehearsal-peak (make rehearsal-peak) -->",
                "<!-- END GENERATED: rehearsal-peak -->")
# As config.yaml gives llama2-7b, but no GPU type (types are a site's names: the test cluster's GPUs have none) and
# at most the memory of the GPU partition's nodes (`node_memory_mb`), or sbatch refuses every job.
RESOURCES = {"gpus": 1, "mem_mb": 64000, "runtime": 120}
# What the SLURM executor plugin logs for each job it submits (snakemake.log), and the job's log path
# (<slurm-logdir>/rule_<rule>/<wildcards>/<id>.log) that names its rule and wildcards.
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.?$", re.M)


def workflow_root(root: Path | str | None = None) -> Path:
    """The checkout whose workflow the rehearsal runs (`--root`; default: the current directory), resolved;
    an error naming --root when it has no Snakefile or no SLURM profile."""
    root = Path.cwd() if root is None else Path(root).expanduser()
    root = root.resolve()
    if not (root / "Snakefile").is_file():
        raise FileNotFoundError(f"no Snakefile in {root}: run the rehearsal from the checkout, or give it with "
                                f"--root")
    if not (root / PROFILE).is_dir():
        raise FileNotFoundError(f"no SLURM profile ({PROFILE}) in {root}: give the checkout with --root")
    return root


def hub_layout(root: Path, seed: int = 0) -> dict[str, dict]:
    """MMLU and CommonsenseQA as the Hub serves them (cais/mmlu: all/test-00000-of-00001.parquet;
    tau/commonsense_qa: data/validation-00000-of-00001.parquet; each repository's README.md declares its
    configs), with generated questions of the real split sizes and the real columns. Returns the
    `evaluation.<set>.hub` blocks that point `datasets.load_dataset` at them."""
    rng = np.random.default_rng(seed)
    mmlu, csqa = root / "cais" / "mmlu", root / "tau" / "commonsense_qa"
    (mmlu / "all").mkdir(parents=True, exist_ok=True)
    (csqa / "data").mkdir(parents=True, exist_ok=True)
    subjects = [f"subject_{i}" for i in range(57)]
    pd.DataFrame({
        "question": [f"Question {i}: which of these numbers is the largest?" for i in range(MMLU_ROWS)],
        "subject": [subjects[i % 57] for i in range(MMLU_ROWS)],
        "choices": [[str(x) for x in rng.integers(0, 100, 4)] for _ in range(MMLU_ROWS)],
        "answer": rng.integers(0, 4, MMLU_ROWS),
    }).to_parquet(mmlu / "all" / "test-00000-of-00001.parquet", index=False)
    (mmlu / "README.md").write_text(
        "---\nconfigs:\n- config_name: all\n  data_files:\n  - split: test\n    path: all/test-*\n---\n")
    labels = list("ABCDE")
    pd.DataFrame({
        "id": [f"q{i:05d}" for i in range(COMMONSENSE_QA_ROWS)],
        "question": [f"Where would you put thing number {i}?" for i in range(COMMONSENSE_QA_ROWS)],
        "question_concept": ["thing"] * COMMONSENSE_QA_ROWS,
        "choices": [{"label": labels, "text": [f"place {x}" for x in rng.integers(0, 50, 5)]}
                    for _ in range(COMMONSENSE_QA_ROWS)],
        "answerKey": [labels[i] for i in rng.integers(0, 5, COMMONSENSE_QA_ROWS)],
    }).to_parquet(csqa / "data" / "validation-00000-of-00001.parquet", index=False)
    (csqa / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: validation\n"
        "    path: data/validation-*\n---\n")
    return {"mmlu": {"path": str(mmlu), "name": "all", "split": "test"},
            "commonsense_qa": {"path": str(csqa), "split": "validation"}}


def longest_records(source: Path, out: Path, n: int, lengths: list[float | None]) -> Path:
    """The `n` records of data file `source` (JSON Lines or a JSON list) with the largest `lengths` (one per
    record, None: left out), written to `out` in the same format (atomically)."""
    from arithmech.io import atomic_path

    records = read_records(source)
    kept = [i for i, length in enumerate(lengths) if length is not None]
    if len(lengths) != len(records) or len(kept) < n:
        raise ValueError(f"{source}: {len(kept)} of its {len(records)} records can be kept, fewer than the {n} "
                         f"a batch holds")
    keep = [records[i] for i in sorted(kept, key=lambda i: lengths[i], reverse=True)[:n]]
    with atomic_path(out) as tmp:
        if source.suffix == ".jsonl":
            tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        else:
            tmp.write_text(json.dumps(keep))
    return out


def finetune_lengths(source: Path, config: dict, tokenizer) -> list[int | None]:
    """Tokens of each GSM8K training example of `source` as the finetune job encodes it (its prompt in
    `finetune.data.style`, the solution, BOS and EOS), None for one the job drops as longer than `max_length`
    (`sft.training.fitting_examples`)."""
    from arithmech.data.datasets import load_gsm8k
    from arithmech.data.formatting import math_prompts
    from arithmech.sft.training import example_tokens

    frame = math_prompts(load_gsm8k(source), (), config["finetune"]["data"]["style"], tokenizer)
    lengths = example_tokens(tokenizer, list(zip(frame["prompt"], frame["target"])))
    return [n if n <= config["finetune"]["train"]["max_length"] else None for n in lengths]


def peak_overlay(work: Path, config: dict, tokenizer, *, root: Path) -> dict:
    """Size peak over `config` (configs/paper.yaml merged; its data files relative to the checkout `root`): the
    full run's largest batch of each job whose batch grows with the data sizes, files written under
    work/peak. Fine-tuning: the longest `batch_size x grad_accumulation` GSM8K training examples that fit in
    `max_length` (`finetune_lengths`, in `tokenizer`'s tokens), all of them (one optimizer step an epoch);
    evaluation: the longest `evaluation.batch_size` GSM8K test questions and SVAMP problems (in characters:
    no question is dropped) at their full `max_new_tokens`; the transfer keeps its full sets. The other sets
    are capped as `QUICK`."""
    peak = Path(work) / "peak"
    train, ev = config["finetune"]["train"], config["evaluation"]
    step = train["batch_size"] * train["grad_accumulation"]
    source = data_path(config["finetune"]["data"]["file"], root=root)
    gsm8k_train = longest_records(source, peak / "gsm8k_train.jsonl", step,
                                  finetune_lengths(source, config, tokenizer))
    source = data_path(ev["gsm8k"]["file"], root=root)
    gsm8k_test = longest_records(source, peak / "gsm8k_test.jsonl", ev["batch_size"],
                                 [len(r["question"]) for r in read_records(source)])
    source = data_path(ev["svamp"]["file"], root=root)
    svamp = longest_records(source, peak / "svamp.json", ev["batch_size"],
                            [len(f"{r['Body']} {r['Question']}") for r in read_records(source)])
    extra = {}
    update_config(extra, QUICK)
    del extra["transfer"]
    extra["finetune"] = {"data": {"file": str(gsm8k_train), "n": None}}
    extra["evaluation"]["gsm8k"] = {"file": str(gsm8k_test), "n": None}
    extra["evaluation"]["svamp"] = {"file": str(svamp), "n": None}
    return extra


def overlay(model_dir: Path, hub: dict[str, dict], size: str, peak: dict | None = None,
            slurm: dict | None = None) -> dict:
    """The rehearsal's config on top of configs/paper.yaml: the model, the local Hub directories, where jobs go
    (`slurm`, the configuration's `slurm` block), the random model's limits (`OVERLAY`) and, with `size` quick,
    `QUICK`; with size peak, `peak` (`peak_overlay`)."""
    extra = {
        "slurm": dict(slurm or {}),
        "run": {"models": ["rehearsal"], "tasks": ["addition", "subtraction", "multiplication", "division"]},
        "models": {"rehearsal": {"source": {"path": str(model_dir)}, "resources": dict(RESOURCES)}},
        "evaluation": {name: {"hub": block} for name, block in hub.items()},
    }
    update_config(extra, OVERLAY)
    if size == "quick":
        update_config(extra, QUICK)
    elif size == "peak":
        if peak is None:
            raise ValueError("size peak needs its overlay (peak_overlay)")
        update_config(extra, peak)
    return extra


def node_memory_mb(partition: str | None, env: dict[str, str]) -> int:
    """The memory (MB) that every node of `partition` (None: the default partition) has, from `sinfo`: a job that
    asks for more is refused. An error that says how to reach a Slurm when none answers."""
    proc = subprocess.run(["sinfo", "-h", "-o", "%P %m"], capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode:
        raise RuntimeError(f"no Slurm answers here (`sinfo` exited {proc.returncode}: {proc.stderr.strip()}); on "
                           f"this machine start the test cluster (`sudo bash tests/slurm/cluster.sh up`) or run "
                           f"`make rehearsal`, which does")
    sizes: dict[str, int] = {}
    for line in proc.stdout.splitlines():  # a line per partition and node size; "8000+": 8000 and more
        name, memory = line.split()
        sizes[name] = min(sizes.get(name, 2**62), int(memory.rstrip("+")))
    default = [name for name in sizes if name.endswith("*")]
    key = f"{partition}*" if f"{partition}*" in sizes else partition if partition else (default or [None])[0]
    if key not in sizes:
        raise RuntimeError(f"Slurm has no partition {partition or '(default)'}: it has "
                           f"{', '.join(name.rstrip('*') for name in sizes) or 'none'} (--partition)")
    return sizes[key]


def submissions(log_text: str, group_ids: list[str] | None = None) -> list[tuple[int, str, str]]:
    """(Slurm job id, rule, wildcards) of every job the SLURM executor plugin submitted, from its lines in a
    Snakemake log: the job's log path names the rule (rule_<rule>/) and the wildcards (the folder below it, none
    for a rule without wildcards). A group job's (group_<group>_<its rules>/, Snakemake's GroupJob.name) is given
    as its group, one of `group_ids` (default: the groups of the workflow's SLURM profile), without wildcards."""
    if group_ids is None:
        group_ids = [item.split("=", 1)[1] for item in profile_groups(workflow_root())["groups"]]
    jobs = []
    for job_id, log in SUBMITTED.findall(log_text):
        parts = Path(log).parts
        at = max(i for i, part in enumerate(parts) if part.startswith(("rule_", "group_")))
        if parts[at].startswith("group_"):
            name = parts[at].removeprefix("group_")
            group = max((g for g in set(group_ids) if name.startswith(f"{g}_")), key=len, default=name)
            jobs.append((int(job_id), group, ""))
            continue
        wildcards = "/".join(parts[at + 1:-1])
        jobs.append((int(job_id), parts[at].removeprefix("rule_"), wildcards))
    return jobs


def slurm_seconds(elapsed: str) -> float:
    """sacct's Elapsed ([D-]HH:MM:SS) in seconds."""
    days, _, clock = elapsed.rpartition("-")
    seconds = 0.0
    for field in clock.split(":"):
        seconds = seconds * 60 + float(field)
    return seconds + 86400 * int(days or 0)


def slurm_megabytes(size: str) -> float:
    """sacct's MaxRSS ("716K", "1.50G", "" for a step that reported none) in MB (MiB, as Slurm counts); NaN for
    none."""
    if not size:
        return np.nan
    scale = {"K": 2**-10, "M": 1.0, "G": 2**10, "T": 2**20}
    return float(size[:-1]) * scale[size[-1]] if size[-1] in scale else float(size) / 2**20


def sacct_usage(job_ids: list[int], env: dict[str, str] | None = None) -> dict[int, dict]:
    """Per job, what Slurm's accounting recorded (`sacct`): its State (the first word: "CANCELLED by 0" is
    CANCELLED; OUT_OF_MEMORY where a step was killed for memory, though the job itself then ends FAILED), wall_s
    (Elapsed: from its start to its end, queueing left out) and peak_rss_mb (the largest MaxRSS of its steps: a
    step's processes together at their peak, sampled every JobAcctGatherFrequency; NaN for a job that never
    started)."""
    if not job_ids:
        return {}
    proc = subprocess.run(["sacct", "-P", "-n", "-j", ",".join(map(str, job_ids)), "-o",
                           "JobID,State,Elapsed,MaxRSS"], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode:
        raise RuntimeError(f"sacct exited {proc.returncode}: {proc.stderr.strip()}")
    usage: dict[int, dict] = {}
    for line in proc.stdout.splitlines():
        step, state, elapsed, max_rss = line.split("|")
        job = int(step.split(".")[0])
        row = usage.setdefault(job, {"state": "", "wall_s": np.nan, "peak_rss_mb": np.nan})
        if "." not in step:  # the job's own row (sacct's first); its steps (12.batch, 12.0) carry the memory
            row.update(state=state.split(" ")[0], wall_s=slurm_seconds(elapsed))
        elif state == "OUT_OF_MEMORY":  # the job's row says FAILED: the exit of its batch script's srun
            row["state"] = state
        row["peak_rss_mb"] = np.fmax(row["peak_rss_mb"], slurm_megabytes(max_rss))
    return usage


JOB_COLUMNS = ["job", "rule", "wildcards", "wall_s", "peak_rss_mb", "state"]


def job_table(submitted: list[tuple[int, str, str]], usage: dict[int, dict]) -> pd.DataFrame:
    """One row per submitted job (`submissions`) with its `sacct_usage`: job, rule, wildcards, wall_s,
    peak_rss_mb (NaN where sacct has none) and state ("" for a job sacct does not know)."""
    rows = [{"job": job, "rule": rule, "wildcards": wildcards,
             **usage.get(job, {"state": "", "wall_s": np.nan, "peak_rss_mb": np.nan})}
            for job, rule, wildcards in submitted]
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def per_rule(jobs: pd.DataFrame, planned: dict[str, int] | None = None) -> pd.DataFrame:
    """Per rule, in the order of its first job: jobs run, total and largest wall seconds, largest peak memory
    (MB); with `planned` (rule -> jobs, `planned_jobs` of make plan's report), the planned count beside it and a
    row for each planned rule that ran no job through sbatch (a local rule runs on the submitting host, and so
    does every CPU-only rule without a CPU partition)."""
    grouped = jobs.groupby("rule", sort=False)
    table = pd.DataFrame({"jobs": grouped.size(), "wall_s": grouped["wall_s"].sum(),
                          "max_wall_s": grouped["wall_s"].max(), "max_rss_mb": grouped["peak_rss_mb"].max()})
    if planned is not None:
        table = table.reindex([*table.index, *(r for r in planned if r not in table.index)])
        table["jobs"] = table["jobs"].fillna(0).astype(int)
        table.insert(1, "planned", [planned.get(r, 0) for r in table.index])
    return table


def cuda_available() -> bool:
    """Whether this host's torch sees a GPU (the jobs run with the same environment)."""
    import torch

    return torch.cuda.is_available()


def plan_of(work: Path, configs: list[Path], *, root: Path) -> dict:
    """`make plan`'s report (`plan.plan`) for the rehearsal's configuration, in the dtype its jobs run in here
    (compute.dtype auto: float32 without a GPU, which the plan must be told), so that its memory estimates
    can stand beside the measured peaks and its job counts (`planned_jobs`) beside the jobs run. Written to
    work/plan.json."""
    work = Path(work)
    dtype = work / "plan-dtype.yaml"
    dtype.write_text(yaml.safe_dump({} if cuda_available() else {"compute": {"dtype": "float32"}}))
    report = plan([*configs, dtype], root=root, workdir=work)
    write_json(report, work / "plan.json")
    return report


def planned_jobs(report: dict) -> dict[str, int]:
    """Jobs per rule of a `plan.plan` report (the dry run's counts); a grouped rule's (the SLURM profile's groups)
    under its group, as its allocations, as `submissions` names them."""
    counts: dict[str, int] = {}
    for row in report["rules"]:
        key = row.get("group") or row["rule"]
        counts[key] = counts.get(key, 0) + (row["allocations"] if row.get("group") else row["jobs"])
    return counts


def read_jobs(work: Path) -> tuple[pd.DataFrame, dict]:
    """(`job_table`, make plan's report: `plan_of`) of a rehearsal already run in `work` (jobs.tsv, plan.json)."""
    work = Path(work)
    for name in ("jobs.tsv", "plan.json"):
        if not (work / name).is_file():
            raise FileNotFoundError(f"{work / name} is missing: run the rehearsal in {work} first")
    return pd.read_csv(work / "jobs.tsv", sep="\t"), json.loads((work / "plan.json").read_text())


def summary_markdown(work: Path) -> str:
    """The rehearsal in `work` for docs/rehearsal.md: when, where, with which command and how long (run.json),
    how many jobs finished, and the per-rule table (`per_rule`) in Markdown."""
    table, report = read_jobs(work)
    meta_file = Path(work) / "run.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{meta_file} is missing: it is written when a rehearsal ends")
    meta = json.loads(meta_file.read_text())
    states = table["state"].fillna("").replace("", "not finished").value_counts()
    finished = ", ".join(f"{n} {state}" for state, n in states.items())
    runs = [*meta.get("earlier", []), meta]  # every invocation in this directory, oldest first
    minutes = round(sum(r["wall_s"] for r in runs) / 60)
    commands = ", then ".join(f"`{r['command']}`, started {r['started']}" for r in runs)
    lines = [f"{commands} on {meta['machine']}: {len(table)} jobs through "
             f"Slurm ({finished}, as `sacct` reports them) in {minutes // 60} h {minutes % 60} min; Snakemake exit "
             f"{', then '.join(str(r['snakemake_exit']) for r in runs)}.", ""]
    targeted = any(r.get("targets") for r in runs)  # a few jobs only: the whole run's planned counts do not apply
    rules = per_rule(table, None if targeted else planned_jobs(report))
    rules.loc["total"] = [int(rules["jobs"].sum()), *([] if targeted else [int(rules["planned"].sum())]),
                          table["wall_s"].sum(), table["wall_s"].max(), table["peak_rss_mb"].max()]

    def number(values: pd.Series) -> pd.Series:
        return values.map(lambda v: "" if pd.isna(v) else f"{v:,.0f}")

    # make plan's peak GPU memory per GPU rule, beside the measured peak
    plan_mb = {row["rule"]: row["gpu_gb"] * 1000 for row in report["rules"] if row["kind"] == "gpu"}
    rows = pd.DataFrame({
        "rule": [r if r == "total" else f"`{r}`" for r in rules.index],
        "jobs run": number(rules["jobs"]),
        **({} if targeted else {"planned": number(rules["planned"])}),
        "wall time, all jobs (s)": number(rules["wall_s"]),
        "longest job (s)": number(rules["max_wall_s"]),
        "largest peak memory (MB)": number(rules["max_rss_mb"]),
    })
    if plan_mb:
        rows["make plan's peak GPU memory (MB)"] = number(pd.Series(
            [plan_mb.get(r, np.nan) for r in rules.index], index=rules.index))
    lines.append(markdown_table(rows))
    return "\n".join(lines) + ("" if targeted else findings_markdown(work))


def findings_markdown(work: Path, model: str = "rehearsal") -> str:
    """What the rehearsal's results say about the paper's rules at this shape, read from work/results: per
    operator the pairs kept per split and the key heads and MLPs the rule selected; the study's trained format
    and why. Empty when the identify stage left no results."""
    from arithmech.sft.study_config import read_choice

    root = Path(work) / layout.MODEL_DIR.format(model=model)
    tasks = yaml.safe_load((Path(work) / "rehearsal.yaml").read_text())["run"]["tasks"]
    rows = []
    for task in tasks:
        pairs, key = root / layout.PAIRS.format(task=task), root / layout.KEY.format(task=task)
        if not (pairs.is_file() and key.is_file()):
            continue
        split = pd.read_parquet(pairs, columns=["split"])["split"].value_counts()
        nodes = pd.read_parquet(key, columns=["component", "n_heads_total"])
        heads = nodes[nodes["component"] == "head"]
        total = int(heads["n_heads_total"].iloc[0]) if len(heads) else None
        rows.append({"operator": task, "pairs (identification / validation)":
                     f"{split.get('identification', 0):,} / {split.get('validation', 0):,}",
                     "key heads": f"{len(heads):,}" + (f" of {total:,}" if total else ""),
                     "key MLPs": int((nodes["component"] == "mlp").sum())})
    if not rows:
        return ""
    out = ["", "Read from its results (`results/rehearsal/`):", "", markdown_table(pd.DataFrame(rows))]
    formats = root / layout.STUDY_FORMATS
    if formats.is_file():
        out.append(f"The study's trained format: {read_choice(formats)['reason']}.\n")
    return "\n".join(out)


def seed_work(work: Path, source: Path) -> None:
    """Start `work` from the rehearsal in `source`: its model and results, copied with their times (so that
    Snakemake finds them up to date, and the jobs upstream of a target need not run again)."""
    source = Path(source).resolve()
    for name in ("model", "results"):
        if not (source / name).is_dir():
            raise FileNotFoundError(f"{source / name} is missing: run a rehearsal in {source} first")
        shutil.copytree(source / name, work / name, symlinks=True, dirs_exist_ok=True)


def run(work: Path, *, root: Path | None = None, size: str = "quick", jobs: int = 1, seed: int = 0,
        targets: list[str] | None = None, seed_from: Path | None = None,
        slurm: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """Build the model and the Hub directories under `work`, write the merged config there, and run the
    whole workflow of the checkout `root` (`workflow_root`) through its SLURM profile on the Slurm that the
    environment's clients reach (SLURM_CONF), its jobs sent where `slurm` says (the configuration's `slurm`
    block: account, partition, cpu_partition); with `targets` (paths under `work`) only the jobs that make them,
    forced to run, and what they need that is missing; with `seed_from`, first copy that rehearsal's model and
    results (`seed_work`).
    Returns (`job_table` of every invocation in `work`, make plan's report for the same configuration, also in
    work/plan.json); raises with the log's tail when Snakemake fails (the jobs that ran are still in
    work/jobs.tsv)."""
    root = workflow_root(root)
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # the jobs' own snakemake: this Python's
        "HF_HUB_OFFLINE": "1",  # the Hub sets come from `hub`'s directories, never the network
        "HF_DATASETS_OFFLINE": "1",
    }
    slurm = {key: value for key, value in (slurm or {}).items() if value}
    node_mb = node_memory_mb(slurm.get("partition"), env)  # also: a Slurm answers, before any work
    if seed_from is not None:
        seed_work(work, seed_from)
    model_dir = work / "model"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, seed=seed, **TOPOLOGY)
    hub = hub_layout(work / "hub", seed)
    configs = [root / "configs" / "paper.yaml", work / "rehearsal.yaml"]
    peak = None
    if size == "peak":
        from transformers import AutoTokenizer

        peak = peak_overlay(work, load_config(configs[:1], root=root), AutoTokenizer.from_pretrained(model_dir),
                            root=root)
    extra = overlay(model_dir, hub, size, peak, slurm)
    resources = extra["models"]["rehearsal"]["resources"]
    resources["mem_mb"] = min(resources["mem_mb"], node_mb)
    if not cuda_available():  # a Slurm of GPU names only (the test cluster's): compute on the CPU, as asked for
        update_config(extra, {"compute": {"device": "cpu"}})
    (work / "rehearsal.yaml").write_text(yaml.safe_dump(extra, sort_keys=False))
    load_config(configs, root=root)  # a config the schema refuses fails here, not in the first job
    report = plan_of(work, configs, root=root)
    shutil.copy2(root / "config.yaml", work / "config.yaml")  # the Snakefile's `configfile:`
    # the Slurm job ids of earlier invocations in this directory (--targets after a run): the table keeps them
    earlier = pd.read_csv(work / "jobs.tsv", sep="\t", keep_default_na=False) if (work / "run.json").is_file() \
        and (work / "jobs.tsv").is_file() else pd.DataFrame(columns=JOB_COLUMNS)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(root / "Snakefile"), "--directory", str(work),
           "--configfile", *map(str, configs), "--workflow-profile", str(root / PROFILE),
           "--jobs", str(jobs), "--slurm-init-seconds-before-status-checks", "1",
           "--seconds-between-status-checks", "2", "--retries", "0", "--slurm-keep-successful-logs"]
    if targets:
        cmd += [*targets, "--forcerun", *targets]
    started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    with open(work / "snakemake.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    wall_s = time.perf_counter() - start
    submitted = [*((int(r.job), r.rule, r.wildcards) for r in earlier.itertuples()),
                 *submissions((work / "snakemake.log").read_text())]
    table = job_table(submitted, sacct_usage([job for job, _, _ in submitted], env))
    table.to_csv(work / "jobs.tsv", sep="\t", index=False)
    meta = {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "wall_s": round(wall_s, 1), "size": size,
            "jobs": jobs, "machine": machine_text(machine(gpus=False)), "snakemake_exit": proc.returncode,
            "targets": targets or [],
            "command": " ".join(["python -m arithmech.tools.rehearsal", f"--size {size}", f"--jobs {jobs}",
                                 *([f"--seed-from {seed_from}"] if seed_from else []),
                                 *([f"--targets {' '.join(targets)}"] if targets else [])])}
    if (work / "run.json").is_file():  # jobs.tsv holds every invocation's jobs in this directory: so does run.json
        before = json.loads((work / "run.json").read_text())
        meta["earlier"] = [*before.pop("earlier", []), before]
    write_json(meta, work / "run.json")
    print(f"rehearsal ({size}): {len(table)} jobs through Slurm in {wall_s:.0f} s; "
          f"per job in {work / 'jobs.tsv'}")
    if proc.returncode != 0:
        tail = (work / "snakemake.log").read_text()[-4000:]
        raise RuntimeError(f"the rehearsal failed (snakemake exit {proc.returncode}); "
                           f"log: {work / 'snakemake.log'}\n{tail}")
    return table, report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout whose workflow is rehearsed (its Snakefile, config.yaml, configs/, data, "
                             "SLURM profile; default: the current directory)")
    parser.add_argument("--work", type=Path, default=None,
                        help="working directory (the model, the config, results/, jobs.tsv; default: "
                             "rehearsal/ in --root)")
    parser.add_argument("--size", choices=["quick", "full", "peak"], default="quick",
                        help="quick: capped fine-tuning data and evaluation sets; full: the paper's sizes; peak: "
                             "the full run's largest batch of each job whose batch grows with the sizes")
    parser.add_argument("--targets", nargs="+", default=None, metavar="PATH",
                        help="run only the jobs making these outputs (paths under --work), forced")
    parser.add_argument("--seed-from", type=Path, default=None, metavar="DIR",
                        help="start from the model and results of the rehearsal in DIR (e.g. a quick one)")
    parser.add_argument("--jobs", type=int, default=1, help="jobs run at once (1: each job's time is its own)")
    parser.add_argument("--account", default=None, help="the jobs' account (config slurm.account)")
    parser.add_argument("--partition", default=None, help="the model jobs' partition (config slurm.partition)")
    parser.add_argument("--cpu-partition", default=None,
                        help="the CPU-only jobs' partition (config slurm.cpu_partition; unset: they run here)")
    parser.add_argument("--docs", type=Path, default=None,
                        help="write the summary into this file's generated block (docs/rehearsal.md)")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: print (and with --docs write) the summary of the rehearsal in --work")
    args = parser.parse_args(argv)
    if args.work is None:
        args.work = workflow_root(args.root) / "rehearsal"
    if args.report_only:
        table, report = read_jobs(args.work)
    else:
        table, report = run(args.work, root=args.root, size=args.size, jobs=args.jobs, targets=args.targets,
                            seed_from=args.seed_from, slurm={"account": args.account, "partition": args.partition,
                                                             "cpu_partition": args.cpu_partition})
    with pd.option_context("display.max_rows", None, "display.width", 160):
        print(per_rule(table, planned_jobs(report)).round(1).to_string())
        print(table.to_string(index=False))
    if args.docs is not None:
        text = args.docs.read_text()
        size = json.loads((args.work / "run.json").read_text())["size"] if (args.work / "run.json").is_file() else ""
        markers = PEAK_MARKERS if size == "peak" else MARKERS
        write_if_changed(args.docs, replace_block(text, summary_markdown(args.work), str(args.docs), markers))
        print(f"summary written into {args.docs}")


if __name__ == "__main__":
    main()

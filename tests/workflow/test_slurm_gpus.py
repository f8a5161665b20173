"""GPU jobs through the real SLURM executor plugin and the workflow's profile on the test suite's real one-node Slurm
(tests/slurm: 2 GPUs as a GRES, names only, and a CPU build of torch): a rank of a 2-process training job that runs
out of GPU memory gets its job retried with the batch split, a job that asked for GPUs and sees none stops at once,
and what no job could run with (more GPUs than a node holds, a CPU torch asked for GPUs) stops the run before any
job is queued.

The first two run as a small workflow of their own (`SNAKEFILE`) made of the pieces the workflow's training and
model rules are made of: the rule's resources from `arithmech.tools.cluster` (a retry reads the job's log for the
out-of-memory mark, as workflow/rules/common.smk does), `arithmech.jobs.job` around the script, and
`arithmech.sft.distributed.run_on_gpus` with the rule's GPUs; ranks are gloo processes on the CPU (the mark is what
matters). Its 2-GPU job asks for 1 CPU a GPU: the test node has 2 CPUs."""

import json
import subprocess
import sys

import pytest
import yaml

from arithmech.model.tiny import build_tiny_model
from arithmech.tools import cluster
from arithmech.tools.rehearsal import slurm_seconds, submissions
from helpers import ROOT
from slurm.workflow_runs import JOB_WAIT_S, snakemake_cmd, where_jobs_go, workflow_env, write_config

pytestmark = pytest.mark.slow  # real jobs on a real scheduler

SNAKEFILE = """
import sys
sys.path.insert(0, {src!r})  # the checkout's package, as the workflow's Snakefile does

from arithmech.tools import cluster

MODEL = {{"gpus": 1, "mem_mb": 3000, "runtime": 10, "finetune": {{"gpus": 2}}}}


def resources(name):
    def get(key):
        def value(wildcards, attempt):
            first = cluster.job_resources(MODEL, "finetune" if name == "train" else "knockout")
            out = cluster.rule_resources(cluster.attempt_resources(first, f"logs/{{name}}.log", attempt))
            return {{**out, "cpus_per_gpu": 1 if out.get("cpus_per_gpu") else None}}.get(key)
        return value
    keys = ("gpu", "mem_mb", "runtime", "batch_split", "cpus_per_gpu", "nodes")
    return {{key: get(key) for key in keys}}


rule all:
    input: "trained.json", "no_gpu.json"


rule train:
    output: "trained.json"
    log: "logs/train.log"
    params: seed=0, compute={{"device": "cpu"}}, finetune={{"train": {{"batch_size": 4, "grad_accumulation": 1}}}}
    resources: **resources("train")
    script: "train.py"


rule no_gpu:
    output: "no_gpu.json"
    log: "logs/no_gpu.log"
    params: seed=0, compute={{"device": "auto"}}, finetune={{"train": {{"batch_size": 4, "grad_accumulation": 1}}}}
    resources: **resources("no_gpu")
    retries: 0  # the profile's retries would run it twice more
    script: "train.py"
"""

SCRIPT = """
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # ranks.py, for the ranks too (the launcher hands them this sys.path)

from arithmech import jobs
from arithmech.sft import distributed
from ranks import step

with jobs.job(snakemake):
    train = snakemake.params.finetune["train"]
    distributed.run_on_gpus(step, **jobs.gpu_settings(snakemake), batch_size=train["batch_size"],
                            grad_accumulation=train["grad_accumulation"], out=snakemake.output[0], seed=0)
"""

RANKS = """
import json
import time
from pathlib import Path

import torch

from arithmech.sft import distributed


def step(batch_size, grad_accumulation, out, seed):
    rank, world = distributed.world()
    if batch_size > 2 and world > 1:
        if rank == 1:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (rank 1, a batch of {batch_size})")
        time.sleep(120)  # rank 0 still working: the launcher stops it
    seen = [int(t) for t in distributed.gather_tensor(torch.tensor(batch_size))]
    if rank == 0:
        Path(out).write_text(json.dumps({"world": world, "batch_sizes": seen, "grad_accumulation": grad_accumulation}))
"""


def test_a_rank_out_of_gpu_memory_is_retried_with_the_batch_split_and_a_gpu_job_without_cuda_stops(
        slurm_cluster, tmp_path):
    """Rank 1 of the 2-GPU job raises torch's out-of-memory error while the batch is 4: the job fails, its log
    carries the mark, and the retry (the profile's `retries`) asks for batch_split 2 and trains (batch 2,
    grad_accumulation 2) on 2 ranks.
    The job that asked for a GPU with `device: auto` and a CPU torch (before: it trained on the CPU and completed)
    stops at its start, naming the CPU build (retries 0 here)."""
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(src=str(ROOT / "src")))
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ranks.py").write_text(RANKS)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(tmp_path / "Snakefile"), "--directory", str(tmp_path),
           "--workflow-profile", str(ROOT / "workflow/profiles/slurm"), "--slurm-init-seconds-before-status-checks",
           "1", "--seconds-between-status-checks", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env=workflow_env(slurm_cluster))
    log = proc.stdout + proc.stderr
    jobs = {}
    for job, rule, _ in submissions(log):
        row = slurm_cluster.wait(str(job), timeout=JOB_WAIT_S)
        jobs.setdefault(rule, []).append(row)
    assert [r["State"] for r in jobs.get("train", [])] == ["FAILED", "COMPLETED"], log[-6000:]
    assert all("gres/gpu=2" in r["AllocTRES"] for r in jobs["train"])
    assert json.loads((tmp_path / "trained.json").read_text()) == {"world": 2, "batch_sizes": [2, 2],
                                                                    "grad_accumulation": 2}
    retried = (tmp_path / "logs/train.log").read_text()  # the retry's own log
    assert "retry after running out of GPU memory: finetune.train.batch_size 4 -> 2, grad_accumulation 1 -> 2" \
        in retried
    usage = json.loads((tmp_path / "logs/train.usage.json").read_text())
    assert usage["batch_split"] == 2 and usage["ok"]

    assert proc.returncode != 0 and [r["State"] for r in jobs["no_gpu"]] == ["FAILED"]
    stopped = (tmp_path / "logs/no_gpu.log").read_text()
    assert "rule no_gpu asked for GPUs and sees none (compute.device: auto)" in stopped
    assert "is a CPU build (torch.version.cuda is None)" in stopped
    assert slurm_seconds(jobs["no_gpu"][0]["Elapsed"]) < 60  # the job's own Snakemake starting, then the stop
    assert not (tmp_path / "no_gpu.json").exists()


def test_the_gpus_a_node_check_reads_the_real_sinfo(slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    assert cluster.check_node_gpus({"tiny": {"gpus": 1, "finetune": {"gpus": 2}}}, None) == []
    with pytest.raises(cluster.ResourceError, match=r"models.tiny.resources.finetune.gpus asks for 3 GPUs on a node, "
                       r"and no node of partition gpu holds more than 2 \(sinfo: gpu:2\)"):
        cluster.check_node_gpus({"tiny": {"gpus": 1, "finetune": {"gpus": 3}}}, None)


@pytest.mark.parametrize("resources, compute, message", [
    ({"finetune": {"gpus": 3}}, {"device": "cpu"},
     "GPUs a node: models.tiny.resources.finetune.gpus asks for 3 GPUs on a node, and no node of partition gpu holds "
     "more than 2 (sinfo: gpu:2)"),
    ({}, {"device": "auto"}, "is a CPU build (torch.version.cuda is None), and the run asks for GPUs "
                             "(compute.device: auto): every GPU job would stop at its start"),
])
def test_gpus_no_job_could_use_stop_the_run_before_any_job_is_queued(slurm_cluster, tmp_path, resources, compute,
                                                                      message):
    model_dir = build_tiny_model(tmp_path / "model", n_layers=2)
    config = write_config(tmp_path / "work", model_dir, where_jobs_go(slurm_cluster, cpu_partition=True), **resources)
    config["compute"].update(compute)
    (tmp_path / "work/config.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(snakemake_cmd(tmp_path / "work"), capture_output=True, text=True, timeout=600,
                          env=workflow_env(slurm_cluster))
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and message in log, log[-4000:]
    assert not submissions(log) and "prepare_model:" not in log
    assert not (tmp_path / "work/results").exists()

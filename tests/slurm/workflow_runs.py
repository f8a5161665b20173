"""Runs through the test suite's real one-node Slurm (cluster.py) that the Slurm test modules of tests/workflow/
share: the snakemake command with the workflow's SLURM profile, the client environment, the tiny model's
configuration and its `slurm` block, and a small workflow of independent steps made of the pieces the model rules are
made of. Tests import this module as `slurm.workflow_runs` (tests/ is on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from arithmech.tools.rehearsal import hub_layout
from helpers import ROOT, tiny_config

# A job's wait for a scheduler that also runs other work (make rehearsal shares this node), and a run's: guards
# against a hang only (the whole DAG takes 13 min here beside a second pytest worker; CI's machine can be slower).
JOB_WAIT_S, RUN_TIMEOUT_S = 900, 3600
# What the tiny model's jobs ask for (`write_config`).
MEM_MB, RUNTIME = 3000, 10


def snakemake_cmd(work: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work),
            "--workflow-profile", str(ROOT / "workflow/profiles/slurm"),
            "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1", *args]


def workflow_env(slurm, **variables: str) -> dict[str, str]:
    """The cluster's client environment with this Python first on PATH (the jobs' own snakemake); `variables`
    added."""
    env = {name: value for name, value in slurm.env.items()
           if not (name.startswith("SLURM_") and name != "SLURM_CONF")}  # nothing of an enclosing job
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", PYTHONHASHSEED="0", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", **variables)
    return env


def where_jobs_go(slurm, *, cpu_partition: bool, **settings) -> dict:
    """The configuration's `slurm` block: the test cluster's account and GPU partition, its CPU partition only with
    `cpu_partition`; `settings` override."""
    out = {"account": slurm.account, "partition": slurm.partition}
    if cpu_partition:
        out["cpu_partition"] = slurm.cpu_partition
    return out | settings


def write_config(work: Path, model_dir: Path, slurm: dict | None = None, **resources) -> dict:
    """The tiny model's configuration in `work/config.yaml`, with `slurm` as its `slurm` block (None: none) and
    `resources` over the model's."""
    config = tiny_config(model_dir)
    if slurm is not None:
        config["slurm"] = slurm
    config["run"]["tasks"] = ["addition"]
    config["finetune"]["methods"] = ["precise"]  # base and precise
    config["evaluation"]["datasets"] = ["gsm8k", "mmlu"]  # a vendored set and one fetched (fetch_dataset)
    config["evaluation"]["mmlu"] = {"hub": hub_layout(work / "hub")["mmlu"], "n": 3}
    config["study"].update(arms=["precise", "full"], seeds={}, random_draws=1)  # every study rule, few jobs
    config["study"]["lr_grid"]["precise"] = [1e-3]
    config["models"]["tiny"]["resources"] = {"gpus": 1, "mem_mb": MEM_MB, "runtime": RUNTIME, **resources}
    # the test Slurm's GPUs are names (/dev/null): its GPU jobs compute on the CPU, asked for (`device: auto` stops a
    # job that asked for GPUs and sees none)
    config["compute"]["device"] = "cpu"
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    return config


# --- a small workflow of independent steps (tests/workflow/test_slurm_groups.py and test_slurm_qos.py) ----------

# What each step asks for.
STEP_MEM_MB, STEP_RUNTIME = 500, 5

STEPS_SNAKEFILE = """
import sys
sys.path.insert(0, {src!r})  # the checkout's package, as the workflow's Snakefile does

{imports}
MODEL = {{"gpus": 1, "mem_mb": {mem_mb}, "runtime": {runtime}}}


def value(key):
    def get(wildcards, attempt):  # as workflow/rules/common.smk's model_job_resources
        log = f"logs/step_{{wildcards.i}}.log"
        first = cluster.job_resources(MODEL, "knockout")
        return cluster.rule_resources(cluster.attempt_resources(first, log, attempt)).get(key)
    return get


rule all:
    input: expand("out/{{i}}.json", i=range({n_steps}))


rule step:
    output: "out/{{i}}.json"
    log: "logs/step_{{i}}.log"
    params: seed=0, compute={{"device": "cpu"}}
    threads: 1
    resources: **{{key: value(key) for key in ("gpu", "mem_mb", "runtime", "batch_split", "nodes")}}
    script: "step.py"
"""

# The SLURM plugin's wrap, as the workflow's Snakefile installs it: each failure's cause recorded for the retry.
INSTALL = """from arithmech.tools import cluster, slurm_plugin

if workflow.is_main_process:
    slurm_plugin.install()
"""


def steps_snakefile(n_steps: int, *, recorded: bool) -> str:
    """The Snakefile of `n_steps` independent jobs of rule `step` (its script: step.py beside it), each with the
    resources the model rules' jobs get from arithmech.tools.cluster (a retry's from the job's log); with
    `recorded`, the SLURM plugin wrapped as the workflow's Snakefile wraps it."""
    imports = INSTALL if recorded else "from arithmech.tools import cluster\n"
    return STEPS_SNAKEFILE.format(src=str(ROOT / "src"), imports=imports, mem_mb=STEP_MEM_MB, runtime=STEP_RUNTIME,
                                  n_steps=n_steps)

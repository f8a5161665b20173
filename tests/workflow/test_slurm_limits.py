"""The user's limits on the real test Slurm (tests/slurm, the `slurm_cluster` fixture), through the real SLURM executor
plugin and the workflow's profile: a profile's `jobs` caps the jobs queued at once, read back from sacct's submit and
end times (with a control without the user's profile); a model with `gpus: 0` runs on the CPU partition without a
GPU; a retry asks for more only where more helps, by what sacct says of the failed attempt: cancelled, the same
request; killed for host memory (OUT_OF_MEMORY), more memory; past its time limit (TIMEOUT), more time.

The cap and the retries use small workflows of their own, made of the pieces the workflow's Snakefile is made of
(arithmech.tools.profiles.fold_in_user_profiles while it parses; the model rules' resources from
arithmech.tools.cluster with arithmech.tools.slurm_plugin installed, `arithmech.jobs.job` around the script); the CPU
partition runs one job of the workflow itself. The plugin's first status check is 1 s after a submission."""

import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from arithmech.model.tiny import build_tiny_model
from arithmech.tools.rehearsal import submissions
from helpers import ROOT, user_profile
from slurm.workflow_runs import JOB_WAIT_S, RUN_TIMEOUT_S, snakemake_cmd, where_jobs_go, workflow_env, write_config

pytestmark = pytest.mark.slow  # real jobs on a real scheduler

STATUS_CHECKS = ("--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1")


# --- a profile's `jobs` caps the queue --------------------------------------------------------------------------

CAP, STEPS = 2, 5  # more independent jobs than the cap

CAP_SNAKEFILE = """
import sys
from pathlib import Path

sys.path.insert(0, {src!r})  # the checkout's package, as the workflow's Snakefile does

from arithmech.tools import profiles

if workflow.is_main_process:  # as the workflow's Snakefile
    for note in profiles.fold_in_user_profiles(
        workflow, profiles.snakemake_argv(sys.argv), Path.cwd(), Path({root!r})
    ):
        print(f"note: {{note}}", file=sys.stderr)


rule all:
    input: expand("out/{{i}}.txt", i=range({steps}))


rule step:
    output: "out/{{i}}.txt"
    threads: 1
    resources: mem_mb=300, runtime=5
    shell: "sleep 2; touch {{output}}"
"""


def most_at_once(slurm, job_ids) -> int:
    """The most of these Slurm jobs pending or running at one time, from sacct's Submit and End times: a job counts
    from its submission until it ends (half-open: one submitted in the second another ended does not overlap it)."""
    out = slurm.run("sacct", "-X", "-n", "-P", "-j", ",".join(map(str, job_ids)), "-o", "JobID,Submit,End").stdout
    spans = []
    for line in out.splitlines():
        _, submit, end = line.split("|")
        spans.append((datetime.fromisoformat(submit), datetime.fromisoformat(end)))
    assert len(spans) == len(job_ids), out
    return max(sum(start <= t < end for start, end in spans) for t, _ in spans)


def capped_run(slurm, work: Path, profile: str | None) -> tuple[str, list[int]]:
    """`snakemake --profile slurm` in `work` (its `slurm` the workflow's profile, as in a checkout), with the user's
    own profile named `slurm` holding `profile` (None: none); returns the run's output and its Slurm jobs."""
    work.mkdir(parents=True)
    (work / "Snakefile").write_text(CAP_SNAKEFILE.format(src=str(ROOT / "src"), root=str(ROOT), steps=STEPS))
    (work / "slurm").symlink_to(ROOT / "workflow/profiles/slurm")
    home = work / "home"
    if profile is not None:
        user_profile(home, profile)
    cmd = [sys.executable, "-m", "snakemake", "--profile", "slurm", *STATUS_CHECKS]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env=workflow_env(slurm, XDG_CONFIG_HOME=str(home)))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    jobs = [job for job, rule, _ in submissions(log, []) if rule == "step"]
    assert len(jobs) == STEPS, log[-6000:]
    for job in jobs:
        assert slurm.wait(str(job), timeout=JOB_WAIT_S)["State"] == "COMPLETED"
    return log, jobs


def test_a_users_job_limit_caps_the_jobs_queued_at_once(slurm_cluster, tmp_path):
    # the control: the workflow's profile alone (jobs 100) queues every job at once
    log, jobs = capped_run(slurm_cluster, tmp_path / "control", None)
    assert "Provided remote nodes: 100" in log, log[-4000:]
    assert most_at_once(slurm_cluster, jobs) > CAP

    log, jobs = capped_run(slurm_cluster, tmp_path / "capped", f"executor: slurm\njobs: {CAP}\n")
    mine = tmp_path / "capped/home/snakemake/slurm/config.yaml"
    assert f"note: profile {mine}: jobs {CAP}" in log and f"Provided remote nodes: {CAP}" in log, log[-4000:]
    assert most_at_once(slurm_cluster, jobs) <= CAP


# --- a model on the CPU partition ---------------------------------------------------------------------------------

CPU_TARGET = "results/tiny/pairs/addition.parquet"  # build_pairs: one model job


def test_a_model_without_gpus_runs_on_the_cpu_partition(slurm_cluster, tmp_path):
    """`models.tiny.resources.gpus: 0` with slurm.partition the CPU partition and compute.device auto: the model's
    job asks for no GPU, runs there and computes on the CPU (its log says so)."""
    model_dir = build_tiny_model(tmp_path / "tiny-src" / "model", n_layers=2)
    work = tmp_path / "work"
    config = write_config(work, model_dir, where_jobs_go(slurm_cluster, cpu_partition=True,
                                                         partition=slurm_cluster.cpu_partition), gpus=0)
    config["compute"]["device"] = "auto"
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(snakemake_cmd(work, CPU_TARGET), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env=workflow_env(slurm_cluster))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    (job, group, _), = submissions(log)
    assert group == "identify", log[-4000:]
    row = slurm_cluster.wait(str(job), timeout=JOB_WAIT_S)
    assert (row["State"], row["Partition"], row["Account"]) == ("COMPLETED", slurm_cluster.cpu_partition,
                                                                 slurm_cluster.account), row
    assert "gres/gpu" not in row["ReqTRES"] + row["AllocTRES"], row
    assert "computes on the CPU" in (work / "results/tiny/logs/build_pairs/addition.log").read_text()
    assert (work / CPU_TARGET).is_file()


# --- retries by cause --------------------------------------------------------------------------------------------

MEM_MB, RUNTIME = 400, 5
# name -> the job's first request; `oom` needs about 600 MB, `hang` outlasts its first attempt's 1 minute
FIRST = {"oom": {"gpus": 0, "mem_mb": MEM_MB, "runtime": RUNTIME},
         "cancel": {"gpus": 0, "mem_mb": MEM_MB, "runtime": RUNTIME},
         "hang": {"gpus": 0, "mem_mb": MEM_MB, "runtime": 1}}

RETRY_SNAKEFILE = """
import sys
sys.path.insert(0, {src!r})  # the checkout's package, as the workflow's Snakefile does

from arithmech.tools import cluster, slurm_plugin

if workflow.is_main_process:  # as the workflow's Snakefile
    slurm_plugin.install()

FIRST = {first!r}


def value(key):
    def get(wildcards, attempt):  # as workflow/rules/common.smk's model_job_resources
        first = cluster.job_resources(FIRST[wildcards.name], "knockout")
        log = f"logs/{{wildcards.name}}.log"
        return cluster.rule_resources(cluster.attempt_resources(first, log, attempt)).get(key)
    return get


rule all:
    input: expand("out/{{name}}.txt", name=FIRST)


rule step:
    output: "out/{{name}}.txt"
    log: "logs/{{name}}.log"
    params: seed=0
    threads: 1
    resources: **{{key: value(key) for key in ("gpu", "mem_mb", "runtime", "batch_split", "nodes")}}
    script: "step.py"
"""

RETRY_SCRIPT = """
import time
from pathlib import Path

from arithmech import jobs

with jobs.job(snakemake):
    name = snakemake.wildcards.name
    first = not Path(f"ran_{name}").exists()
    Path(f"ran_{name}").write_text("")
    if name == "oom":
        held = b"x" * (450 * 2**20)  # written, so resident: over the first attempt's 400 MB with the job's Snakemake
    elif first:
        time.sleep(300)  # cancelled by the test, or ended by Slurm at its limit
    Path(snakemake.output[0]).write_text("done")
"""


def started_job(slurm, work: Path, name: str, run: subprocess.Popen, deadline: float) -> str:
    """The id of the run's RUNNING job of wildcard `name` (its squeue comment names the wildcards), once its script
    has started (its `ran_<name>` file is there: a retry that finds it does not sleep)."""
    while True:
        assert run.poll() is None, f"the run ended (exit {run.returncode}) before job {name} started"
        if (work / f"ran_{name}").exists():
            for line in slurm.run("squeue", "-h", "-o", "%i|%k|%T|%Z").stdout.splitlines():
                job, comment, state, workdir = line.split("|")
                if comment.endswith(f"_{name}") and Path(workdir).resolve() == work.resolve() and state == "RUNNING":
                    return job
        assert time.monotonic() < deadline, f"no RUNNING job {name} that started its script"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def retried(slurm_cluster, tmp_path_factory):
    """The three jobs in one run, `cancel` cancelled with scancel once its script runs: name -> sacct's rows of its
    submissions, in order (the job's row, with its steps' states in `steps`)."""
    work = tmp_path_factory.mktemp("slurm-retries")
    (work / "Snakefile").write_text(RETRY_SNAKEFILE.format(src=str(ROOT / "src"), first=FIRST))
    (work / "step.py").write_text(RETRY_SCRIPT)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(work / "Snakefile"), "--directory", str(work),
           "--workflow-profile", str(ROOT / "workflow/profiles/slurm"), "--jobs", "3", "--retries", "1",
           *STATUS_CHECKS]
    with open(work / "run.log", "w") as out:
        run = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=workflow_env(slurm_cluster))
        try:
            slurm_cluster.run("scancel", started_job(slurm_cluster, work, "cancel", run, time.monotonic() + 600))
            assert run.wait(timeout=RUN_TIMEOUT_S) == 0, (work / "run.log").read_text()[-6000:]
        finally:
            if run.poll() is None:
                run.kill()
    jobs: dict[str, list[dict]] = {}
    for job, _, wildcards in submissions((work / "run.log").read_text(), []):
        row = slurm_cluster.wait(str(job), timeout=JOB_WAIT_S)
        steps = [r["State"] for r in slurm_cluster.sacct(job) if r["JobID"] != str(job)]
        jobs.setdefault(wildcards, []).append({**row, "steps": steps})
    return jobs


def request(row: dict) -> tuple[str, str, str]:
    return row["State"], row["ReqMem"], row["Timelimit"]


def test_a_cancelled_job_is_retried_with_the_same_request(retried):
    first, retry = retried["cancel"]
    assert request(first) == ("CANCELLED", f"{MEM_MB}M", f"00:{RUNTIME:02d}:00"), first
    assert request(retry) == ("COMPLETED", f"{MEM_MB}M", f"00:{RUNTIME:02d}:00"), retry


def test_a_job_killed_for_memory_is_retried_with_more_memory_only(retried):
    first, retry = retried["oom"]
    assert "OUT_OF_MEMORY" in [first["State"], *first["steps"]], first  # a step's: the job itself then FAILED
    assert (first["ReqMem"], first["Timelimit"]) == (f"{MEM_MB}M", f"00:{RUNTIME:02d}:00"), first
    assert request(retry) == ("COMPLETED", f"{2 * MEM_MB}M", f"00:{RUNTIME:02d}:00"), retry


def test_a_job_past_its_time_limit_is_retried_with_more_time_only(retried):
    first, retry = retried["hang"]
    assert request(first) == ("TIMEOUT", f"{MEM_MB}M", "00:01:00"), first
    assert request(retry) == ("COMPLETED", f"{MEM_MB}M", "00:02:00"), retry

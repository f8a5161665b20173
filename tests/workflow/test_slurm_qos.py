"""A submission that sbatch refuses under a real QOS limit (the test cluster's `capped_qos`: one job of a user at a
time, `MaxSubmitJobsPerUser=1`) through the real SLURM executor plugin: the retries ask for what the refused
submission asked for, not for the memory an out-of-memory retry would add (arithmech.tools.slurm_plugin records the
refusal, arithmech.tools.cluster.attempt_resources reads it), and the same command run again finishes the job.

The small workflow of tests/workflow/test_slurm_groups.py (slurm.workflow_runs.steps_snakefile: the model rules'
resources, `arithmech.jobs.job` around the script), two independent jobs and `--jobs 2`: the first is queued, sbatch
refuses the second at each of its three attempts (the profile's `retries: 2`) while the first still waits or runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from arithmech.tools.rehearsal import submissions
from helpers import ROOT
from slurm.workflow_runs import JOB_WAIT_S, STEP_MEM_MB, steps_snakefile, workflow_env

pytestmark = pytest.mark.slow  # real jobs on a real scheduler

SCRIPT = """
import time
from pathlib import Path

from arithmech import jobs

with jobs.job(snakemake):
    time.sleep(5)
    Path(snakemake.output[0]).write_text("done")
"""


def asked_memory(log: str, wildcard: str) -> list[int]:
    """mem_mb of each submission of rule step with i=`wildcard`, in order, from the job blocks Snakemake prints."""
    blocks = re.split(r"\n\s*\n", log)
    return [int(re.search(r"\bmem_mb=(\d+)", block).group(1)) for block in blocks
            if re.search(r"^rule step:", block, re.M) and re.search(rf"wildcards: i={wildcard}\b", block)]


def refused_run(slurm, work: Path, *, recorded: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The two-job workflow in `work`, the plugin's error report wrapped (`recorded`) as the workflow's Snakefile
    does or not; returns the run and its command."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "Snakefile").write_text(steps_snakefile(2, recorded=recorded))
    (work / "step.py").write_text(SCRIPT)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(work / "Snakefile"), "--directory", str(work),
           "--workflow-profile", str(ROOT / "workflow/profiles/slurm"), "--jobs", "2",
           "--slurm-qos", slurm.capped_qos, "--slurm-init-seconds-before-status-checks", "1",
           "--seconds-between-status-checks", "1"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_WAIT_S, env=workflow_env(slurm)), cmd


def test_a_submission_refused_by_a_qos_limit_is_retried_with_what_it_asked_for(slurm_cluster, tmp_path):
    # the control: without the record, the retries after a refusal grow the memory as after an out-of-memory kill
    proc, _ = refused_run(slurm_cluster, tmp_path / "control", recorded=False)
    log = proc.stdout + proc.stderr
    (job, _, queued), = submissions(log, [])
    assert asked_memory(log, "1" if queued == "0" else "0") == [k * STEP_MEM_MB for k in (1, 2, 3)], log[-6000:]
    slurm_cluster.wait(str(job), timeout=JOB_WAIT_S)  # the control's queued job out of the QOS's way

    proc, cmd = refused_run(slurm_cluster, tmp_path / "work", recorded=True)
    log = proc.stdout + proc.stderr
    # one job queued; the other refused three times (attempts 1-3: the profile's retries), so the run fails
    assert proc.returncode != 0, log[-6000:]
    assert log.count("QOSMaxSubmitJobPerUserLimit") >= 3, log[-6000:]
    queued = submissions(log, [])
    assert len(queued) == 1, log[-6000:]
    refused = "1" if queued[0][2] == "0" else "0"
    # each attempt of the refused job asks for the first attempt's memory
    assert asked_memory(log, refused) == [STEP_MEM_MB] * 3, log[-6000:]
    assert slurm_cluster.wait(str(queued[0][0]), timeout=JOB_WAIT_S)["State"] == "COMPLETED"
    # the same command again: the refused job alone, queued and finished
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_WAIT_S, env=workflow_env(slurm_cluster))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    (job, _, wildcards), = submissions(log, [])
    assert wildcards == refused and (tmp_path / f"work/out/{refused}.json").read_text() == "done"
    assert slurm_cluster.wait(str(job), timeout=JOB_WAIT_S)["ReqMem"] == f"{STEP_MEM_MB}M"

"""A group of jobs (the SLURM profile's `gpu_slot`, docs/cluster.md#groups)
through the real SLURM executor plugin on the test suite's real one-node Slurm: one allocation of 1 GPU on one node
with the largest memory and the summed runtime of its jobs, which run in it one at a time; when one of them fails,
the whole group runs again, each job asking for what helps it (arithmech.tools.cluster.attempt_resources).

A small workflow (slurm.workflow_runs.steps_snakefile): three independent jobs made of the pieces the workflow's
model rules are made of (their resources from `arithmech.tools.cluster` as workflow/rules/common.smk gives them,
`arithmech.jobs.job` around the script), grouped as the profile groups the knockout's jobs (`--groups step=steps
--group-components steps=3 --set-resources step:gpu_slot=1`)."""

import json
import subprocess
import sys

import pytest

from arithmech.tools.rehearsal import submissions
from helpers import ROOT
from slurm.workflow_runs import JOB_WAIT_S, STEP_MEM_MB, STEP_RUNTIME, steps_snakefile, workflow_env

pytestmark = pytest.mark.slow  # real jobs on a real scheduler

SCRIPT = """
import json
import time
from pathlib import Path

from arithmech import jobs

with jobs.job(snakemake):
    i = snakemake.wildcards.i
    start = time.time()
    with open(f"ran_{i}.txt", "a") as ran:  # not an output: Snakemake leaves it
        ran.write(f"{start}\\n")
    time.sleep(3)
    if i == "1" and not Path("failed_once").exists():
        Path("failed_once").write_text("")
        raise RuntimeError("the first run of job 1 fails")
    Path(snakemake.output[0]).write_text(json.dumps({"start": start, "end": time.time()}))
"""


def test_a_group_is_one_allocation_its_jobs_one_at_a_time_and_a_failure_runs_it_again(slurm_cluster, tmp_path):
    (tmp_path / "Snakefile").write_text(steps_snakefile(3, recorded=True))
    (tmp_path / "step.py").write_text(SCRIPT)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(tmp_path / "Snakefile"), "--directory", str(tmp_path),
           "--workflow-profile", str(ROOT / "workflow/profiles/slurm"), "--groups", "step=steps",
           "--group-components", "steps=3", "--set-resources", "step:gpu_slot=1", "--retries", "1",
           "--slurm-init-seconds-before-status-checks", "1",
           "--seconds-between-status-checks", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=workflow_env(slurm_cluster))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    runs = [slurm_cluster.wait(str(job), timeout=JOB_WAIT_S) for job, _, _ in submissions(log, ["steps"])]
    assert [r["State"] for r in runs] == ["FAILED", "COMPLETED"], (runs, log[-4000:])
    first, retry = runs
    for run in runs:
        assert "gres/gpu=1" in run["AllocTRES"] and "node=1" in run["AllocTRES"], run
        assert run["JobName"].startswith("arithmech_"), run
    # the largest memory of its jobs, the sum of their runtimes; the retry the same: job 1 failed with an error of its
    # own (sacct FAILED, its traceback in its log), which more memory or time would not help, the others completed
    # or did not get their turn
    assert (first["ReqMem"], first["Timelimit"]) == (f"{STEP_MEM_MB}M", f"00:{3 * STEP_RUNTIME:02d}:00"), first
    assert (retry["ReqMem"], retry["Timelimit"]) == (first["ReqMem"], first["Timelimit"]), retry
    # one at a time in the allocation (its CPUs: one job's thread)
    spans = sorted(tuple(json.loads((tmp_path / f"out/{i}.json").read_text()).values()) for i in range(3))
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), spans
    # the failure ran the whole group again: a job that completed before job 1 failed ran again in the retry
    # (Snakemake removes the outputs of every job of a failed group)
    starts = {str(i): [float(t) for t in (tmp_path / f"ran_{i}.txt").read_text().split()] for i in range(3)}
    assert len(starts["1"]) == 2 and starts["0"] and starts["2"], starts
    completed_first = [i for i in ("0", "2") if starts[i][0] < starts["1"][0]]
    assert all(len(starts[i]) == 2 for i in completed_first), starts
    print(f"group runs: {runs}; starts: {starts}")  # what happened, for the record (pytest -s)

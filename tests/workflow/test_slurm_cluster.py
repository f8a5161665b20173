"""The real one-node Slurm of tests/slurm/ (cluster.sh), through plain sbatch: what the workflow's SLURM tests rely
on. Jobs complete with their peak memory in sacct, GPUs are handed out as a GRES, memory and time limits are
enforced, scancel cancels, a partition or an account the user may not use is refused at submission, and a running
job survives a restart of slurmd. Every wait has its own deadline (a hung cluster fails, it does not hang)."""

import json
import os
import shlex
import sys
import time

import pytest

from slurm import cluster

pytestmark = pytest.mark.slow  # each test waits for real jobs; the time limit alone takes about 1.5 minutes

PYTHON = sys.executable


def holds_memory(mb: int, seconds: float) -> str:
    """A job command that writes `mb` MB into memory and keeps it `seconds` long."""
    return f"{PYTHON} -c 'import time; x = b\"x\" * ({mb} << 20); time.sleep({seconds})'"


def test_a_job_completes_with_its_peak_memory_in_sacct(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch("--mem=500M", "-o", str(tmp_path / "%j.out"), "--wrap", holds_memory(200, 5))
    row = slurm_cluster.wait(job, timeout=60)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0")
    # the job's defaults: the default partition and the user's default account
    assert (row["Partition"], row["Account"]) == (slurm_cluster.partition, slurm_cluster.account)
    assert row["ReqMem"] == "500M" and "mem=500M" in row["AllocTRES"]
    batch = next(r for r in slurm_cluster.sacct(job) if r["JobID"] == f"{job}.batch")
    assert batch["MaxRSS"].endswith("K") and int(batch["MaxRSS"][:-1]) > 200 * 1024  # the step's peak, in KiB
    flags = slurm_cluster.job_flags(job)  # slurmctld still knows a job this recent
    assert (flags["JobState"], flags["MinMemoryNode"], flags["Partition"]) == ("COMPLETED", "500M", "gpu")


def test_jobs_asking_for_gpus_see_them(slurm_cluster, tmp_path):
    command = "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
    one = slurm_cluster.sbatch("--gres=gpu:1", "-o", str(tmp_path / "one.out"), "--wrap", command)
    both = slurm_cluster.sbatch("--gpus=2", "-p", slurm_cluster.cpu_partition, "-o", str(tmp_path / "both.out"),
                                "--wrap", command)
    rows = {job: slurm_cluster.wait(job, timeout=60) for job in (one, both)}
    assert (tmp_path / "one.out").read_text() == "CUDA_VISIBLE_DEVICES=0\n"
    assert (tmp_path / "both.out").read_text() == "CUDA_VISIBLE_DEVICES=0,1\n"
    assert "gres/gpu=1" in rows[one]["AllocTRES"] and "gres/gpu=2" in rows[both]["AllocTRES"]
    assert [rows[j]["Partition"] for j in (one, both)] == ["gpu", "cpu"]


def test_a_job_step_without_slurm_conf_finds_the_cluster(slurm_cluster, tmp_path):
    """The executor plugin's job step drops every SLURM_* variable, SLURM_CONF too, before its `srun`: the
    default path (/etc/slurm/slurm.conf, linked by cluster.sh) must lead to this cluster."""
    job = slurm_cluster.sbatch("-o", str(tmp_path / "%j.out"), "--wrap", "env -u SLURM_CONF srun -n1 echo step-ran")
    assert slurm_cluster.wait(job, timeout=60)["State"] == "COMPLETED"
    assert (tmp_path / f"{job}.out").read_text() == "step-ran\n"
    assert [r["State"] for r in slurm_cluster.sacct(job) if r["JobID"] == f"{job}.0"] == ["COMPLETED"]


def test_a_job_over_its_memory_ends_out_of_memory(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch("--mem=100M", "-o", str(tmp_path / "%j.out"), "--wrap", holds_memory(400, 5))
    row = slurm_cluster.wait(job, timeout=60)
    assert row["State"] == "OUT_OF_MEMORY"
    assert "oom-kill" in (tmp_path / f"{job}.out").read_text()  # slurmstepd says why


def test_a_job_past_its_time_limit_ends_timeout(slurm_cluster, tmp_path):
    """Slurm's smallest limit is a minute, and slurmctld checks limits about every 30 s: 1-1.5 minutes."""
    job = slurm_cluster.sbatch("-t", "1", "-o", str(tmp_path / "%j.out"), "--wrap", "sleep 600")
    row = slurm_cluster.wait(job, timeout=240)
    assert (row["State"], row["Timelimit"]) == ("TIMEOUT", "00:01:00")


def test_scancel_cancels_a_running_job(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch("-o", str(tmp_path / "%j.out"), "--wrap", "sleep 600")
    slurm_cluster.wait_running(job, timeout=60)
    slurm_cluster.run("scancel", job)
    assert slurm_cluster.wait(job, timeout=60)["State"] == "CANCELLED"


def test_sbatch_refuses_an_unknown_partition_and_a_foreign_account(slurm_cluster):
    proc = slurm_cluster.run("sbatch", "-p", "no-such-partition", "--wrap", "true", check=False)
    assert proc.returncode == 1
    assert "Batch job submission failed: Invalid partition name specified" in proc.stderr
    proc = slurm_cluster.run("sbatch", "-A", slurm_cluster.other_account, "--wrap", "true", check=False)
    assert proc.returncode == 1
    assert "Batch job submission failed: Invalid account or account/partition combination specified" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="restarting slurmd needs root")
def test_a_running_job_survives_a_slurmd_restart(slurm_cluster, tmp_path):
    """The job's slurmstepd runs on without slurmd, and a slurmd back within SlurmdTimeout (30 s) takes it up
    again: the job completes, with all its output."""
    out = tmp_path / "ticks.out"
    job = slurm_cluster.sbatch("-o", str(out), "--wrap", "for i in $(seq 15); do echo $i; sleep 1; done")
    slurm_cluster.wait_running(job, timeout=60)
    deadline = time.monotonic() + 30
    while not (out.exists() and out.read_text()):  # the script itself runs
        assert time.monotonic() < deadline, "the job wrote nothing in 30 s"
        time.sleep(0.2)
    cluster.stop_slurmd(slurm_cluster.state)
    assert slurm_cluster.job_flags(job)["JobState"] == "RUNNING"
    proc = cluster.run_script("start", timeout=120)  # starts what is not running: slurmd
    assert proc.returncode == 0, proc.stderr
    row = slurm_cluster.wait(job, timeout=90)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0")
    assert out.read_text().split() == [str(i) for i in range(1, 16)]


def test_the_srun_launch_runs_under_a_real_slurm(slurm_cluster, tmp_path):
    """Under the test Slurm (one node, 2 GPUs as a GRES), in a job submitted as the plugin submits a multi-node
    fine-tuning job (its MPI job: --ntasks-per-node, GPUs per node as --gres, CPUs per GPU) and with every SLURM_*
    variable stripped but the job id (as the plugin's job step strips them), the launch's srun starts 2 tasks that
    join one process group as ranks 0 and 1 (Slurm's SLURM_PROCID), each with its own GPU."""
    code = f"import sys; sys.path[:0] = {sys.path!r}; import helpers; helpers.srun_in_job({str(tmp_path)!r})"
    keep = " ".join(f"{k}={shlex.quote(v)}" for k, v in slurm_cluster.env.items()
                    if k in ("PATH", "HOME", "SLURM_CONF"))
    script = tmp_path / "job.sh"
    script.write_text(f'#!/bin/bash\nexec env -i {keep} SLURM_JOB_ID="$SLURM_JOB_ID" '
                      f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}\n")
    job = slurm_cluster.sbatch("-t", "5", "--mem", "3000", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-gpu=1",
                               "--gres=gpu:2", "-D", str(tmp_path), "-o", str(tmp_path / "job.out"), str(script))
    row = slurm_cluster.wait(job, timeout=180)
    assert row["State"] == "COMPLETED", (tmp_path / "job.out").read_text()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(v["world"], v["sum"]) for v in ranks] == [(2, 2.0), (2, 2.0)]
    assert sorted(v["cuda"] for v in ranks) == ["0", "1"]  # --gpus-per-task=1: one GPU each

"""The tiny workflow through the real SLURM executor plugin and the workflow's profile (workflow/profiles/slurm,
as `--workflow-profile`) on the test suite's real one-node Slurm (tests/slurm, the `slurm_cluster` fixture), read
back from what Slurm recorded (`sacct`): each job's account, partition, GPUs, memory and time limit; a job over
its memory (OUT_OF_MEMORY) and one past its time limit (TIMEOUT) resubmitted with what
arithmech.tools.cluster.attempt_resources gives; a slurmd restart and a cancelled job in the middle of a run, then
the same command again; account and partition settings refused before any job is queued.

The workflow runs three times through Slurm (module fixtures): the whole DAG with a CPU partition (its `finetune`
block's memory too small for a first attempt), the identify stage of one operator without a CPU partition and
with a 1-minute limit (slurmd restarted during one job, the next one hung by stopping its processes until Slurm
ends it at its limit, the third cancelled), and that command again. No real rule of the tiny model runs past a
minute, hence the hung job. The plugin's first status check is 1 s after a submission and 1 s after a job ends
(`--slurm-init-seconds-before-status-checks 1 --seconds-between-status-checks 1`; it waits 10 s longer after each
check that finds nothing finished). Nothing stands in for Slurm any more: tests/fake_slurm is gone."""

import getpass
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arithmech.model.tiny import build_tiny_model
from arithmech.tools.cluster import CPU_JOB
from arithmech.tools.rehearsal import submissions
from helpers import fresh_checkout, user_profile
from slurm import cluster
from slurm.workflow_runs import (
    JOB_WAIT_S,
    MEM_MB,
    RUN_TIMEOUT_S,
    RUNTIME,
    snakemake_cmd,
    where_jobs_go,
    workflow_env,
    write_config,
)

pytestmark = pytest.mark.slow  # real jobs on a real scheduler: make test-fast leaves these out

# The `finetune` block (rules finetune and study_train) asks for less than its jobs need at the first attempt, and
# twice that (the retry after OUT_OF_MEMORY) is enough: measured here, sacct's MaxRSS of a finetune job was 482 MB in
# its step (its snakemake and the job's Python with torch) and 132 MB in the batch step (bash and srun), about 615 MB
# together in the job's memory cgroup. The model's other jobs ask for slurm.workflow_runs' MEM_MB and RUNTIME.
FINETUNE_MB = 450
# The GPU jobs as Slurm sees them: a rule's own jobs, or the SLURM profile's group jobs (workflow/profiles/slurm:
# `groups`), each of these once in the run of one operator, its jobs one after the other (runtime: their sum).
GROUPED = {
    "identify": ("build_pairs", "cache_activations", "patch_all_layers"),
    "discover": ("discover", "discover_shared", "discover_union"),
    "knockout": ("knockout",), "analyze": ("analyze",),
}
GPU_RULES = {*GROUPED, "transfer", "edges", "edge_curve", "finetune", "evaluate", "study_format", "study_train",
             "study_evaluate"}
# The troubled run's events are single jobs': there the profile's groups are replaced by one that no job of it runs.
UNGROUPED = ("--groups", "findings=ungrouped")
CPU_RULES = {"aggregate_effects", "plot_effects", "summarize_key_components", "plot_knockout", "plot_transfer",
             "plot_analysis", "plot_discover", "summarize_eval", "study_items", "study_select",
             "study_summary", "claims", "findings", "plot_edge_curve"}
LOCAL_RULES = {"prepare_model", "fetch_dataset"}  # downloads stay on the submitting host
# An exported Hugging Face token in the submitting shell (arithmech.tools.hub_token keeps it from the jobs).
MARKER = "hf_arithmechMarkerNotARealToken0123"
# How long the run may take to notice a cancelled job: the plugin checks 1 s after the last job that finished, then
# 10 s longer each time (1, 12, 33, 64 s), so by 90 s it has read sacct four times.
CANCEL_NOTICED_S = 90


def recorded(slurm, log: str) -> dict[str, list[dict[str, str]]]:
    """Per rule, in submission order, what sacct recorded for each job the plugin submitted (its log lines): the
    job's row, its wildcards and `steps`, its steps' states (a step killed for memory is OUT_OF_MEMORY, the job
    then FAILED)."""
    jobs: dict[str, list[dict]] = {}
    for job, rule, wildcards in submissions(log):
        row = slurm.wait(str(job), timeout=JOB_WAIT_S)
        steps = [r["State"] for r in slurm.sacct(job) if r["JobID"] != str(job)]
        jobs.setdefault(rule, []).append({**row, "wildcards": wildcards, "steps": steps})
    return jobs


def half_written(results: Path) -> list[Path]:
    """What an interrupted job can leave: write-then-rename temporaries (arithmech.io) and Snakemake's
    incomplete markers."""
    return [*results.rglob("*.tmp*"), *results.rglob("*.old-*"), *results.parent.glob(".snakemake/incomplete/*")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-src") / "model", n_layers=2)


@pytest.fixture(scope="module")
def full_run(slurm_cluster, model_dir, tmp_path_factory):
    """The whole tiny DAG, CPU jobs in the CPU partition: (work, the run's output, `recorded`)."""
    work = tmp_path_factory.mktemp("slurm-full")
    write_config(work, model_dir, where_jobs_go(slurm_cluster, cpu_partition=True), finetune={"mem_mb": FINETUNE_MB})
    # one thread a job, as `make run`: two jobs at once on the test node's 2 CPUs
    proc = subprocess.run(snakemake_cmd(work, "--max-threads", "1"), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=workflow_env(slurm_cluster, HF_TOKEN=MARKER))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return work, log, recorded(slurm_cluster, log)


def test_every_rule_went_through_sbatch_and_finished(full_run):
    work, log, jobs = full_run
    counts = {rule: len([j for j in runs if j["State"] == "COMPLETED"]) for rule, runs in jobs.items()}
    assert counts == {
        "identify": 1, "aggregate_effects": 1, "plot_effects": 1,
        "summarize_key_components": 1, "knockout": 1, "plot_knockout": 1, "transfer": 1, "plot_transfer": 1,
        "analyze": 1, "plot_analysis": 1, "finetune": 1, "evaluate": 4, "summarize_eval": 1, "study_format": 1,
        "study_items": 1, "study_train": 2, "study_select": 2, "study_evaluate": 3,
        "study_summary": 1, "edges": 1, "edge_curve": 1, "plot_edge_curve": 1,
        "discover": 1, "plot_discover": 1, "claims": 1, "findings": 1,
    }
    # every job of a group ran in its one allocation
    for rules in GROUPED.values():
        for rule in rules:
            assert f"\n    rule {rule}:" in log, rule
    assert set(jobs) == GPU_RULES | CPU_RULES
    for rule in LOCAL_RULES:  # ran, on this host (prepare_model is a checkpoint)
        assert re.search(rf"^local(rule|checkpoint) {rule}:", log, re.M) and rule not in jobs
    assert (work / "results/data/mmlu.parquet").is_file() and (work / "results/tiny/findings.html").is_file()
    assert not half_written(work / "results")


def test_an_exported_token_reaches_no_job_log_page_or_report(full_run, slurm_cluster):
    """HF_TOKEN exported in the submitting shell: no job's environment as Slurm stored it (`sacct --env-vars`; the
    test cluster keeps job environments, as many sites do), no file of the run (results with the findings page,
    Slurm and rule logs, .snakemake) and not the Snakemake report holds it. The control: a job submitted the same
    way (sbatch --export=ALL) by hand has it in its stored environment."""
    work, log, jobs = full_run
    control = subprocess.run(["sbatch", "--parsable", "-p", slurm_cluster.cpu_partition, "-A", slurm_cluster.account,
                              "--export=ALL", "--output=/dev/null", "--wrap", "true"],
                             env={**slurm_cluster.env, "HF_TOKEN": MARKER}, capture_output=True, text=True, timeout=60,
                             check=True)
    job_id = control.stdout.strip().split(";")[0]
    slurm_cluster.wait(job_id, timeout=JOB_WAIT_S)
    assert MARKER in slurm_cluster.run("sacct", "-j", job_id, "--env-vars", "-n").stdout
    assert "note: HF_TOKEN is kept out of the jobs' environment" in log and MARKER not in log
    for rule, runs in jobs.items():
        for job in runs:
            stored = slurm_cluster.run("sacct", "-j", job["JobID"], "--env-vars", "-n").stdout
            assert "PATH=" in stored and "HF_TOKEN_PATH=" in stored, (rule, stored[:500])
            assert MARKER not in stored, (rule, job["JobID"])
    report = subprocess.run(snakemake_cmd(work, "--report", str(work / "report.html")), capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S, env=workflow_env(slurm_cluster, HF_TOKEN=MARKER))
    assert report.returncode == 0, (report.stdout + report.stderr)[-4000:]
    written = [p for p in work.rglob("*") if p.is_file()]
    assert (work / "report.html").is_file() and (work / "results/tiny/findings.html") in written
    assert len(list((work / "logs/slurm").rglob("*.log"))) >= len(GPU_RULES | CPU_RULES)
    assert [p for p in written if MARKER.encode() in p.read_bytes()] == []


def test_gpu_jobs_get_account_partition_gpu_memory_and_time(full_run, slurm_cluster):
    """Every GPU job and group job asks for one GPU and the model's memory; a group job for the sum of its jobs'
    runtimes (they run one after the other), on one node."""
    _, _, jobs = full_run
    for rule in GPU_RULES - {"finetune", "study_train"}:
        runtime = RUNTIME * len(GROUPED.get(rule, (rule,)))
        for job in jobs[rule]:
            assert (job["Account"], job["Partition"]) == (slurm_cluster.account, slurm_cluster.partition), job
            assert "gres/gpu=1" in job["ReqTRES"] and "gres/gpu=1" in job["AllocTRES"], job
            assert (job["ReqMem"], job["Timelimit"]) == (f"{MEM_MB}M", f"00:{runtime:02d}:00"), job
            assert "node=1" in job["AllocTRES"], job
            assert job["JobName"].startswith("arithmech_"), job  # the profile's slurm-jobname-prefix


def test_cpu_jobs_go_to_the_cpu_partition_without_a_gpu(full_run, slurm_cluster):
    _, _, jobs = full_run
    for rule in CPU_RULES:
        for job in jobs[rule]:
            assert (job["Account"], job["Partition"]) == (slurm_cluster.account, slurm_cluster.cpu_partition), job
            assert "gres/gpu" not in job["ReqTRES"] + job["AllocTRES"], job
            assert (job["ReqMem"], job["Timelimit"]) == (f"{CPU_JOB['mem_mb']}M",
                                                         f"00:{CPU_JOB['runtime']:02d}:00"), job


def test_a_job_over_its_memory_is_resubmitted_with_twice_the_memory(full_run):
    """The `finetune` block's memory is too small for the first attempt: Slurm kills the job step (OUT_OF_MEMORY;
    the job then FAILED), and the retry asks for memory x 2 and the same runtime (attempt_resources after a kill for
    host memory)."""
    _, _, jobs = full_run
    for rule in ("finetune", "study_train"):
        by_wildcards: dict[str, list] = {}
        for job in jobs[rule]:
            by_wildcards.setdefault(job["wildcards"], []).append(job)
        for wildcards, (first, retry) in by_wildcards.items():
            assert "OUT_OF_MEMORY" in [first["State"], *first["steps"]], (rule, wildcards, first)
            assert (first["ReqMem"], first["Timelimit"]) == (f"{FINETUNE_MB}M", f"00:{RUNTIME:02d}:00")
            assert (retry["State"], retry["ReqMem"], retry["Timelimit"]) == (
                "COMPLETED", f"{2 * FINETUNE_MB}M", f"00:{RUNTIME:02d}:00"), (rule, wildcards)
            assert "gres/gpu=1" in retry["AllocTRES"] and retry["Partition"] == "gpu"


# --- a run that meets trouble: slurmd restarted, a job that hangs past its time limit, a cancelled job -----------

TARGET = "results/tiny/effects/addition.parquet"  # build_pairs, cache_activations, patch_all_layers on Slurm


def squeue_job(slurm, work: Path, rule: str, deadline: float, run: subprocess.Popen | None = None,
               log: Path | None = None) -> str:
    """The id of this run's (its work directory's) job of `rule` once it is RUNNING; fails at once when the
    Snakemake `run` (its output in `log`) has ended, instead of waiting for a job it will never submit."""
    while True:
        if run is not None and run.poll() is not None:
            text = log.read_text(errors="replace") if log is not None else ""
            pytest.fail(f"the run ended (exit {run.returncode}) before a RUNNING {rule} job:\n{text[-3000:]}")
        out = slurm.run("squeue", "-h", "-o", "%i|%k|%T|%Z").stdout
        for line in out.splitlines():
            job, comment, state, workdir = line.split("|")
            if comment.startswith(f"rule_{rule}") and os.path.realpath(workdir) == os.path.realpath(work) \
                    and state == "RUNNING":
                return job
        assert time.monotonic() < deadline, f"no RUNNING {rule} job of {work}: squeue says\n{out}"
        time.sleep(0.3)


def stop_processes(slurm, job: str) -> list[int]:
    """SIGSTOP every process of a job (`scontrol listpids`), as a job that hangs: until no new one appears."""
    stopped: set[int] = set()
    for _ in range(10):
        out = slurm.run("scontrol", "listpids", job, check=False).stdout.splitlines()[1:]
        new = {int(line.split()[0]) for line in out if line.split()} - stopped
        if not new and stopped:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped |= new
        time.sleep(0.5)
    return sorted(stopped)


def restart_slurmd(slurm) -> None:
    cluster.stop_slurmd(slurm.state)
    time.sleep(3)  # down a few seconds, the job running on
    proc = cluster.run_script("start", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def notice_seconds(log_path: Path, job: str, run: subprocess.Popen, timeout: float) -> float | None:
    """Seconds until the run's log says Slurm job `job` failed (the plugin's `SLURM-job '<id>' failed`), or None
    when it did not within `timeout` (or the run ended first without saying so)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if f"SLURM-job '{job}' failed" in log_path.read_text(errors="replace"):
            return time.monotonic() - start
        if run.poll() is not None:
            return None
        time.sleep(0.5)
    return None


@pytest.fixture(scope="module")
def troubled_run(slurm_cluster, model_dir, tmp_path_factory):
    """The identify stage of one operator, CPU jobs local (no SLURM_CPU_PARTITION), GPU jobs with a 1-minute
    limit: slurmd restarted while build_pairs runs, cache_activations hung (its processes stopped) until Slurm
    ends it at its time limit, patch_all_layers cancelled with scancel. A run that has not noticed the cancel
    `CANCEL_NOTICED_S` later is interrupted as a user would (SIGINT: Snakemake cancels its jobs and exits) and its
    exit is None. Then the same command again. Returns (work, first run: (exit, output), the re-run's exit and
    output, what happened: rule -> Slurm job id, and "noticed": seconds from the cancel to the run's failure line
    or None)."""
    if os.geteuid() != 0:
        pytest.skip("restarting slurmd and stopping a job's processes need root")
    work = tmp_path_factory.mktemp("slurm-trouble")
    write_config(work, model_dir, where_jobs_go(slurm_cluster, cpu_partition=False), runtime=1)
    env = workflow_env(slurm_cluster)
    cmd = snakemake_cmd(work, TARGET, *UNGROUPED)  # --groups takes every value after it: the target goes first
    events = {}
    with open(work / "first.log", "w") as out:
        run = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            waiting = {"deadline": deadline, "run": run, "log": work / "first.log"}
            events["build_pairs"] = squeue_job(slurm_cluster, work, "build_pairs", **waiting)
            restart_slurmd(slurm_cluster)
            events["cache_activations"] = job = squeue_job(slurm_cluster, work, "cache_activations", **waiting)
            assert stop_processes(slurm_cluster, job), f"job {job} has no processes"
            events["patch_all_layers"] = job = squeue_job(slurm_cluster, work, "patch_all_layers", **waiting)
            slurm_cluster.run("scancel", job)
            events["noticed"] = notice_seconds(work / "first.log", job, run, CANCEL_NOTICED_S)
            try:
                first = run.wait(timeout=RUN_TIMEOUT_S if events["noticed"] is not None else 0)
            except subprocess.TimeoutExpired:
                first = None
                run.send_signal(signal.SIGINT)
                run.wait(timeout=300)  # it cancels and waits for its jobs: about a minute
        finally:
            if run.poll() is None:
                run.kill()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    return work, (first, (work / "first.log").read_text()), (rerun.returncode, rerun.stdout + rerun.stderr), events


def test_a_slurmd_restart_leaves_the_running_job_to_complete(troubled_run, slurm_cluster):
    _, _, _, events = troubled_run
    row = slurm_cluster.wait(events["build_pairs"], timeout=JOB_WAIT_S)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0")


def test_a_job_past_its_time_limit_is_resubmitted_with_twice_the_time(troubled_run, slurm_cluster):
    """Twice the time and the same memory (attempt_resources after TIMEOUT)."""
    _, (_, log), _, events = troubled_run
    jobs = recorded(slurm_cluster, log)["cache_activations"]
    assert jobs[0]["JobID"] == events["cache_activations"]
    assert [(j["State"], j["Timelimit"], j["ReqMem"]) for j in jobs] == [
        ("TIMEOUT", "00:01:00", f"{MEM_MB}M"), ("COMPLETED", "00:02:00", f"{MEM_MB}M")]


def test_a_cancelled_job_is_noticed_and_retried(troubled_run, slurm_cluster):
    """sacct says `CANCELLED by <uid>`, which the pinned plugin alone reads as running (the run waited for good);
    the workflow's reading (arithmech.tools.slurm_plugin) makes it a failure: the plugin reports it within a few
    status checks, and the rule's retry runs the job again, to the end of the run."""
    work, (first, log), _, events = troubled_run
    jobs = recorded(slurm_cluster, log)["patch_all_layers"]
    assert (jobs[0]["JobID"], jobs[0]["State"]) == (events["patch_all_layers"], "CANCELLED")
    assert events["noticed"] is not None, (f"Snakemake still waited {CANCEL_NOTICED_S} s after job "
                                           f"{events['patch_all_layers']} was cancelled")
    assert "SLURM status is: 'CANCELLED'" in log, log[-4000:]
    assert first == 0, log[-4000:]
    assert [j["State"] for j in jobs] == ["CANCELLED", "COMPLETED"], jobs
    # the same request again: a cancelled job needs no more memory or time
    assert len({(j["ReqMem"], j["Timelimit"]) for j in jobs}) == 1, jobs


def test_after_a_cancelled_job_the_same_command_finishes_with_nothing_half_written(troubled_run, slurm_cluster):
    work, (_, log), (rerun, rerun_log), events = troubled_run
    assert slurm_cluster.wait(events["patch_all_layers"], timeout=JOB_WAIT_S)["State"] == "CANCELLED"
    assert rerun == 0, rerun_log[-4000:]
    assert (work / TARGET).is_file()
    assert not half_written(work / "results"), half_written(work / "results")
    again = subprocess.run(snakemake_cmd(work, TARGET, "-n"), capture_output=True, text=True, timeout=300,
                           env=workflow_env(slurm_cluster))
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_without_a_cpu_partition_cpu_and_local_jobs_never_reach_slurm(troubled_run):
    _, (_, log), (_, rerun_log), _ = troubled_run
    submitted = {rule for _, rule, _ in submissions(log + rerun_log)}
    assert submitted == {"build_pairs", "cache_activations", "patch_all_layers"}
    assert "localrule aggregate_effects:" in log + rerun_log and "localcheckpoint prepare_model:" in log


# --- settings refused before any job is queued ------------------------------------------------------------------


@pytest.mark.parametrize("setting, message", [
    ({"partition": "nope"}, "slurm.partition=nope: no such partition on this cluster; partitions: cpu, gpu"),
    ({"account": "other"}, f"slurm.account=other: user {getpass.getuser()} may not submit to this account; "
                           f"the user's accounts: proj42"),
])
def test_a_bad_setting_stops_before_any_job_is_queued(slurm_cluster, model_dir, tmp_path, setting, message):
    write_config(tmp_path, model_dir, where_jobs_go(slurm_cluster, cpu_partition=True, **setting))
    proc = subprocess.run(snakemake_cmd(tmp_path), capture_output=True, text=True, timeout=600,
                          env=workflow_env(slurm_cluster))
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and message in log, log[-4000:]
    assert not submissions(log) and "prepare_model:" not in log
    assert not (tmp_path / "results").exists()


def test_the_check_runs_slurms_clients_in_the_submitting_environment(slurm_cluster, model_dir, tmp_path):
    """Inside an allocation (salloc) the SLURM plugin deletes every SLURM_* variable, SLURM_CONF among them,
    before the run starts; the check runs Slurm's clients in the environment the workflow saw while parsing, so it
    still reaches the cluster and refuses a bad partition. (Here /etc/slurm/slurm.conf also leads to the test
    cluster; tests/tools/test_cluster.py shows that the check uses the environment it is given.)"""
    write_config(tmp_path, model_dir, where_jobs_go(slurm_cluster, cpu_partition=True, partition="nope"))
    cmd = ["salloc", "-p", slurm_cluster.cpu_partition, "-A", slurm_cluster.account, "-n1", "--mem=200", "-t", "10",
           *snakemake_cmd(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=workflow_env(slurm_cluster))
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-4000:]
    assert "slurm.partition=nope: no such partition on this cluster; partitions: cpu, gpu" in log, log[-4000:]
    assert not submissions(log)


# --- `snakemake --profile slurm`, as typed in a fresh clone ---------------------------------------------------


@pytest.mark.parametrize("own_profile", [False, True], ids=["fresh-clone", "user-profile-named-slurm"])
def test_profile_slurm_as_typed_submits_with_the_workflows_settings(slurm_cluster, model_dir, tmp_path, own_profile):
    """`snakemake --profile slurm` run in a fresh clone (its config.yaml the tiny model's; no SLURM_* settings)
    submits a job of the identify stage (build_pairs: one job says what every job is given) with the workflow's
    resources and keeps the job's Slurm log. With a profile of the user's own named `slurm` (executor, a job limit
    and an account), the same command also takes the user's account (here `root`, where the user's default account
    is proj42) and job limit (Snakemake's own line says it)."""
    checkout = fresh_checkout(tmp_path / "arithmech")
    write_config(checkout, model_dir)  # no `slurm` block: account and partition from the profile or defaults
    env = workflow_env(slurm_cluster, XDG_CONFIG_HOME=str(tmp_path / "home"))
    if own_profile:
        user_profile(tmp_path / "home", "executor: slurm\njobs: 3\ndefault-resources:\n  slurm_account: root\n")
    cmd = [sys.executable, "-m", "snakemake", "--profile", "slurm", "--slurm-init-seconds-before-status-checks", "1",
           "--seconds-between-status-checks", "1", "results/tiny/pairs/addition.parquet"]
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "Using profile slurm for setting default command line arguments" in log
    jobs = recorded(slurm_cluster, log)
    assert set(jobs) == {"identify"}, log[-4000:]  # the profile's group of build_pairs, here with its one job
    account = "root" if own_profile else "proj42"
    for rule, runs in jobs.items():
        (job,) = runs
        assert (job["State"], job["Account"], job["ReqMem"]) == ("COMPLETED", account, f"{MEM_MB}M"), (rule, job)
        assert job["Timelimit"] == f"00:{RUNTIME:02d}:00" and "gres/gpu=1" in job["AllocTRES"], (rule, job)
    kept = sorted((checkout / "logs/slurm").rglob("*.log"))
    assert len(kept) == 1, kept  # the plugin deletes a COMPLETED job's log unless told to keep it
    assert f"Provided remote nodes: {3 if own_profile else 100}\n" in log, log[-4000:]
    if own_profile:
        assert f"note: profile {tmp_path / 'home/snakemake/slurm/config.yaml'}: jobs 3, default-resources" in log

"""What the workflow carries for snakemake-executor-plugin-slurm (pinned: `PLUGIN_VERSION`) until upstream has it.

The plugin reads job states with `sacct -X --format=JobIdRaw,State` and compares each state with its lists
exactly. sacct writes a cancelled job as `CANCELLED by <uid>`, which matches nothing, and the plugin counts an
unmatched state as running: a cancelled job kept the whole run waiting for good. A job preempted and not requeued
(`PREEMPTED`, a final state: a requeued job is PENDING again) is also treated as running. `install()` wraps the
plugin's state query so that Snakemake sees `CANCELLED` and the preempted job as `FAILED`: both are then failures
like any other, resubmitted by the rules' `retries`, or the run stops naming the job.

The upstream fix is one line in `job_status_query.query_job_status` (docs/cluster.md): keep the state's first
word, `status = row[1].strip().split(" ", 1)[0]`. tests/tools/test_slurm_plugin.py fails when the pinned version
changes, so that this module is dropped once the fix is released.

A retry asks for more only where more helps (`arithmech.tools.cluster.attempt_resources`), by why the attempt
failed: `install()` also wraps the plugin's error report (`report_job_error`, which hands the job to Snakemake's
retry), so that the cause of each failure is recorded first (`record_failure`, into `cluster.FAILURES`): a
submission sbatch refused (a QOS limit such as QOSMaxSubmitJobPerUserLimit, which the plugin reports as the job's
failure), or what sacct says of the job and its steps (OUT_OF_MEMORY, TIMEOUT, CANCELLED, ...: the state the plugin
read is mapped above, and a step killed for memory leaves the job itself FAILED), with each job's own files.

Read by the Snakefile while it parses: standard library only (and the plugin, when it is installed).
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess

PLUGIN = "snakemake_executor_plugin_slurm"
PLUGIN_VERSION = "2.8.0"
# A final state that the plugin 2.8.0 does not count as a failure; reported to it as this one.
PREEMPTED, PREEMPTED_AS = "PREEMPTED", "FAILED"


def job_state(text: str) -> str:
    """sacct's or squeue's state of one job as one word: `CANCELLED by 1000` -> `CANCELLED`; `PREEMPTED` (not
    requeued: final) -> `FAILED`; every other state unchanged."""
    state = text.strip().split(" ", 1)[0]
    return PREEMPTED_AS if state == PREEMPTED else state


def job_states(states: dict[str, str] | None, logger=None) -> dict[str, str] | None:
    """`job_state` of every job of a status query's answer (None: the query failed, kept so)."""
    if states is None:
        return None
    out = {}
    for job, text in states.items():
        out[job] = job_state(text)
        if logger is not None and text.strip() == PREEMPTED:
            logger.warning(f"SLURM job {job} was preempted and not requeued: counted as failed, so that the rule's "
                           "retries resubmit it")
    return out


# How the plugin 2.8.0 begins its report of a submission sbatch refused (Executor.run_job).
SBATCH_REFUSED_MESSAGE = "SLURM sbatch failed."


def sacct_states(job_id: str) -> list[str]:
    """sacct's State of a Slurm job and of its steps, the job's first ([] when sacct does not answer)."""
    try:
        proc = subprocess.run(["sacct", "-n", "-P", "-j", str(job_id), "-o", "JobIDRaw,State"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line] if proc.returncode == 0 else []
    return [state for _, state in sorted(rows, key=lambda row: row[0] != str(job_id))]


def record_failure(job, job_id: str | None, msg: str | None, states=sacct_states) -> None:
    """Record why `job` (a job or a group job, Snakemake's; `job_id` its Slurm job, None when never queued) failed,
    for each of its jobs' rule logs with the attempt, in `cluster.FAILURES`: `cluster.REFUSED` when `msg` (the
    plugin's error report) says sbatch refused it, otherwise `cluster.failure_cause` of sacct's states (`states`)
    and the job's own files."""
    from arithmech.tools import cluster

    refused = (msg or "").startswith(SBATCH_REFUSED_MESSAGE)  # it never ran: its files are an earlier attempt's
    slurm = cluster.slurm_cause(states(job_id)) if job_id and not refused else None
    for one in (job.jobs if job.is_group() else [job]):
        if one.log:
            log = str(one.log[0])
            cause = cluster.REFUSED if refused else cluster.failure_cause(slurm, cluster.previous_attempt(log))
            cluster.FAILURES[(log, job.attempt)] = cause


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PLUGIN.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return None


def install() -> str | None:
    """Wrap the plugin's state query (`query_job_status`, which `check_active_jobs` calls by its module-level name)
    with `job_states`, and its error report with `record_failure`. Returns a note when the plugin is missing or is
    not the pinned version (then nothing is changed: a newer plugin may read states its own way); None when
    installed. Calling it twice wraps once."""
    version = installed_version()
    if version is None:
        return None  # no SLURM plugin, no SLURM run
    if version != PLUGIN_VERSION:
        return (f"{PLUGIN} {version} is not the pinned {PLUGIN_VERSION}: its job states are read as it reads them "
                "(a cancelled job may not be noticed: docs/cluster.md)")
    import snakemake_executor_plugin_slurm as plugin

    query = plugin.query_job_status
    if not getattr(query, "arithmech_states", False):

        @functools.wraps(query)
        async def query_job_status(command, logger):
            states, seconds = await query(command, logger)
            return job_states(states, logger), seconds

        query_job_status.arithmech_states = True
        plugin.query_job_status = query_job_status

    # every failure the plugin reports, a refused submission's (through _report_job_error_threadsafe) and a failed
    # job's (check_active_jobs), goes through report_job_error, which hands the job to Snakemake's retry
    report = plugin.Executor.report_job_error
    if not getattr(report, "arithmech_failures", False):

        @functools.wraps(report)
        def report_job_error(self, job_info, msg=None, **kwargs):
            record_failure(job_info.job, job_info.external_jobid, msg)  # before Snakemake plans the retry
            return report(self, job_info, msg=msg, **kwargs)

        report_job_error.arithmech_failures = True
        plugin.Executor.report_job_error = report_job_error
    return None

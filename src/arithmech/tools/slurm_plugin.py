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

When sbatch refuses a submission (a QOS limit such as QOSMaxSubmitJobPerUserLimit), the plugin reports it as the
job's failure, and Snakemake retries the job, whose resources would grow as after an out-of-memory kill.
`install()` also wraps the plugin's error report so that such a refusal is recorded (`record_refusal`, into
`arithmech.tools.cluster.SBATCH_REFUSED`): the retry then asks for what the refused submission asked for
(`cluster.resource_attempt`).

Read by the Snakefile while it parses: standard library only (and the plugin, when it is installed).
"""

from __future__ import annotations

import functools
import importlib.metadata

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


def record_refusal(job, msg: str | None) -> None:
    """When `msg` (the plugin's error report) says sbatch refused `job` (a job or a group job, Snakemake's), record
    each of its jobs' rule log with the attempt in `cluster.SBATCH_REFUSED`."""
    if not (msg or "").startswith(SBATCH_REFUSED_MESSAGE):
        return
    from arithmech.tools import cluster

    for one in (job.jobs if job.is_group() else [job]):
        if one.log:
            cluster.SBATCH_REFUSED.add((str(one.log[0]), job.attempt))


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PLUGIN.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return None


def install() -> str | None:
    """Wrap the plugin's state query (`query_job_status`, which `check_active_jobs` calls by its module-level name)
    with `job_states`. Returns a note when the plugin is missing or is not the pinned version (then nothing is
    changed: a newer plugin may read states its own way); None when installed. Calling it twice wraps once."""
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

    report = plugin.Executor._report_job_error_threadsafe
    if not getattr(report, "arithmech_refusals", False):

        @functools.wraps(report)
        def report_job_error(self, job_info, msg):
            record_refusal(job_info.job, msg)  # before Snakemake handles the error and plans the retry
            return report(self, job_info, msg)

        report_job_error.arithmech_refusals = True
        plugin.Executor._report_job_error_threadsafe = report_job_error
    return None

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
    if getattr(query, "arithmech_states", False):
        return None

    @functools.wraps(query)
    async def query_job_status(command, logger):
        states, seconds = await query(command, logger)
        return job_states(states, logger), seconds

    query_job_status.arithmech_states = True
    plugin.query_job_status = query_job_status
    return None

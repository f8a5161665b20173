"""arithmech.tools.slurm_plugin: the pinned SLURM plugin's job states, read so that a cancelled or preempted job
counts as failed, and the cause of each failure recorded for the retry (the real-Slurm tests of a cancelled job and
of the retries are in tests/workflow/test_slurm.py and tests/workflow/test_slurm_limits.py)."""

import asyncio
import importlib.metadata
import inspect
import logging
import os
import shlex
from types import SimpleNamespace

import pytest
import snakemake_executor_plugin_slurm as plugin
from snakemake_executor_plugin_slurm import job_status_query

from arithmech.jobs import usage_path
from arithmech.tools import cluster, slurm_plugin
from helpers import ROOT

# What sacct -X --parsable2 --format=JobIdRaw,State writes for these jobs (Slurm 22.05 here).
SACCT_LINES = "101|COMPLETED\n102|CANCELLED by 0\n103|PREEMPTED\n104|RUNNING\n105|OUT_OF_MEMORY\n106|NODE_FAIL\n"
EXPECTED = {"101": "COMPLETED", "102": "CANCELLED", "103": "FAILED", "104": "RUNNING", "105": "OUT_OF_MEMORY",
            "106": "NODE_FAIL"}


def printing(text: str) -> str:
    """A status command (what the plugin runs) that prints `text`."""
    return shlex.join(["printf", text.replace("%", "%%")])


def query(function, text: str):
    return asyncio.run(function(printing(text), logging.getLogger("test")))


@pytest.mark.parametrize("text, state", [("CANCELLED by 1000", "CANCELLED"), ("CANCELLED", "CANCELLED"),
                                         ("PREEMPTED", "FAILED"), (" TIMEOUT ", "TIMEOUT"), ("PENDING", "PENDING")])
def test_a_state_is_its_first_word_and_preempted_counts_as_failed(text, state):
    assert slurm_plugin.job_state(text) == state


def test_the_pinned_plugin_still_reads_a_cancelled_job_as_running():
    """The reason for the module. When this fails the plugin changed (version or behaviour): check whether the
    upstream fix (docs/cluster.md) is released, and drop arithmech.tools.slurm_plugin if so."""
    assert importlib.metadata.version("snakemake-executor-plugin-slurm") == slurm_plugin.PLUGIN_VERSION
    assert f"snakemake-executor-plugin-slurm=={slurm_plugin.PLUGIN_VERSION}" in (ROOT / "requirements.txt").read_text()
    states, _ = query(job_status_query.query_job_status, SACCT_LINES)
    assert states["102"] == "CANCELLED by 0"  # matches none of the plugin's failure states: treated as running


def test_install_wraps_the_plugins_query_once(monkeypatch):
    monkeypatch.setattr(plugin, "query_job_status", job_status_query.query_job_status)
    assert slurm_plugin.install() is None
    wrapped = plugin.query_job_status
    assert wrapped is not job_status_query.query_job_status and wrapped.arithmech_states
    assert slurm_plugin.install() is None and plugin.query_job_status is wrapped  # not wrapped twice
    states, seconds = query(plugin.query_job_status, SACCT_LINES)
    assert states == EXPECTED and seconds >= 0


def test_a_failed_query_stays_failed(monkeypatch):
    monkeypatch.setattr(plugin, "query_job_status", job_status_query.query_job_status)
    slurm_plugin.install()
    assert asyncio.run(plugin.query_job_status("false", logging.getLogger("test"))) == (None, None)


def test_another_plugin_version_is_left_alone(monkeypatch):
    monkeypatch.setattr(plugin, "query_job_status", job_status_query.query_job_status)
    monkeypatch.setattr(slurm_plugin, "installed_version", lambda: "2.9.0")
    note = slurm_plugin.install()
    assert "2.9.0 is not the pinned 2.8.0" in note and plugin.query_job_status is job_status_query.query_job_status


def test_the_pinned_plugin_reports_a_refused_sbatch_as_the_jobs_error():
    """Why refusals are recorded: the plugin 2.8.0 turns sbatch's refusal (a QOS submit limit) into the job's error,
    with this message, and Snakemake retries the job. When this fails the plugin changed: check the message."""
    source = inspect.getsource(plugin.Executor.run_job)
    assert f'"{slurm_plugin.SBATCH_REFUSED_MESSAGE} "' in source and "_report_job_error_threadsafe" in source
    # both paths end in report_job_error, which install() wraps
    assert "self.report_job_error(" in inspect.getsource(plugin.Executor._report_job_error_threadsafe)
    assert "self.report_job_error(j, msg=msg" in inspect.getsource(plugin.Executor.check_active_jobs)


def test_a_failures_cause_is_recorded_for_the_retry_and_reported_as_before(monkeypatch, tmp_path):
    """The plugin's error report, wrapped: a refused submission is recorded as REFUSED, another failure by what
    sacct says of the job and its steps (here a stand-in sacct on PATH: a step killed for memory) with the job's
    files; the report itself goes on to the plugin as before."""
    reported = []
    monkeypatch.setattr(plugin.Executor, "report_job_error", lambda self, info, msg=None, **kw: reported.append(msg))
    monkeypatch.setattr(cluster, "FAILURES", {})
    sacct = tmp_path / "bin/sacct"
    sacct.parent.mkdir()
    sacct.write_text("#!/bin/sh\nprintf '7.batch|OUT_OF_MEMORY\\n7|FAILED\\n7.extern|COMPLETED\\n'\n")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{sacct.parent}:{os.environ['PATH']}")
    assert slurm_plugin.sacct_states("7") == ["FAILED", "OUT_OF_MEMORY", "COMPLETED"]
    assert slurm_plugin.install() is None
    assert plugin.Executor.report_job_error.arithmech_failures
    executor = SimpleNamespace(_main_event_loop=None)  # the plugin's own report_job_error, wrapped
    executor.report_job_error = lambda info, msg=None: plugin.Executor.report_job_error(executor, info, msg=msg)
    job = SimpleNamespace(is_group=lambda: False, log=["results/m/logs/knockout/addition.log"], attempt=2)
    refusal = (f"{slurm_plugin.SBATCH_REFUSED_MESSAGE} The error message was 'sbatch: error: "
               "QOSMaxSubmitJobPerUserLimit'.")
    plugin.Executor._report_job_error_threadsafe(executor, plugin.SubmittedJobInfo(job), refusal)
    other = SimpleNamespace(is_group=lambda: False, log=["results/m/logs/knockout/division.log"], attempt=1)
    plugin.Executor.report_job_error(executor, plugin.SubmittedJobInfo(other, external_jobid="7"),
                                     msg="SLURM-job '7' failed")  # as check_active_jobs reports a failed job
    assert reported == [refusal, "SLURM-job '7' failed"]
    assert cluster.FAILURES == {("results/m/logs/knockout/addition.log", 2): cluster.REFUSED,
                                ("results/m/logs/knockout/division.log", 1): cluster.HOST_OOM}


def test_every_job_of_a_failed_group_gets_its_own_cause(monkeypatch, tmp_path):
    """A group cancelled: every job of it asks for the same again; a group out of time: every job more time, a
    completed one too (the group's time is the sum); killed for memory: a completed job keeps its memory."""
    monkeypatch.setattr(cluster, "FAILURES", {})
    done, killed = tmp_path / "done.log", tmp_path / "killed.log"
    done.write_text("ok\n")
    usage_path(done).write_text('{"ok": true}')
    killed.write_text("started\n")
    group = SimpleNamespace(is_group=lambda: True, attempt=1,
                            jobs=[SimpleNamespace(log=[str(done)]), SimpleNamespace(log=[str(killed)])])
    for states, causes in ((["CANCELLED by 0"], (cluster.CANCELLED, cluster.CANCELLED)),
                           (["TIMEOUT", "CANCELLED"], (cluster.TIMEOUT, cluster.TIMEOUT)),
                           (["FAILED", "OUT_OF_MEMORY"], (cluster.COMPLETED, cluster.HOST_OOM)),
                           ([], (cluster.COMPLETED, cluster.FAILED))):
        slurm_plugin.record_failure(group, "9", "failed", states=lambda job_id, states=states: states)
        assert (cluster.FAILURES[(str(done), 1)], cluster.FAILURES[(str(killed), 1)]) == causes, states

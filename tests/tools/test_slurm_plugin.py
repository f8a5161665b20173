"""arithmech.tools.slurm_plugin: the pinned SLURM plugin's job states, read so that a cancelled or preempted job
counts as failed (the real-Slurm test of a cancelled job is in tests/workflow/test_slurm.py)."""

import asyncio
import importlib.metadata
import inspect
import logging
import shlex
from types import SimpleNamespace

import pytest
import snakemake_executor_plugin_slurm as plugin
from snakemake_executor_plugin_slurm import job_status_query

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


def test_a_refused_submission_is_recorded_for_the_retry_and_reported_as_before(monkeypatch):
    monkeypatch.setattr(plugin.Executor, "_report_job_error_threadsafe", plugin.Executor._report_job_error_threadsafe)
    monkeypatch.setattr(cluster, "SBATCH_REFUSED", set())
    assert slurm_plugin.install() is None
    assert plugin.Executor._report_job_error_threadsafe.arithmech_refusals
    reported = []
    executor = SimpleNamespace(_main_event_loop=None, report_job_error=lambda info, msg: reported.append(msg))
    job = SimpleNamespace(is_group=lambda: False, log=["results/m/logs/knockout/addition.log"], attempt=2)
    refusal = (f"{slurm_plugin.SBATCH_REFUSED_MESSAGE} The error message was 'sbatch: error: "
               "QOSMaxSubmitJobPerUserLimit'.")
    plugin.Executor._report_job_error_threadsafe(executor, plugin.SubmittedJobInfo(job), refusal)
    other = SimpleNamespace(is_group=lambda: False, log=["results/m/logs/knockout/division.log"], attempt=1)
    plugin.Executor._report_job_error_threadsafe(executor, plugin.SubmittedJobInfo(other), "Job failed, going on")
    assert reported == [refusal, "Job failed, going on"]
    assert cluster.SBATCH_REFUSED == {("results/m/logs/knockout/addition.log", 2)}
    group = SimpleNamespace(is_group=lambda: True, jobs=[job, other], attempt=1)
    slurm_plugin.record_refusal(group, refusal)
    assert ("results/m/logs/knockout/division.log", 1) in cluster.SBATCH_REFUSED

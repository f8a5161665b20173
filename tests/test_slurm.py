"""The tiny workflow through the real SLURM executor plugin and profile, with stand-in sbatch, sacct, srun,
scontrol, sinfo and sacctmgr on PATH (tests/fake_slurm): the flags each job is submitted with, and the
retry with more memory after a failed attempt."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from arithmech.tools.rehearsal import job_table, submitted_rule
from arithmech.model.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_workflow import tiny_config  # noqa: E402

pytestmark = pytest.mark.slow  # the workflow runs on the SLURM stand-in: make test-fast leaves these out


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("slurm")
    state = work / "slurm-state"
    state.mkdir()
    config = tiny_config(build_tiny_model(work / "tiny-src", n_layers=2))
    config["run"]["tasks"] = ["addition"]
    config["finetune"]["methods"] = ["precise"]  # base and precise: 6 evaluation jobs each
    config["study"].update(arms=["precise", "full"], seeds={}, random_draws=1)  # the study's rules, few jobs
    config["study"]["lr_grid"]["precise"] = [1e-3]
    config["models"]["tiny"]["resources"] = {"gpus": 1, "gpu_model": "a100", "mem_mb": 8000, "runtime": 30}
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "PATH": f"{ROOT / 'tests/fake_slurm'}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "FAKE_SLURM_DIR": str(state),
        "FAKE_SLURM_FAIL_ONCE": "rule_cache_activations",
        "SLURM_ACCOUNT": "proj42",
        "SLURM_PARTITION": "gpu-short",
    }
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work),
           "--profile", str(ROOT / "workflow/profiles/slurm"), "--slurm-status-command", "sacct",
           "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    calls = {}
    for f in sorted(state.glob("call_*"), key=lambda p: int(p.name.split("_")[1])):
        args = f.read_text().split()
        rule, _ = submitted_rule(args)
        calls.setdefault(rule, []).append(" ".join(args))
    return work, calls


def test_every_job_went_through_sbatch_and_finished(cluster_run):
    work, calls = cluster_run
    assert {r: len(c) for r, c in calls.items()} == {
        "build_pairs": 1, "cache_activations": 2, "patch_all_layers": 1, "aggregate_effects": 1, "plot_effects": 1,
        "summarize_key_components": 1, "knockout": 1, "plot_knockout": 1, "transfer": 1, "plot_transfer": 1,
        "analyze": 1, "plot_analysis": 1, "finetune": 1, "evaluate": 12, "summarize_eval": 1, "study_format": 1,
        "study_items": 1, "study_train": 2, "study_select": 2, "study_evaluate": 3,
        "study_summary": 1, "circuit": 1, "edges": 1, "plot_circuit": 1, "claims": 1, "findings": 1,
    }
    assert "prepare_model" not in calls  # a local rule: downloads stay on the submit host
    assert len(pd.read_parquet(work / "results/tiny/effects/addition.parquet")) == 2 * (4 + 1)


def test_the_stand_in_records_each_jobs_wall_time_and_peak_memory(cluster_run):
    """What `make rehearsal` prints comes from these records (arithmech.tools.rehearsal.job_table)."""
    work, calls = cluster_run
    jobs = job_table(work / "slurm-state")
    assert len(jobs) == sum(len(c) for c in calls.values())
    ran = jobs[jobs["state"] == "COMPLETED"]
    assert len(ran) == len(jobs) - 1  # the submission failed on purpose never ran
    assert (ran["wall_s"] > 0).all() and (ran["peak_rss_mb"] > 50).all()  # a Python job holds more than 50 MB


def test_gpu_rules_ask_for_gpus_memory_runtime_account_partition(cluster_run):
    _, calls = cluster_run
    for rule in ("build_pairs", "patch_all_layers", "circuit", "edges", "finetune", "evaluate", "study_format",
                 "study_train", "study_evaluate"):
        for call in calls[rule]:
            assert "--gpus=a100:1" in call and "--mem 8000" in call and "-t 30" in call
            assert "-A proj42" in call and "-p gpu-short" in call
    for rule in ("aggregate_effects", "plot_effects", "plot_knockout", "plot_transfer", "plot_analysis",
                 "summarize_key_components", "summarize_eval", "study_items", "study_summary", "claims",
                 "plot_circuit"):
        (call,) = calls[rule]
        assert "--gpus" not in call and "--mem 4000" in call and "-A proj42" in call


def test_failed_job_is_retried_with_more_memory_and_time(cluster_run):
    _, calls = cluster_run
    first, retry = calls["cache_activations"]
    assert "--mem 8000" in first and "-t 30" in first
    assert "--mem 16000" in retry and "-t 60" in retry


def test_make_slurm_profile_lets_the_documented_command_resolve(tmp_path):
    """`make slurm-profile`, then exactly `snakemake --profile slurm -n` from the checkout (README)."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": "", "SLURM_ACCOUNT": "proj42",
           "SLURM_PARTITION": "gpu-short",
           "PATH": f"{ROOT / 'tests/fake_slurm'}:{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def run(*cmd):
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)

    before = run("snakemake", "--profile", "slurm", "-n")
    assert before.returncode != 0 and "profile" in before.stderr + before.stdout
    installed = tmp_path / ".config/snakemake/slurm/config.yaml"
    assert run("make", "-s", "slurm-profile").returncode == 0
    assert installed.read_text() == (ROOT / "workflow/profiles/slurm/config.yaml").read_text()
    assert run("make", "-s", "slurm-profile").returncode == 0  # the same profile again: nothing to refuse
    dry = run("snakemake", "--profile", "slurm", "-n")
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-3000:]
    # a checkout whose results/ are complete has nothing to dry-run; either way the profile resolved
    assert "Using profile slurm" in dry.stderr
    assert "This was a dry-run" in dry.stdout or "Nothing to be done" in dry.stdout
    installed.write_text(installed.read_text() + "no-such-option: 1\n")  # the user's own profile of that name
    refused = run("make", "-s", "slurm-profile")
    assert refused.returncode != 0 and "not overwriting" in refused.stderr
    assert installed.read_text().endswith("no-such-option: 1\n")
    assert "no-such-option" in (lambda p: p.stdout + p.stderr)(run("snakemake", "--profile", "slurm", "-n"))  # read from there

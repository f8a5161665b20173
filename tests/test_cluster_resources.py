"""What a job asks a cluster for (arithmech.tools.cluster) and what a job does about it (arithmech.jobs): per-rule
resources, the retry after running out of GPU or host memory, the batch split, and the job's usage record.
The submissions themselves, against a real Slurm, are in tests/test_slurm.py."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake.iocontainers import Namedlist

from arithmech import jobs
from arithmech.tools import cluster

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"gpus": 1, "gpu_model": "a100", "mem_mb": 64000, "runtime": 120,
         "finetune": {"gpus": 2, "mem_mb": 128000}, "evaluate": {"runtime": 60}}


@pytest.mark.parametrize("rule, expected", [
    ("finetune", {"gpus": 2, "gpu_model": "a100", "mem_mb": 128000, "runtime": 120, "cpus_per_gpu": 2}),
    ("study_train", {"gpus": 2, "gpu_model": "a100", "mem_mb": 128000, "runtime": 120, "cpus_per_gpu": 2}),
    ("evaluate", {"gpus": 1, "gpu_model": "a100", "mem_mb": 64000, "runtime": 60}),
    ("study_evaluate", {"gpus": 1, "gpu_model": "a100", "mem_mb": 64000, "runtime": 60}),
    ("patch_layer", {"gpus": 1, "gpu_model": "a100", "mem_mb": 64000, "runtime": 120}),
])
def test_a_rules_block_overrides_the_models_own_resources(rule, expected):
    assert cluster.job_resources(MODEL, rule) == expected


def test_resources_key_names_the_block_a_rule_reads():
    assert cluster.resources_key("llama2-7b", "study_train") == "models.llama2-7b.resources.finetune"
    assert cluster.resources_key("llama2-7b", "knockout") == "models.llama2-7b.resources"


def test_a_retry_after_gpu_oom_splits_the_batch_and_keeps_host_memory():
    first = cluster.job_resources(MODEL, "finetune")
    assert cluster.retry_resources(first, 1, gpu_oom=False)["batch_split"] == 1
    second = cluster.retry_resources(first, 2, gpu_oom=True)
    third = cluster.retry_resources(first, 3, gpu_oom=True)
    assert (second["batch_split"], second["mem_mb"], second["runtime"]) == (2, 128000, 240)
    assert (third["batch_split"], third["mem_mb"], third["runtime"]) == (4, 128000, 360)


def test_another_failure_asks_for_more_host_memory_and_time_not_a_smaller_batch():
    first = cluster.job_resources(MODEL, "knockout")
    second = cluster.retry_resources(first, 2, gpu_oom=False)
    assert (second["batch_split"], second["mem_mb"], second["runtime"]) == (1, 128000, 240)
    # attempt 1 never splits, whatever an old log says
    assert cluster.retry_resources(first, 1, gpu_oom=True) == first | {"batch_split": 1}


def test_account_and_partitions_are_passed_only_when_set():
    assert cluster.slurm_settings({}, gpu=True) == {}
    assert cluster.slurm_settings({"SLURM_ACCOUNT": ""}, gpu=True) == {}
    env = {"SLURM_ACCOUNT": "proj42", "SLURM_PARTITION": "gpu", "SLURM_CPU_PARTITION": "cpu"}
    assert cluster.slurm_settings(env, gpu=True) == {"slurm_account": "proj42", "slurm_partition": "gpu"}
    assert cluster.slurm_settings(env, gpu=False) == {"slurm_account": "proj42", "slurm_partition": "cpu"}
    assert cluster.cpu_jobs_local({}) and not cluster.cpu_jobs_local(env)


def test_every_model_rule_of_a_block_exists_in_the_workflow():
    rules = {line.split()[1].rstrip(":") for f in (ROOT / "workflow/rules").glob("*.smk")
             for line in f.read_text().splitlines() if line.startswith(("rule ", "checkpoint "))}
    for group, members in cluster.RESOURCE_GROUPS.items():
        assert set(members) <= rules, group
        for rule in members:
            assert f'gpu_resources("{rule}")' in "".join(f.read_text() for f in (ROOT / "workflow/rules").glob("*.smk"))


def test_split_batches_keeps_examples_per_training_step():
    params = Namedlist(fromdict={"compute": {"batch_size": 64}, "evaluation": {"batch_size": 16, "style": "chat"},
                                 "finetune": {"train": {"batch_size": 12, "grad_accumulation": 1}}, "seed": 0})
    changed = jobs.split_batches(params, 4)
    assert params.compute["batch_size"] == 16 and params.evaluation["batch_size"] == 4
    train = params.finetune["train"]
    assert (train["batch_size"], train["grad_accumulation"]) == (3, 4)
    assert len(changed) == 3
    odd = Namedlist(fromdict={"study": {"train": {"batch_size": 6, "grad_accumulation": 2}}})
    jobs.split_batches(odd, 4)  # 6 // 4 = 1: the largest divisor of 6 not above it
    assert odd.study["train"]["batch_size"] * odd.study["train"]["grad_accumulation"] == 12
    assert odd.study["train"]["batch_size"] == 1


def _smk(tmp_path, batch_split=1):
    log = tmp_path / "logs" / "finetune" / "precise.log"
    log.parent.mkdir(parents=True)
    return SimpleNamespace(
        log=Namedlist([str(log)]), rule="finetune", threads=1,
        wildcards=Namedlist(fromdict={"model": "tiny", "method": "precise"}),
        params=Namedlist(fromdict={"seed": 0, "finetune": {"train": {"batch_size": 4, "grad_accumulation": 1}},
                                   "compute": {"batch_size": 8}}),
        resources=Namedlist(fromdict={"batch_split": batch_split}),
    ), log


class OutOfMemoryError(RuntimeError):
    """What torch raises when an accelerator's memory runs out (jobs recognises it by name)."""


def test_a_job_that_runs_out_of_gpu_memory_says_what_to_change_and_the_retry_sees_it(tmp_path):
    smk, log = _smk(tmp_path)
    with pytest.raises(OutOfMemoryError):
        with jobs.job(smk):
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    text = log.read_text()
    assert jobs.GPU_OOM_MARK in text and "models.tiny.resources.gpus" in text
    assert "finetune.train.batch_size" in text and "compute.batch_size" in text
    assert cluster.gpu_oom_logged(log)
    usage = json.loads(log.with_name("precise.usage.json").read_text())
    assert usage["ok"] is False and usage["rule"] == "finetune" and usage["wildcards"]["method"] == "precise"
    assert usage["host_peak_mb"] > 10 and usage["gpu_peak_mb"] is None  # no CUDA here


def test_a_retried_job_runs_with_the_split_batch_and_records_it(tmp_path):
    smk, log = _smk(tmp_path, batch_split=2)
    with jobs.job(smk):
        seen = dict(smk.params.finetune["train"]), smk.params.compute["batch_size"]
    assert seen == ({"batch_size": 2, "grad_accumulation": 2}, 4)
    assert "retry after running out of GPU memory" in log.read_text()
    assert not cluster.gpu_oom_logged(log)
    usage = json.loads(log.with_name("precise.usage.json").read_text())
    assert usage["ok"] is True and usage["batch_split"] == 2 and usage["wall_s"] >= 0


def test_the_cluster_module_reads_no_heavy_package_while_the_workflow_parses():
    code = ("import sys, arithmech.tools.cluster, arithmech.jobs; "
            "print(sorted(m for m in ('numpy', 'pandas', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def submit_string(resources: dict, threads: int = 2) -> str:
    """The sbatch command snakemake-executor-plugin-slurm generates for a job with these resources (under the
    names the rules give them: workflow/rules/common.smk's gpu_resources), with its own functions."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    names = {"gpus": "gpu", "gpu_model": "gpu_model", "mem_mb": "mem_mb", "runtime": "runtime",
             "cpus_per_gpu": "cpus_per_gpu"}
    job = SimpleNamespace(threads=threads, resources=Namedlist(
        fromdict={names[k]: v for k, v in resources.items() if k in names and v is not None}))
    params = {"run_uuid": "u", "slurm_logfile": "log", "comment_str": "c", "account": "-A proj42",
              "partition": "-p gpu", "workdir": "/w"}
    return get_submit_command(job, params) + set_gres_string(job)


def test_a_job_with_several_gpus_asks_for_cpus_per_gpu_and_one_task():
    """Fine-tuning on 3 GPUs runs 3 processes inside one Slurm task: the plugin's own submit string asks for
    the GPUs and 2 CPUs per GPU, and no --ntasks-per-gpu (which would allocate 3 tasks the job step never
    starts); a one-GPU job keeps --cpus-per-task of the rule's threads."""
    first = cluster.retry_resources(cluster.job_resources({**MODEL, "finetune": {"gpus": 3}}, "finetune"), 1, False)
    assert first["cpus_per_gpu"] == cluster.CPUS_PER_GPU == 2
    call = submit_string(first)
    assert "--gpus=a100:3" in call and "--cpus-per-gpu=2" in call
    assert "--ntasks" not in call and "--cpus-per-task" not in call
    assert "--mem 64000" in call and "-t 120" in call
    one = submit_string(cluster.retry_resources(cluster.job_resources(MODEL, "evaluate"), 1, False))
    assert "--gpus=a100:1" in one and "--cpus-per-task=2" in one and "--cpus-per-gpu" not in one


def test_gpu_settings_hand_the_rules_gpus_and_runtime_to_the_launcher():
    smk = SimpleNamespace(resources=Namedlist(fromdict={"gpu": 3, "runtime": 240}), threads=2,
                          params=Namedlist(fromdict={"compute": {"device": "auto"}}))
    assert jobs.gpu_settings(smk) == {"gpus": 3, "nodes": 1, "device": "auto", "timeout_s": 14400.0}
    local = SimpleNamespace(resources=Namedlist(fromdict={}), threads=1, params=Namedlist(fromdict={}))
    assert jobs.gpu_settings(local) == {"gpus": 1, "nodes": 1, "device": "auto", "timeout_s": None}

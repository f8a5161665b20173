"""What a job asks a cluster for (arithmech.tools.cluster) and what a job does about it (arithmech.jobs): per-rule
resources, the retry after running out of GPU or host memory, the batch split, and the job's usage record.
The submissions themselves, against a real Slurm, are in tests/workflow/test_slurm.py."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake.iocontainers import Namedlist

from arithmech import jobs
from arithmech.tools import cluster
from helpers import ROOT

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
    assert cluster.retry_resources(first, 1, None)["batch_split"] == 1
    second = cluster.retry_resources(first, 2, cluster.GPU_OOM)
    third = cluster.retry_resources(first, 3, cluster.GPU_OOM)
    assert (second["batch_split"], second["mem_mb"], second["runtime"]) == (2, 128000, 240)
    assert (third["batch_split"], third["mem_mb"], third["runtime"]) == (4, 128000, 360)


def test_another_failure_asks_for_more_host_memory_and_time_not_a_smaller_batch():
    first = cluster.job_resources(MODEL, "knockout")
    second = cluster.retry_resources(first, 2, cluster.FAILED)
    assert (second["batch_split"], second["mem_mb"], second["runtime"]) == (1, 128000, 240)
    # attempt 1 never splits, whatever an old log says
    assert cluster.retry_resources(first, 1, cluster.GPU_OOM) == first | {"batch_split": 1}


def test_a_job_that_completed_in_a_failed_group_keeps_its_memory():
    """The job completed inside a group that failed for another of its jobs: nothing says it needs more memory, so
    the retry asks for its first memory and batch; only its time grows (a group that ran out of time needs more for
    each of its jobs)."""
    first = cluster.job_resources(MODEL, "evaluate")
    assert cluster.retry_resources(first, 2, cluster.COMPLETED) == first | {"batch_split": 1, "runtime": 120}
    assert cluster.retry_resources(first, 3, cluster.COMPLETED)["mem_mb"] == first["mem_mb"]


def test_after_a_submission_sbatch_refused_the_retry_asks_for_what_it_asked(monkeypatch, tmp_path):
    """sbatch refused attempt 2 (a QOS submit limit: the plugin reports it as the job's failure, and Snakemake
    retries it; arithmech.tools.slurm_plugin records it): attempt 3 asks for what attempt 2 asked for, not for three
    times the memory. Attempt 1 was killed for host memory."""
    monkeypatch.setattr(cluster, "FAILURES", {})
    log = str(tmp_path / "knockout.log")
    first = cluster.job_resources(MODEL, "knockout")
    cluster.FAILURES[(log, 1)] = cluster.HOST_OOM
    cluster.FAILURES[(log, 2)] = cluster.REFUSED
    assert cluster.attempt_resources(first, log, 3) == cluster.attempt_resources(first, log, 2)
    assert cluster.attempt_resources(first, log, 2)["mem_mb"] == 2 * first["mem_mb"]
    cluster.FAILURES[(log, 1)] = cluster.REFUSED  # refused from the start: the first request, however many times
    assert cluster.attempt_resources(first, log, 3) == cluster.attempt_resources(first, log, 1) == first | {
        "batch_split": 1}


@pytest.mark.parametrize("causes, mem, runtime, split", [
    ([cluster.CANCELLED], 1, 1, 1),  # cancelled or preempted: the same again
    ([cluster.CANCELLED, cluster.CANCELLED], 1, 1, 1),
    ([cluster.HOST_OOM], 2, 1, 1),  # killed for host memory: more memory only
    ([cluster.TIMEOUT], 1, 2, 1),  # out of time: more time only
    ([cluster.GPU_OOM], 1, 2, 2),  # out of GPU memory: a split batch (which takes longer)
    ([cluster.ERROR], 1, 1, 1),  # an error of the job's own: more would not help
    ([cluster.COMPLETED], 1, 1, 1),  # completed in a group that failed for another job
    ([cluster.FAILED], 2, 2, 1),  # no word why: more of both, to be safe
    ([cluster.HOST_OOM, cluster.CANCELLED, cluster.TIMEOUT], 2, 2, 1),  # what the earlier attempts needed, kept
    ([cluster.GPU_OOM, cluster.CANCELLED, cluster.GPU_OOM], 1, 3, 4),
])
def test_a_retry_asks_for_more_only_where_more_helps(monkeypatch, causes, mem, runtime, split):
    monkeypatch.setattr(cluster, "FAILURES", {})
    first = cluster.job_resources(MODEL, "knockout")
    for attempt, cause in enumerate(causes, start=1):
        cluster.FAILURES[("job.log", attempt)] = cause
    asked = cluster.attempt_resources(first, "job.log", len(causes) + 1)
    assert asked == first | {"mem_mb": mem * first["mem_mb"], "runtime": runtime * first["runtime"],
                             "batch_split": split}


def test_without_a_recorded_cause_the_retry_goes_by_the_last_attempts_files(monkeypatch, tmp_path):
    """A local run or a cluster job's own Snakemake (which caps every value at what its submission asked for) has no
    record: what the files say (retry_resources), as for a job killed before it opened its log."""
    monkeypatch.setattr(cluster, "FAILURES", {("job.log", 1): cluster.CANCELLED})
    first = cluster.job_resources(MODEL, "knockout")
    log = tmp_path / "knockout.log"
    assert cluster.attempt_resources(first, log, 2) == cluster.retry_resources(first, 2, cluster.FAILED)
    # a cause recorded for attempt 1 only: attempt 3 goes by the files too
    assert cluster.attempt_resources(first, "job.log", 3) == cluster.retry_resources(first, 3, cluster.FAILED)


@pytest.mark.parametrize("states, cause", [
    (["CANCELLED by 0", "CANCELLED", "CANCELLED"], cluster.CANCELLED),
    (["PREEMPTED", "CANCELLED"], cluster.CANCELLED),
    (["NODE_FAIL"], cluster.CANCELLED),
    (["TIMEOUT", "CANCELLED", "COMPLETED"], cluster.TIMEOUT),
    (["FAILED", "OUT_OF_MEMORY", "OUT_OF_MEMORY"], cluster.HOST_OOM),  # a step killed for memory, the job FAILED
    (["OUT_OF_MEMORY"], cluster.HOST_OOM),
    (["FAILED", "FAILED", "COMPLETED"], cluster.ERROR),
    ([], None),  # sacct did not answer
])
def test_slurms_word_on_a_failed_job(states, cause):
    assert cluster.slurm_cause(states) == cause


@pytest.mark.parametrize("slurm, files, cause", [
    (cluster.CANCELLED, cluster.FAILED, cluster.CANCELLED),
    (cluster.TIMEOUT, cluster.COMPLETED, cluster.TIMEOUT),  # a group's time is the sum of its jobs'
    (cluster.HOST_OOM, cluster.COMPLETED, cluster.COMPLETED),  # another job of its group was killed for memory
    (cluster.HOST_OOM, cluster.FAILED, cluster.HOST_OOM),
    (cluster.ERROR, cluster.HOST_OOM, cluster.HOST_OOM),  # the job's own mark: Python's MemoryError
    (None, cluster.HOST_OOM, cluster.HOST_OOM),
    (cluster.CANCELLED, cluster.GPU_OOM, cluster.GPU_OOM),
    (cluster.ERROR, cluster.FAILED, cluster.ERROR),  # Slurm saw an exit with an error, nothing killed it
    (None, cluster.FAILED, cluster.FAILED),
])
def test_a_failures_cause_from_slurm_and_the_jobs_files(slurm, files, cause):
    assert cluster.failure_cause(slurm, files) == cause


def _attempt(tmp_path, body=None, *, raises=None, batch_split=1):
    """One attempt of a job through `jobs.job` (its log and usage record under tmp_path); `raises`: it fails so."""
    smk, log = _smk(tmp_path, batch_split=batch_split)
    try:
        with jobs.job(smk):
            if raises is not None:
                raise raises
    except type(raises):
        pass
    return log


def test_the_previous_attempt_is_read_from_the_jobs_own_files(tmp_path):
    log = tmp_path / "logs/finetune/precise.log"
    assert cluster.previous_attempt(log) == cluster.FAILED  # killed before it opened its log
    assert cluster.previous_attempt(_attempt(tmp_path)) == cluster.COMPLETED
    assert cluster.previous_attempt(_attempt(tmp_path, raises=ValueError("bad"))) == cluster.FAILED
    oom = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert cluster.previous_attempt(_attempt(tmp_path, raises=oom)) == cluster.GPU_OOM
    assert cluster.previous_attempt(_attempt(tmp_path, raises=MemoryError())) == cluster.HOST_OOM
    # killed for host memory or time: its log is written again, its usage record is an earlier run's
    log = _attempt(tmp_path)
    record = jobs.usage_path(log)
    os.utime(record, (record.stat().st_mtime - 60,) * 2)
    log.write_text("started, then killed\n")
    assert cluster.previous_attempt(log) == cluster.FAILED
    record.write_text("not json")
    assert cluster.previous_attempt(log) == cluster.FAILED


def test_requests_from_the_plan_follow_its_estimate_with_headroom_a_floor_and_the_configs_ceiling():
    small = cluster.planned_request(host_bytes=1e9, seconds=30)
    assert small == cluster.FLOOR
    big = cluster.planned_request(host_bytes=20e9, seconds=600)
    assert big == {"mem_mb": math.ceil(cluster.HEADROOM["mem_mb"] * 20000),
                   "runtime": math.ceil(cluster.HEADROOM["runtime"] * 10)}
    assert cluster.job_resources(MODEL, "knockout", big)["mem_mb"] == big["mem_mb"] < MODEL["mem_mb"]
    # the config's values are the ceiling
    huge = cluster.planned_request(host_bytes=200e9, seconds=36000)
    assert cluster.job_resources(MODEL, "evaluate", huge) == cluster.job_resources(MODEL, "evaluate")


def test_a_requests_file_is_used_only_for_the_configuration_it_was_planned_for(tmp_path):
    config = {"models": {"m": {"resources": MODEL}}, "seed": 0, "slurm": {"requests": None}}
    assert cluster.load_requests(config) == {}
    path = tmp_path / "requests.json"
    estimates = {"m": {"knockout": {"host_bytes": 20e9, "seconds": 600}}}
    path.write_text(json.dumps({"config_digest": cluster.config_digest(config), "config_files": ["a.yaml"],
                                "estimates": estimates}))
    config["slurm"] = {"requests": str(path), "account": "proj42"}  # the slurm block is not part of the digest
    assert cluster.load_requests(config) == {"m": {"knockout": cluster.planned_request(20e9, 600)}}
    changed = {**config, "seed": 1}
    with pytest.raises(cluster.ClusterSettingError, match=r"slurm.requests=.*requests.json was planned for another "
                                                          r"configuration \(a.yaml; digest"):
        cluster.load_requests(changed)
    config["slurm"]["requests"] = str(tmp_path / "missing.json")
    with pytest.raises(cluster.ClusterSettingError, match=r"slurm.requests=.*missing.json: cannot read the plan's "
                                                          r"requests .*make plan"):
        cluster.load_requests(config)


def test_snakemake_combines_a_groups_jobs_one_after_the_other_on_one_gpu():
    """What Snakemake 9 asks for a group job of the SLURM profile's groups (`GroupResources.basic_layered`, as
    `GroupJob.resources` calls it for a cluster): with the profile's `gpu_slot` (one for each grouped rule's job,
    `set-resources`; one a submission, `resources`) its jobs run one at a time, so the group asks for 1 GPU, one
    node, the largest memory and the sum of the runtimes; without it the jobs of one level would be summed (4 GPUs,
    4 nodes: an allocation no node may hold)."""
    from snakemake.resources import GroupResources, Resources

    profile = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["resources"] == ["gpu_slot=1"] and profile["set-resource-scopes"] == ["gpu_slot=local"]
    grouped = {item.split("=")[0] for item in profile["groups"]}
    assert {f"{rule}:gpu_slot=1" for rule in grouped} == set(profile["set-resources"])

    def job(mem_mb, runtime):
        first = cluster.retry_resources(cluster.job_resources({**MODEL, "mem_mb": mem_mb, "runtime": runtime},
                                                              "build_pairs"), 1, None)
        res = {k: v for k, v in cluster.rule_resources(first).items() if isinstance(v, int)}
        return SimpleNamespace(resources=res | {"_cores": 2, "_nodes": 1, "gpu_slot": 1}, pipe_group=None)

    levels = [[job(20000, 10), job(26000, 12), job(20000, 10), job(20000, 10)], [job(27000, 10)]]

    def combined(resources):
        constraints = Resources.parse(resources, allow_expressions=False)
        constraints["_cores"], constraints["_nodes"] = None, 100
        return GroupResources.basic_layered(levels, constraints, run_local=False, additive_resources=["runtime"],
                                            sortby=["runtime"])

    grouped = combined(profile["resources"])
    assert (grouped["gpu"], grouped["nodes"], grouped["mem_mb"], grouped["runtime"], grouped["_cores"]) == (
        1, 1, 27000, 52, 2)
    alone = combined([])
    assert (alone["gpu"], alone["nodes"], alone["mem_mb"]) == (4, 4, 86000)


def test_account_and_partitions_are_passed_only_when_set():
    assert cluster.slurm_settings({}, gpu=True) == {} and cluster.slurm_settings(None, gpu=True) == {}
    assert cluster.slurm_settings({"account": None}, gpu=True) == {}
    settings = {"account": "proj42", "partition": "gpu", "cpu_partition": "cpu"}
    assert cluster.slurm_settings(settings, gpu=True) == {"slurm_account": "proj42", "slurm_partition": "gpu"}
    assert cluster.slurm_settings(settings, gpu=False) == {"slurm_account": "proj42", "slurm_partition": "cpu"}
    assert cluster.cpu_jobs_local({}) and cluster.cpu_jobs_local(None) and not cluster.cpu_jobs_local(settings)
    # Slurm's own input variables are not read (an exported SLURM_PARTITION also steers every interactive srun)
    assert cluster.former_variables({"SLURM_PARTITION": "gpu", "PATH": "/bin"}) == [
        "SLURM_PARTITION is set and is not read by the workflow (it is Slurm's own input variable): jobs go where "
        "slurm.partition says"]


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
    log.parent.mkdir(parents=True, exist_ok=True)
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


def submit_string(model: dict, rule: str, threads: int = 2) -> str:
    """The sbatch command snakemake-executor-plugin-slurm generates for a first attempt of `rule` with `model`'s
    resources, as the rules hand them to it (cluster.rule_resources, workflow/rules/common.smk's gpu_resources:
    None is not passed), with the plugin's own functions."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(threads=threads, resources=Namedlist(fromdict=rule_resources(model, rule)))
    params = {"run_uuid": "u", "slurm_logfile": "log", "comment_str": "c", "account": "-A proj42",
              "partition": "-p gpu", "workdir": "/w"}
    return get_submit_command(job, params) + set_gres_string(job)


def rule_resources(model: dict, rule: str) -> dict:
    """A first attempt's resources under the rule's names, without the unset ones (Snakemake drops None)."""
    first = cluster.retry_resources(cluster.job_resources(model, rule), 1, None)
    return {k: v for k, v in cluster.rule_resources(first).items() if v is not None}


def test_a_job_with_several_gpus_asks_for_cpus_per_gpu_and_one_task():
    """Fine-tuning on 3 GPUs runs 3 processes inside one Slurm task: the plugin's own submit string asks for
    the GPUs and 2 CPUs per GPU, and no --ntasks-per-gpu (which would allocate 3 tasks the job step never
    starts), on one node (--nodes=1: without it Slurm may spread the GPUs over nodes, and the plugin's job step
    asks for one); a one-GPU job keeps --cpus-per-task of the rule's threads."""
    three = {**MODEL, "finetune": {"gpus": 3}}
    assert cluster.job_resources(three, "finetune")["cpus_per_gpu"] == cluster.CPUS_PER_GPU == 2
    call = submit_string(three, "finetune")
    assert "--gpus=a100:3" in call and "--cpus-per-gpu=2" in call
    assert "--ntasks" not in call and "--cpus-per-task" not in call and "--nodes=1" in call.split()
    assert "--mem 64000" in call and "-t 120" in call
    one = submit_string(MODEL, "evaluate")
    assert "--gpus=a100:1" in one and "--cpus-per-task=2" in one and "--cpus-per-gpu" not in one
    assert "--nodes=1" in one.split()
    assert "mpi" not in rule_resources(three, "finetune")  # one node: the plugin's job step is `srun -n1`


TWO_NODES = {**MODEL, "finetune": {"gpus": 4, "nodes": 2, "mem_mb": 128000}}


def test_a_fine_tuning_job_over_two_nodes_asks_for_two_gpus_and_two_tasks_on_each():
    """gpus 4 over nodes 2: the plugin's own submit string asks for 2 nodes, 2 GPUs on each (--gres, per node:
    --gpus=4 would count over the job and may place 3 + 1), 2 tasks a node and 2 CPUs per GPU; `mpi` makes the
    plugin's job step run the job's process in the batch script, which starts the tasks itself (one srun task
    per GPU, tests/sft/test_distributed.py)."""
    call = submit_string(TWO_NODES, "finetune")
    for flag in ("--nodes=2", "--ntasks-per-node=2", "--gres=gpu:a100:2", "--cpus-per-gpu=2", "--mem 128000",
                 "-t 120", "-A proj42", "-p gpu"):
        assert flag in call.split() or f" {flag} " in f" {call} ", flag
    assert "--gpus" not in call and "--ntasks-per-gpu" not in call and "--ntasks=" not in call
    assert rule_resources(TWO_NODES, "finetune")["mpi"] == "srun"
    untyped = submit_string({**TWO_NODES, "gpu_model": None}, "study_train")
    assert "--gres=gpu:2" in untyped and "--nodes=2" in untyped
    # the other rules of the model stay on one node
    evaluate = submit_string(TWO_NODES, "evaluate")
    assert "--nodes=1" in evaluate.split() and "--gpus=a100:1" in evaluate
    assert "mpi" not in rule_resources(TWO_NODES, "evaluate")


def test_the_training_job_reads_its_gpus_and_nodes_from_those_resources():
    """The job's launcher (jobs.gpu_settings -> run_on_gpus) sees 4 GPUs over 2 nodes; a retry keeps them."""
    smk = SimpleNamespace(resources=Namedlist(fromdict=rule_resources(TWO_NODES, "finetune")),
                          params=Namedlist(fromdict={"compute": {"device": "auto"}}))
    assert jobs.gpu_settings(smk) == {"gpus": 4, "nodes": 2, "device": "auto", "timeout_s": 7200.0}
    retry = cluster.rule_resources(cluster.retry_resources(cluster.job_resources(TWO_NODES, "finetune"), 2,
                                                           cluster.GPU_OOM))
    assert (retry["nodes"], retry["tasks_per_node"], retry["gres"], retry["batch_split"]) == (2, 2, "gpu:a100:2", 2)


@pytest.mark.parametrize("resources, rule, message", [
    ({**MODEL, "nodes": 2}, "patch_layer",
     "models.m.resources.nodes is 2, and it applies to rule patch_layer, which runs in one process"),
    ({**MODEL, "finetune": {"nodes": 2}}, "finetune",  # gpus from the model's own: 1
     "models.m.resources.finetune: gpus (1, the job's GPUs over all its nodes) is not a multiple of nodes (2)"),
    ({**MODEL, "evaluate": {"nodes": 2, "gpus": 4}}, "study_evaluate",
     "models.m.resources.evaluate.nodes is 2, and it applies to rule study_evaluate"),
    ({**MODEL, "finetune": {"gpus": 3, "nodes": 2}}, "finetune",
     "models.m.resources.finetune: gpus (3, the job's GPUs over all its nodes) is not a multiple of nodes (2)"),
    ({**MODEL, "finetune": {"gpus": 2, "nodes": 2}}, "study_train",
     "models.m.resources.finetune: gpus 2 over nodes 2 is 1 GPU a node; a job over several nodes needs at least 2"),
])
def test_nodes_a_job_cannot_use_are_refused_naming_the_key(resources, rule, message):
    with pytest.raises(cluster.ResourceError) as err:
        cluster.check_nodes("m", resources, rule)
    assert message in str(err.value)


def test_nodes_where_they_serve_pass_the_check():
    for rule in ("finetune", "study_train", "evaluate", "patch_layer"):
        cluster.check_nodes("m", TWO_NODES, rule)
        cluster.check_nodes("m", {**TWO_NODES, "nodes": 1}, rule)


def test_the_schema_takes_nodes_in_a_models_resources_and_refuses_nonsense():
    """`nodes` is an optional integer >= 1 in models.<name>.resources and its blocks (config.schema.yaml)."""
    import yaml
    from jsonschema import Draft202012Validator

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    resources = schema["properties"]["models"]["additionalProperties"]["properties"]["resources"]
    validator = Draft202012Validator({**resources, "$defs": schema["$defs"]})
    assert not list(validator.iter_errors(TWO_NODES | {"gpu_model": "a100"}))
    assert not list(validator.iter_errors({"gpus": 1, "mem_mb": 1, "runtime": 1, "nodes": 1}))
    for bad, where in [({"nodes": 0}, ["finetune", "nodes"]), ({"nodes": 1.5}, ["finetune", "nodes"]),
                       ({"nodes": "2"}, ["finetune", "nodes"])]:
        errors = list(validator.iter_errors({**MODEL, "finetune": {"gpus": 4, **bad}}))
        assert [list(e.absolute_path) for e in errors] == [where], bad
    assert list(validator.iter_errors({**MODEL, "nodes": 0}))


def test_gpu_settings_hand_the_rules_gpus_and_runtime_to_the_launcher():
    smk = SimpleNamespace(resources=Namedlist(fromdict={"gpu": 3, "runtime": 240}), threads=2,
                          params=Namedlist(fromdict={"compute": {"device": "auto"}}))
    assert jobs.gpu_settings(smk) == {"gpus": 3, "nodes": 1, "device": "auto", "timeout_s": 14400.0}
    local = SimpleNamespace(resources=Namedlist(fromdict={}), threads=1, params=Namedlist(fromdict={}))
    assert jobs.gpu_settings(local) == {"gpus": 1, "nodes": 1, "device": "auto", "timeout_s": None}


def dry_run(tmp_path: Path, resources: dict) -> str:
    """The workflow's dry run for the SLURM executor (no SLURM binaries needed), on the tiny configuration with
    these model resources: the jobs with the resources the rules give them, or the error."""
    import shutil

    import yaml

    shutil.copy2(ROOT / "config.yaml", tmp_path / "config.yaml")  # what `configfile:` reads, as in a checkout
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"models": {"tiny": {"resources": resources}}}))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--executor", "slurm", "--jobs", "2", "--dry-run", "--configfile", str(ROOT / "tests/config/tiny.yaml"),
           "overlay.yaml"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    return proc.stdout + proc.stderr


def test_the_workflow_gives_a_two_node_fine_tuning_job_its_resources_and_refuses_nodes_elsewhere(tmp_path):
    """The rules themselves (common.smk's gpu_resources): finetune and study_train over 2 nodes as the plugin's
    MPI job with GPUs per node, every other model rule on one node (nodes 1); `nodes` at the model's level fails the
    parse, naming the key, before any job is planned."""
    log = dry_run(tmp_path, {"gpus": 1, "mem_mb": 8000, "runtime": 30, "finetune": {"gpus": 4, "nodes": 2}})
    seen = {}  # rule -> the resources of its jobs, as the dry run prints them (key=value, ...)
    for block in log.split("\nrule ")[1:]:
        line = next(ln for ln in block.splitlines() if ln.strip().startswith("resources:"))
        pairs = dict(item.split("=", 1) for item in line.split(":", 1)[1].strip().split(", "))
        seen.setdefault(block.split(":", 1)[0], []).append(pairs)
    assert {"finetune", "study_train", "evaluate", "knockout"} <= set(seen), log[-3000:]
    for rule, found in seen.items():
        for res in found:
            if rule in ("finetune", "study_train"):
                assert (res["gres"], res["nodes"], res["tasks_per_node"], res["mpi"], res["cpus_per_gpu"]) == (
                    "gpu:2", "2", "2", "srun", "2") and "gpu" not in res, (rule, res)
            else:
                assert not {"mpi", "gres", "tasks_per_node"} & set(res), (rule, res)
                assert res.get("nodes") == ("1" if "gpu" in res else None), (rule, res)  # a GPU job: one node
    bad = dry_run(tmp_path, {"gpus": 1, "mem_mb": 8000, "runtime": 30, "nodes": 2})
    assert "models.tiny.resources.nodes is 2, and it applies to rule" in bad, bad[-3000:]
    assert "Job stats" not in bad



def test_the_cluster_check_runs_slurms_clients_in_the_environment_it_is_given(tmp_path):
    """Stand-in `sinfo`/`sacctmgr` scripts that answer only when the environment they run in has SLURM_CONF
    (the variable the SLURM plugin deletes inside an allocation): the check must pass them the environment the
    workflow saw while parsing, not the process's own at the time of the check."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, answer in {"sinfo": "gpu\ncpu", "sacctmgr": "proj42"}.items():
        (bin_dir / name).write_text(f'#!/bin/sh\n[ -n "$SLURM_CONF" ] || exit 1\nprintf "{answer}\\n"\n')
        (bin_dir / name).chmod(0o755)
    seen = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_CONF": "/etc/slurm/site.conf", "USER": "me"}
    assert cluster.check_slurm({"partition": "gpu", "account": "proj42"}, seen) == []
    with pytest.raises(cluster.ClusterSettingError, match="slurm.partition=nope: no such partition on this cluster; "
                                                          "partitions: cpu, gpu"):
        cluster.check_slurm({"partition": "nope"}, seen)
    stripped = {k: v for k, v in seen.items() if k != "SLURM_CONF"}
    assert cluster.check_slurm({"partition": "nope"}, stripped) == [
        "sinfo did not answer: partitions not checked", "sacctmgr did not answer: account not checked"]


@pytest.mark.parametrize("name", ["a100", "A100_80GB", "h100.sxm", "a100-sxm4-80gb", "nvidia-a100", "a 100",
                                  "tesla:v100", "'a100'"])
def test_gpu_model_takes_exactly_the_names_the_slurm_plugin_submits(config, name):
    """A gpu_model the plugin refuses (Slurm's auto-detected type names often hold '-') fails every GPU job at
    submission, each retried: the config check refuses it first, naming the key, with the plugin's own rule (its
    set_gres_string, which this compares with)."""
    from snakemake.exceptions import WorkflowError
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    from arithmech.config import ConfigError, validate_config

    try:
        set_gres_string(SimpleNamespace(resources=Namedlist(fromdict={"gpu": 1, "gpu_model": name})))
        plugin_takes = True
    except WorkflowError:
        plugin_takes = False
    config["models"]["smollm2-135m"]["resources"]["finetune"] = {"gpu_model": name}
    try:
        validate_config(config, ROOT / "workflow/schemas/config.schema.yaml")
        config_takes = True
    except ConfigError as err:
        config_takes = False
        assert f"config key 'models.smollm2-135m.resources.finetune.gpu_model': {name!r} is not a GPU model the " \
               "SLURM plugin submits" in str(err)
    assert config_takes == plugin_takes, name


def _gpu_job(tmp_path, device="auto", **resources):
    smk, log = _smk(tmp_path)
    smk.params["compute"]["device"] = device
    smk.resources = Namedlist(fromdict={"batch_split": 1, "gpu": 1, "nodes": 1, **resources})
    return smk, log


def test_a_slurm_job_that_asked_for_gpus_and_sees_none_stops_at_once_naming_the_cpu_build(tmp_path, monkeypatch):
    """Before: `device: auto` took the CPU (a 7B model in float32 on 2 CPUs until the time limit, then retried).
    The check needs no model: the job stops before its work starts, with the causes in its log."""
    import torch

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    smk, log = _gpu_job(tmp_path)
    ran = []
    with pytest.raises(jobs.NoGpuError):
        with jobs.job(smk):
            ran.append(True)
    text = log.read_text()
    assert not ran and "rule finetune asked for GPUs and sees none (compute.device: auto)" in text
    assert "is a CPU build (torch.version.cuda is None)" in text and "CUDA_VISIBLE_DEVICES is unset" in text
    assert "set compute.device: cpu" in text
    over_nodes, _ = _gpu_job(tmp_path / "gres", gpu=None, gres="gpu:a100:2", nodes=2)  # GPUs asked for as a gres
    with pytest.raises(jobs.NoGpuError):
        jobs.check_gpus_visible(over_nodes)


def test_a_cuda_build_that_sees_no_gpu_names_the_driver(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(jobs.NoGpuError) as err:
        jobs.check_gpus_visible(_gpu_job(tmp_path)[0])
    assert "built for CUDA 12.8 and sees none of the GPUs 0,1: the node's NVIDIA driver may be older" in str(err.value)
    assert "CPU build" not in str(err.value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(jobs.NoGpuError, match="Slurm gave the job no GPU \\(CUDA_VISIBLE_DEVICES is empty\\)"):
        jobs.check_gpus_visible(_gpu_job(tmp_path / "empty")[0])


def test_device_cpu_a_local_run_and_a_cpu_job_still_compute_on_the_cpu(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    jobs.check_gpus_visible(_gpu_job(tmp_path, device="cpu")[0])  # asked for explicitly
    jobs.check_gpus_visible(_gpu_job(tmp_path / "cpu-job", gpu=None)[0])  # a CPU rule's job
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    with jobs.job(_gpu_job(tmp_path / "local")[0]):  # a local run: the resources are ignored
        pass


# What `sinfo -h -o "%P|%G"` printed: the test Slurm (tests/slurm: one node, 2 GPUs as a GRES), and a site's
# partitions of 4- and 8-GPU nodes with typed GPUs, their sockets and other generic resources.
SINFO_TEST_SLURM = ["gpu*|gpu:2", "cpu|gpu:2"]
SINFO_SITE = ["gpu*|gpu:a100:4(S:0-1)", "big|gpu:h100:8(S:0,1),mps:800", "big|gpu:h100:4(S:0)", "cpu|(null)"]


@pytest.mark.parametrize("gres, gpu_model, gpus", [
    ("gpu:2", None, 2), ("gpu:a100:4(S:0-1)", None, 4), ("gpu:a100:4(S:0-1)", "a100", 4),
    ("gpu:a100:4(S:0-1)", "h100", 0), ("gpu:h100:8(S:0,1),mps:800", None, 8), ("gpu:h100:8(S:0,1)", "h100", 8),
    ("gpu:a100:2,gpu:v100:4", "v100", 4), ("gpu:a100:2,gpu:v100:4", None, 6), ("(null)", None, 0),
])
def test_node_gpus_reads_sinfos_generic_resources(gres, gpu_model, gpus):
    assert cluster.node_gpus(gres, gpu_model) == gpus


def _sinfo(monkeypatch, rows):
    monkeypatch.setattr(cluster, "_query", lambda cmd, environ=None: rows if cmd[0] == "sinfo" else None)


def test_a_gpu_count_no_node_holds_stops_the_run_naming_the_key(monkeypatch):
    """On the test Slurm's 2-GPU node 3 GPUs never run; one message for all, naming each key."""
    _sinfo(monkeypatch, SINFO_TEST_SLURM)
    with pytest.raises(cluster.ResourceError) as err:
        cluster.check_node_gpus({"tiny": {"gpus": 1, "finetune": {"gpus": 3}}, "other": {"gpus": 4}}, None)
    assert str(err.value) == (
        "GPUs a node: models.tiny.resources.finetune.gpus asks for 3 GPUs on a node, and no node of partition gpu "
        "holds more than 2 (sinfo: gpu:2): lower it, or spread fine-tuning over nodes (finetune: nodes); "
        "models.other.resources.gpus asks for 4 GPUs on a node, and no node of partition gpu holds more than 2 "
        "(sinfo: gpu:2): lower it")
    assert cluster.check_node_gpus({"tiny": {"gpus": 1, "finetune": {"gpus": 2}}}, "cpu") == []


def test_gpus_a_node_count_the_partitions_largest_node_of_the_type_asked_for(monkeypatch):
    """The shipped 13B block before (5 GPUs) fits no 4-GPU node; 4 do (config.yaml), and 5 fit a partition with an
    8-GPU node; a job over nodes counts its GPUs a node; a typed GPU counts only that type."""
    _sinfo(monkeypatch, SINFO_SITE)
    with pytest.raises(cluster.ResourceError, match="models.13b.resources.finetune.gpus asks for 5 GPUs on a node, "
                       "and no node of partition gpu holds more than 4"):
        cluster.check_node_gpus({"13b": {"gpus": 1, "finetune": {"gpus": 5}}}, None)
    shipped = yaml.safe_load((ROOT / "config.yaml").read_text())["models"]
    assert cluster.check_node_gpus({name: model["resources"] for name, model in shipped.items()}, None) == []
    assert cluster.check_node_gpus({"13b": {"gpus": 1, "finetune": {"gpus": 5}}}, "big") == []
    assert cluster.check_node_gpus({"13b": {"gpus": 1, "finetune": {"gpus": 8, "nodes": 2}}}, "gpu") == []
    with pytest.raises(cluster.ResourceError, match="models.7b.resources.gpus asks for 1 GPU of type a100 on a "
                       "node, and no node of partition big holds more than 0"):
        cluster.check_node_gpus({"7b": {"gpus": 1, "gpu_model": "a100"}}, "big")
    assert cluster.check_node_gpus({"7b": {"gpus": 1}}, "nope") == []  # an unknown partition: check_slurm's
    _sinfo(monkeypatch, None)
    assert cluster.check_node_gpus({"7b": {"gpus": 9}}, None) == ["sinfo did not answer: GPUs per node not checked"]


def test_a_cluster_run_asking_for_gpus_with_a_cpu_torch_stops_before_any_job(monkeypatch):
    """The onstart check (Snakefile) reads the jobs' torch without importing it: here a CPU build."""
    from types import SimpleNamespace as Method

    from arithmech import software

    build = software.torch_build()
    assert build["cuda"] is None and build["__version__"] == __import__("torch").__version__  # this host's
    with pytest.raises(software.JobSoftwareError, match=r"whose torch .* is a CPU build \(torch.version.cuda is "
                       r"None\), and the run asks for GPUs \(compute.device: auto\)"):
        software.check_gpu_build([], "auto")
    software.check_gpu_build([], "cpu")  # asked for the CPU
    software.check_gpu_build([Method(name="CONDA")], "auto")  # the jobs' torch is the conda env's
    monkeypatch.setattr(software, "torch_build", lambda: {"__version__": "2.13.0", "cuda": "12.8", "hip": None})
    software.check_gpu_build([], "auto")


def test_a_model_without_gpus_asks_for_none_and_computes_on_the_cpu(tmp_path, monkeypatch):
    """`gpus: 0` (the model's own or a block's) passes the configuration check; the job asks the plugin for no GPU
    (gpu 0: no --gpus, --cpus-per-task) and, in a Slurm job, hides the node's GPUs from torch so that `compute.device:
    auto` takes the CPU; a local run and a job that asked for GPUs are left alone."""
    from arithmech.config import validate_config

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["models"]["smollm2-135m"]["resources"] |= {"gpus": 0, "finetune": {"gpus": 0}, "evaluate": {"gpus": 0}}
    validate_config(config, ROOT / "workflow/schemas/config.schema.yaml")
    on_cpu = {"gpus": 0, "mem_mb": 3000, "runtime": 30}
    assert not cluster.asks_for_gpus(on_cpu) and not cluster.asks_for_gpus(on_cpu | {"finetune": {"gpus": 0}})
    assert cluster.asks_for_gpus(on_cpu | {"finetune": {"gpus": 2}}) and cluster.asks_for_gpus(MODEL)
    asked = cluster.rule_resources(cluster.job_resources(on_cpu, "knockout"))
    assert (asked["gpu"], asked["cpus_per_gpu"], asked["nodes"]) == (0, None, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    assert not jobs.hide_gpus_not_asked_for(_gpu_job(tmp_path / "local", gpu=0)[0])
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert not jobs.hide_gpus_not_asked_for(_gpu_job(tmp_path / "gpu", gpu=1)[0])
    assert not jobs.hide_gpus_not_asked_for(_gpu_job(tmp_path / "cpu-rule", gpu=None)[0])  # no model: no torch
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    smk, log = _gpu_job(tmp_path / "cpu", gpu=0)
    with jobs.job(smk):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert "a cluster job without a GPU: it computes on the CPU" in log.read_text()

"""The plan of one configuration, put together: every job of the dry run costed by its rule's function in
`RULE_COSTS`, summed per model and rule into GPU hours and peak memory, with warnings where a job outgrows
its GPUs, its `mem_mb` or its `runtime`, and the totals. On a cluster: the Slurm allocations (the dry run's jobs in
the SLURM profile's groups), the weight loads and their time, and each rule's request (`cluster.planned_request`).

    report = plan(["configs/paper.yaml", "configs/llama2-7b.yaml"], root=Path("."))
    report["totals"]["gpu_hours"]
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from arithmech.tools.cluster import config_digest, cpu_jobs_local, job_resources, planned_request, resources_key
from arithmech.tools.plan.costmodel import DTYPE_BYTES, Model, Throughput
from arithmech.tools.plan.dryrun import (
    Job,
    checkpoint_jobs,
    load_config,
    parse_dry_run,
    profile_groups,
    snakemake_dry_run,
)
from arithmech.tools.plan.errors import PlanError
from arithmech.tools.plan.interp_rules import (
    analyze,
    build_pairs,
    cache_activations,
    discover,
    discover_shared,
    discover_union,
    edge_curve,
    edges,
    knockout,
    patch_all_layers,
    patch_layer,
    transfer,
)
from arithmech.tools.plan.jobcost import Cost, Setting, cpu_rule, local_rule, target_rule
from arithmech.tools.plan.sft_rules import evaluate, finetune, study_evaluate, study_format, study_train
from arithmech.tools.plan.shapes import model_shape
from arithmech.tools.plan.tokens import TokenCounter

# Every rule of the workflow and what one of its jobs costs (tests/tools/test_plan.py checks that every rule of
# the Snakefile and workflow/rules/*.smk has an entry).
RULE_COSTS: dict[str, Callable[[Setting, Model | None, Job], Cost]] = {
    "all": target_rule,
    "prepare_model": local_rule,
    "fetch_dataset": local_rule,
    "build_pairs": build_pairs,
    "cache_activations": cache_activations,
    "patch_all_layers": patch_all_layers,
    "patch_layer": patch_layer,
    "aggregate_effects": cpu_rule,
    "plot_effects": cpu_rule,
    "summarize_key_components": cpu_rule,
    "knockout": knockout,
    "transfer": transfer,
    "plot_knockout": cpu_rule,
    "plot_transfer": cpu_rule,
    "analyze": analyze,
    "plot_analysis": cpu_rule,
    "edges": edges,
    "edge_curve": edge_curve,
    "plot_edge_curve": cpu_rule,
    "discover": discover,
    "discover_shared": discover_shared,
    "discover_union": discover_union,
    "plot_discover": cpu_rule,
    "finetune": finetune,
    "evaluate": evaluate,
    "summarize_eval": cpu_rule,
    "study_format": study_format,
    "study_items": cpu_rule,
    "study_train": study_train,
    "study_select": cpu_rule,
    "study_evaluate": study_evaluate,
    "study_summary": cpu_rule,
    "claims": cpu_rule,
    "findings": cpu_rule,
}


def job_seconds(cost: Cost, *, throughput: Throughput, on_cpu: bool = False) -> float:
    """Seconds one GPU job holds its GPUs: its FLOPs at the throughput, or its memory reads at the bandwidth
    where those take longer (memory-bound decoding), divided over its ranks (a training job's processes, one per
    GPU; a spread model's job: one), plus the start-up. `on_cpu`: a model's job with `gpus: 0`, at the CPU's."""
    tflops, bandwidth = (throughput.cpu_tflops, throughput.cpu_bandwidth) if on_cpu else (throughput.tflops,
                                                                                            throughput.bandwidth)
    compute = cost.work.flops / (tflops * 1e12)
    reads = cost.work.reads / (bandwidth * 1e12)
    return max(compute, reads) / cost.ranks + throughput.startup_s


def load_models(config: dict, *, workdir: Path) -> dict[str, Model]:
    """The models of `run.models` with their shapes, token counters, resources and bytes per weight."""
    models = {}
    dtype = config["compute"]["dtype"]
    for name in config["run"]["models"]:
        spec = config["models"][name]
        shape, tokenizer = model_shape(name, spec["source"], workdir=workdir)
        models[name] = Model(name=name, shape=shape, tokens=TokenCounter(tokenizer), resources=spec["resources"],
                             dtype_bytes=DTYPE_BYTES[dtype])
    return models


def cost_of(s: Setting, job: Job) -> Cost:
    """The cost of one job, from its rule's entry in `RULE_COSTS`; a rule without one is marked unknown (left
    out of the totals, with a warning; tests/tools/test_plan.py fails on it)."""
    function = RULE_COSTS.get(job.rule)
    if function is None:
        return Cost(gpu=False, unknown=True,
                    note="no entry in RULE_COSTS (src/arithmech/tools/plan/planner.py): not counted")
    model = s.models.get(job.get("model", ""))
    if model is None and function not in (cpu_rule, local_rule, target_rule):
        raise PlanError(f"job {job.label} runs a model but names none of run.models")
    return function(s, model, job)


def plan(config_files: Sequence[str | Path], *, root: Path, throughput: Throughput = Throughput(),
         workdir: Path | None = None) -> dict:
    """The plan of `config_files` over root/config.yaml: per model and rule the jobs, GPU hours (per job, the
    longest, and in all), peak GPU and host memory, with warnings where a job outgrows its GPUs, its
    `mem_mb` or its `runtime`; and the totals. JSON-able."""
    if not (root / "Snakefile").is_file():
        raise PlanError(f"no Snakefile in {root}: run from the checkout or give --root")
    config = load_config(config_files, root=root)
    models = load_models(config, workdir=workdir or Path.cwd())
    groups = profile_groups(root)
    grouped = dict(item.split("=", 1) for item in groups["groups"])
    # Snakemake lists a dry run's jobs in no fixed order: sorted, the sums and the costliest of equal jobs
    # come out the same on every run
    jobs = sorted(parse_dry_run(snakemake_dry_run(config_files, root=root, groups=groups)),
                  key=lambda j: (j.rule, j.wildcards))
    jobs += checkpoint_jobs(jobs, config, {name: m.shape for name, m in models.items()}, grouped)
    setting = Setting(config, root=root, models=models)
    submitted_cpu = not cpu_jobs_local(config.get("slurm"))
    rows: dict[tuple[str, str], dict] = {}
    allocated: set[str] = set()  # the group jobs counted
    for job in jobs:
        cost = cost_of(setting, job)
        model = models.get(job.get("model", ""))
        key = (model.name if model else "", job.rule)
        if key not in rows:
            rows[key] = rule_row(key, cost, group=grouped.get(job.rule, ""))
        add_job(rows[key], job=job, cost=cost, model=model, throughput=throughput)
        # an allocation: a job sbatch submits on its own, or the first job of a group job (Snakemake submits the
        # group as one)
        if cost.gpu or (submitted_cpu and not cost.local and job.rule != "all"):
            rows[key]["submitted"] += 1
            rows[key]["allocations"] += int(not job.group or job.group not in allocated)
            if job.group:
                allocated.add(job.group)
    order = {**{name: i for i, name in enumerate(models)}, "": len(models)}
    rules = {name: i for i, name in enumerate(RULE_COSTS)}
    table = [_finish(rows[key], models, throughput)
             for key in sorted(rows, key=lambda k: (order[k[0]], rules.get(k[1], len(rules))))]
    warnings = [w for row in table for w in row["warnings"]]
    load_s = max((m.weight_bytes / (throughput.fs_gbs * 1e9) for m in models.values()), default=0.0)
    if load_s > throughput.startup_s:
        warnings.append(f"reading a model's weights takes {load_s:.0f} s at {throughput.fs_gbs:g} GB/s (--fs-gbs), "
                        f"more than the {throughput.startup_s:g} s of start-up each GPU job counts (--startup-s): "
                        "raise --startup-s")
    return {
        "config_files": ["config.yaml", *map(str, config_files)],
        "config_digest": config_digest(config),
        "throughput": asdict(throughput),
        "models": {name: _model_entry(m) for name, m in models.items()},
        "rules": table,
        "totals": _totals(table, throughput),
        "warnings": warnings,
    }


def _model_entry(m: Model) -> dict:
    return {"shape": m.shape.describe(), "shape_source": m.shape.source, "tokens": m.tokens.method,
            "dtype_bytes": m.dtype_bytes, "resources": m.resources}


def rule_row(key: tuple[str, str], cost: Cost, group: str = "") -> dict:
    """A new row of the plan for (model, rule) whose first job costs `cost`: its kind, no jobs counted yet,
    and a warning when the rule has no cost entry. `group`: the SLURM profile's group of the rule ("" none)."""
    kind = "gpu" if cost.gpu else ("local" if cost.local else ("unknown" if cost.unknown else "cpu"))
    warnings = [f"rule '{key[1]}' has no cost entry in RULE_COSTS (src/arithmech/tools/plan/planner.py): its jobs "
                f"are not in the totals"] if cost.unknown else []
    return {"model": key[0], "rule": key[1], "kind": kind, "jobs": 0, "added_jobs": 0, "gpu_hours": 0.0,
            "gpu_hours_per_job": 0.0, "cpu_hours": 0.0, "cpu_hours_per_job": 0.0, "on_cpu": False, "gpu_gb": 0.0,
            "host_gb": 0.0, "note": cost.note, "costliest": None,
            "warnings": warnings, "group": group, "submitted": 0, "allocations": 0, "weight_loads": 0,
            "host_bytes": 0.0, "seconds": 0.0, "request": None}


def add_job(row: dict, *, job: Job, cost: Cost, model: Model | None, throughput: Throughput) -> None:
    """Count one more job into its rule's row: the jobs, the GPU hours (a job holds all its GPUs), the longest
    job's hours and note, the largest memory and job time, the weight loads, and the job's warnings."""
    row["jobs"] += 1
    row["added_jobs"] += int(job.added)
    if not cost.gpu or model is None:
        return
    gpus = job_resources(model.resources, job.rule)["gpus"]
    row["on_cpu"] = on_cpu = gpus == 0  # `gpus: 0`: a CPU node's hours
    seconds = job_seconds(cost, throughput=throughput, on_cpu=on_cpu)
    hours = seconds * max(gpus, 1) / 3600  # it holds all its GPUs (or its CPUs) for its wall time
    device = "cpu" if on_cpu else "gpu"
    row[f"{device}_hours"] += hours
    row["gpu_gb"] = max(row["gpu_gb"], cost.gpu_bytes / 1e9)
    row["host_gb"] = max(row["host_gb"], cost.host_bytes / 1e9)
    row["host_bytes"] = max(row["host_bytes"], cost.host_bytes)
    row["seconds"] = max(row["seconds"], seconds)
    row["weight_loads"] += cost.weight_loads
    if row["costliest"] is None or hours > row[f"{device}_hours_per_job"]:
        row |= {f"{device}_hours_per_job": hours, "costliest": job.label, "note": cost.note}
    row["warnings"] += _warnings(job, cost, model, throughput, hours / max(gpus, 1))


def _warnings(job: Job, cost: Cost, model: Model, throughput: Throughput, hours: float) -> list[str]:
    """What one GPU job outgrows: its GPUs' memory, the job's memory request, its runtime (the rule's own
    resources: `models.<name>.resources` with its per-rule block, as the cluster gets them)."""
    res, where = job_resources(model.resources, job.rule), f"{model.name}: {job.label}"
    key = resources_key(model.name, job.rule)
    found = []
    # one rank per GPU: each rank's peak must fit one GPU; a spread model's whole peak all of them
    share = 1 if cost.ranks > 1 else res["gpus"]
    if res["gpus"] and cost.gpu_bytes / 1e9 > share * throughput.gpu_memory_gb:  # gpus 0: on the CPU
        per = f"a rank's peak GPU memory (of {cost.ranks})" if cost.ranks > 1 else "peak GPU memory"
        found.append(f"{where}: {per} {cost.gpu_bytes / 1e9:.0f} GB exceeds {share} x "
                     f"{throughput.gpu_memory_gb:g} GB (--gpu-memory-gb)")
    if cost.host_bytes / 1e6 > res["mem_mb"]:
        found.append(f"{where}: host memory {cost.host_bytes / 1e9:.0f} GB exceeds {key}."
                     f"mem_mb ({res['mem_mb']} MB)")
    if hours * 60 > res["runtime"]:
        found.append(f"{where}: {hours * 60:.0f} min exceeds {key}.runtime "
                     f"({res['runtime']} min)")
    return found


def _finish(row: dict, models: dict[str, Model], throughput: Throughput) -> dict:
    if row["jobs"] > 1 and row["costliest"]:
        row["note"] = f"longest {row['costliest']}: {row['note']}"
    if row["added_jobs"]:
        row["note"] += f"; {row['added_jobs']} jobs after the prepare_model checkpoint (one per layer)"
    model = models.get(row["model"])
    row["load_hours"] = row["weight_loads"] * (model.weight_bytes if model else 0) / (throughput.fs_gbs * 1e9) / 3600
    if row["kind"] == "gpu" and model is not None:  # what a job asks for with slurm.requests, at most the config's
        first = job_resources(model.resources, row["rule"], planned_request(row["host_bytes"], row["seconds"]))
        row["request"] = {"mem_mb": first["mem_mb"], "runtime": first["runtime"]}
    return row


def _totals(table: list[dict], throughput: Throughput) -> dict:
    gpu = [row for row in table if row["kind"] == "gpu"]
    allocations = sum(row["allocations"] for row in table)
    return {"jobs": sum(row["jobs"] for row in table),
            "gpu_jobs": sum(row["jobs"] for row in gpu if not row["on_cpu"]),
            "gpu_hours": sum(row["gpu_hours"] for row in gpu),
            "cpu_model_jobs": sum(row["jobs"] for row in gpu if row["on_cpu"]),
            "cpu_hours": sum(row["cpu_hours"] for row in gpu),
            "gpu_gb": max((row["gpu_gb"] for row in gpu), default=0.0),
            "host_gb": max((row["host_gb"] for row in gpu), default=0.0),
            "submitted": sum(row["submitted"] for row in table), "allocations": allocations,
            "weight_loads": sum(row["weight_loads"] for row in table),
            "load_hours": sum(row["load_hours"] for row in table),
            "queue_hours": allocations * throughput.queue_wait_min / 60}


def requests_file(report: dict) -> dict:
    """What `--requests FILE` writes: per model and GPU rule the largest planned host memory (bytes) and job time
    (seconds, start-up included), with the configuration's digest (`cluster.config_digest`), which the workflow
    checks before it uses them (`cluster.load_requests`)."""
    estimates: dict[str, dict] = {}
    for row in report["rules"]:
        if row["kind"] == "gpu" and row["model"]:
            estimates.setdefault(row["model"], {})[row["rule"]] = {"host_bytes": row["host_bytes"],
                                                                   "seconds": round(row["seconds"], 1)}
    return {"config_files": report["config_files"], "config_digest": report["config_digest"],
            "throughput": report["throughput"], "estimates": estimates}

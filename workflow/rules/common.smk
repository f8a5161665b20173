import functools
import json
import os
import re

from snakemake.exceptions import IncompleteCheckpointException

from arithmech import layout
from arithmech.code_digest import script_digest
from arithmech.tools import cluster
from arithmech.sft.methods import DRAWN_METHODS, HEAD_METHODS, METHODS, RECIPE_METHODS

MODELS = config["run"]["models"]
TASKS = config["run"]["tasks"]
# The evaluation sets to run (validated: names of arithmech.data.eval_sets.REGISTRY, each with its block).
EVAL_DATASETS = config["evaluation"]["datasets"]


def each_task(pattern):
    """A model's result (arithmech.layout) for every task of the run, the other wildcards kept for the rule."""
    return expand(layout.under(pattern), task=TASKS, allow_missing=True)


wildcard_constraints:
    model="|".join(map(re.escape, MODELS)),
    task="|".join(TASKS),
    layer=r"\d+",
    method="|".join(["base", *RECIPE_METHODS]),
    dataset="|".join(EVAL_DATASETS),
    arm="|".join(["base", *METHODS]),
    run=r"lr\d+|seed\d+|draw\d+|chosen|base",


# Host memory and runtime from the plan (slurm.requests: `make plan --requests FILE`), the config's values the
# ceiling; {} without it. A file it cannot use is noted here (a dry run, make plan's own among them, goes on with
# models.<name>.resources) and stops a run before any job is queued (the Snakefile's onstart checks).
try:
    PLANNED, PLANNED_ERROR = cluster.load_requests(config), None
except cluster.ClusterSettingError as err:
    if workflow.is_main_process:
        print(f"note: {err}", file=sys.stderr)
    PLANNED, PLANNED_ERROR = {}, err


def check_planned_requests():
    """The onstart check of slurm.requests: the error its one read above found, if any."""
    if PLANNED_ERROR is not None:
        raise PLANNED_ERROR
    return []


def model_job_resources(name, wildcards, attempt):
    """A model job's resources at `attempt` (arithmech.tools.cluster): `models.<model>.resources` with the
    block of rule `name` over it, lowered to the plan's request where slurm.requests gives one; a retry asks for
    more only where more helps, by why each attempt before it failed (cluster.attempt_resources: cancelled or
    refused, the same; killed for host memory, more memory; out of time, more time; out of GPU memory, the batch
    split). Under the SLURM plugin's names (cluster.rule_resources: a job over several nodes is the plugin's MPI
    job; one with no GPU asks for none)."""
    first = cluster.job_resources(
        config["models"][wildcards.model]["resources"],
        name,
        PLANNED.get(wildcards.model, {}).get(name),
    )
    log = getattr(rules, name).log[0].format(**dict(wildcards.items()))
    return cluster.rule_resources(cluster.attempt_resources(first, log, attempt))


def gpu_resources(name):
    """What a job of rule `name` that runs the model asks a cluster for (local runs ignore gpu and gpu_model);
    `batch_split` is read by the job itself (arithmech.jobs), `nodes` and `tasks_per_node` by a training job's
    launcher too. A value of None is not passed. Every model's `nodes` is checked here, while the workflow
    parses (cluster.check_nodes)."""
    for model in MODELS:
        cluster.check_nodes(model, config["models"][model]["resources"], name)

    def get(key):
        return lambda wildcards, attempt: model_job_resources(
            name, wildcards, attempt
        ).get(key)

    # one node: gpu, gpu_model, cpus_per_gpu (several GPUs), nodes 1; several nodes: gres, nodes, tasks_per_node, mpi
    keys = (
        "gpu",
        "gpu_model",
        "mem_mb",
        "runtime",
        "batch_split",
        "cpus_per_gpu",
        "nodes",
    )
    if name in cluster.TRAINING_RULES:
        keys += ("gres", "tasks_per_node", "mpi")
    return {
        **{key: get(key) for key in keys},
        **cluster.slurm_settings(config.get("slurm"), gpu=True),
    }


# CPU-only jobs (tables, figures, the scorecard) run on the submitting host unless slurm.cpu_partition names a
# partition for them (arithmech.tools.cluster.cpu_jobs_local).
CPU_JOBS_LOCAL = cluster.cpu_jobs_local(config.get("slurm"))
CPU_RESOURCES = {
    "mem_mb": lambda wildcards, attempt: cluster.CPU_JOB["mem_mb"] * attempt,
    "runtime": lambda wildcards, attempt: cluster.CPU_JOB["runtime"] * attempt,
    **cluster.slurm_settings(config.get("slurm"), gpu=False),
}


def workflow_path(path):
    """A data file named in the config: relative paths are taken from the workflow's directory (where
    `resources/` is), so a run with `--directory` elsewhere still finds the vendored data. They are given
    to Snakemake relative to the working directory: it records a rule's input paths, and absolute ones would
    make a moved or renamed checkout re-run everything that reads data ("Set of input files has changed").
    """
    path = Path(path).expanduser()
    if path.is_absolute():
        return str(path)
    return os.path.relpath(Path(workflow.basedir) / path)


def library_code(script):
    """Digest of the arithmech code that workflow/scripts/{script}.py runs (arithmech.code_digest), as a
    param: Snakemake re-runs a rule when its params change, so a library edit re-runs exactly the rules
    whose jobs can execute the edited code, and nothing else. A function of the job, worked out once per
    script: a cluster job's own Snakemake, which parses the whole workflow to run one job, digests only
    that job's script.
    """
    return lambda wildcards: _script_digest(script)


@functools.cache
def _script_digest(script):
    return script_digest(
        Path(workflow.basedir) / "workflow" / "scripts" / f"{script}.py"
    )


def patching_params():
    """What patch_all_layers and patch_layer read: the mode, the copies per forward only in total mode,
    and whether the metric needs probabilities. Switching relative_logit <-> logit_diff changes only the
    aggregation.
    """
    cfg = config["patching"]
    used = {"mode": cfg["mode"], "with_probs": cfg["metric"] == "prob_change"}
    if cfg["mode"] == "total":
        used["copies_per_forward"] = cfg["copies_per_forward"]
    return used


def n_layers(model):
    """Number of layers, read from the prepared model (prepare_model is a checkpoint)."""
    model_dir = checkpoints.prepare_model.get(model=model).output[0]
    record = json.loads(Path(model_dir, "source.json").read_text())
    return record["architecture"]["n_layers"]


def layer_outputs(wildcards):
    """The patching tables of one model and task: direct mode's one table of all layers
    (patch_all_layers), or total mode's one per layer (patch_layer).
    """
    if config["patching"]["mode"] == "direct":
        return [
            layout.under(
                layout.PATCHING_ALL_LAYERS, wildcards.model, task=wildcards.task
            )
        ]
    return expand(
        layout.under(layout.PATCHING_LAYER),
        model=wildcards.model,
        task=wildcards.task,
        layer=range(n_layers(wildcards.model)),
    )


def identify_targets():
    return expand(
        [
            layout.under(layout.EFFECTS_FIGURE),
            layout.under(layout.KEY),
            layout.under(layout.SHARED),
            layout.under(layout.SHARED_FIGURE),
            layout.under(layout.KNOCKOUT_FIGURE),
            layout.under(layout.TRANSFER_FIGURE),
            layout.under(layout.ROLES),
            layout.under(layout.PROBES),
            layout.under(layout.ROLES_FIGURE),
            layout.under(layout.EXAMPLE_FIGURE),
            layout.under(layout.PROBES_FIGURE),
        ],
        model=MODELS,
        task=TASKS,
    )


# Stage 4: fine-tuning and evaluation

FINETUNE_METHODS = config["finetune"]["methods"]
EVAL_METHODS = ["base", *FINETUNE_METHODS]


def finetune_effects(wildcards):
    """Head methods rank heads by patching effect; full and LoRA do not depend on the identify stage."""
    if wildcards.method in HEAD_METHODS:
        return {
            f"effects_{t}": layout.under(layout.EFFECTS, wildcards.model, task=t)
            for t in TASKS
        }
    return {}


def finetune_params(wildcards):
    """The settings this method uses, so that changing another method's (its lr, LoRA's rank) does not
    re-run it."""
    cfg, method = config["finetune"], wildcards.method
    used = {
        "data": cfg["data"],
        "train": cfg["train"],
        "lr": {method: cfg["lr"][method]},
    }
    if method in HEAD_METHODS:
        used |= {key: cfg[key] for key in ("heads", "mlps", "train_kv", "grad_scale")}
    if method == "lora":
        used["lora"] = cfg["lora"]
    return used


def evaluation_data(dataset):
    """Where an evaluation set's data is: its file, or the Parquet file fetch_dataset writes from the Hub."""
    cfg = config["evaluation"][dataset]
    if cfg.get("hub") is not None:
        return hub_file(dataset)
    return workflow_path(cfg["file"])


def evaluate_inputs(wildcards):
    """The data set's file, the trained run (none for base) and, for math, the few-shot examples' file."""
    files = {"data": evaluation_data(wildcards.dataset)}
    if wildcards.method != "base":
        files["trained"] = layout.under(
            layout.FINETUNED, wildcards.model, method=wildcards.method
        )
    if EVAL_REGISTRY[wildcards.dataset].kind == "math":
        files["shots"] = workflow_path(config["finetune"]["data"]["file"])
    return files


def evaluate_params(wildcards):
    """Only what one data set's evaluation reads: its kind's keys (not its file or hub: the data is an
    input), and n_shots for math (not confidence, the summary's)."""
    cfg, spec = config["evaluation"], EVAL_REGISTRY[wildcards.dataset]
    used = {
        "style": cfg["style"],
        "batch_size": cfg["batch_size"],
        spec.name: {k: v for k, v in cfg[spec.name].items() if k in spec.keys},
    }
    if spec.kind == "math":
        used["n_shots"] = cfg["n_shots"]
    return used


# The precise-SFT study (workflow/rules/study.smk)

STUDY = config["study"]
STUDY_ARMS = STUDY["arms"]


def study_params(*keys):
    """Only the study settings a rule reads, so that changing another one does not re-run it."""
    return {key: STUDY[key] for key in keys}


def study_format_params():
    """What study_format reads: with `auto` the candidates, with a named format its definition alone
    (so that the candidates do not re-run it); the items per format, the band, and what decides the measured
    items (the splits, the few-shot count).
    """
    name = STUDY["train_format"]
    used = study_params("train_format", "base_band", "splits", "n_shots", "confidence")
    if name == study.AUTO:
        used["format_choice"] = STUDY["format_choice"]
    else:
        used["format_choice"] = {
            "items": STUDY["format_choice"]["items"],
            "candidates": {},
        }
        used["formats"] = {name: study.study_formats(STUDY, name)[name]}
    return used


def study_format_table(model):
    return layout.under(layout.STUDY_FORMATS, model)


def study_choice(model):
    """The trained format of `model`'s study: study.train_format, or with `auto` the format rule
    study_format chose (None when none lies inside study.base_band). With `auto` it raises Snakemake's
    IncompleteCheckpointException until study_format has run, which makes the asking job wait for it.
    """
    if STUDY["train_format"] != study.AUTO:
        return STUDY["train_format"]
    return study.read_choice(checkpoints.study_format.get(model=model).output.table)[
        "chosen"
    ]


def study_runs(model):
    """Whether the study's jobs run for `model`: a format is named or was chosen. Until study_format has run
    in this invocation, what it chose the last time it ran, else (a first run, a dry run) as if it finds a
    format; once it has run, the summary is re-planned with its choice, adding or dropping the study's jobs.
    """
    try:
        return study_choice(model) is not None
    except IncompleteCheckpointException:
        table = study_format_table(model)
        if not study.choice_path(table).is_file():
            return True
        return study.read_choice(table)["chosen"] is not None


def study_items_inputs(wildcards):
    """None beyond the rule's own. Every study job asks for the choice, which makes it wait for study_format
    with `auto`: once study_format has run, Snakemake re-plans each of them afresh, so a measurement that
    keeps the format re-runs no study job (a job that only followed one that asked would keep the plan made
    before the measurement and re-run)."""
    study_choice(wildcards.model)
    return {}


def study_items_params(wildcards):
    """The trained format (named or chosen) with its definition, and what decides the items."""
    name = study_choice(wildcards.model)
    return {
        "formats": study.study_formats(STUDY, name),
        "train_format": name,
        **study_params("splits", "transfer_test", "n_shots"),
    }


def study_train_params(wildcards):
    """A run's settings: its arm's grid and method settings, training, curves (the items are an input)."""
    used = study_params("train", "curve", "heads", "mlps", "kv")
    used["lr_grid"] = {wildcards.arm: STUDY["lr_grid"][wildcards.arm]}
    if wildcards.arm == "lora":
        used["lora"] = STUDY["lora"]
    if wildcards.arm in DRAWN_METHODS:
        used["random_draws"] = STUDY["random_draws"]
    return used


def study_train_inputs(wildcards):
    """Head arms rank heads by patching effect; runs after the grid read their arm's chosen lr."""
    # waits for study_format with `auto` (study_items_inputs)
    study_choice(wildcards.model)
    files = {}
    if wildcards.arm in HEAD_METHODS:
        files |= {
            f"effects_{t}": layout.under(layout.EFFECTS, wildcards.model, task=t)
            for t in TASKS
        }
    if wildcards.arm in (
        "circuit",
        "circuit_disjoint",
    ):  # the circuits the discover rule chose, one per operator
        files |= {
            f"discover_{t}": layout.under(layout.DISCOVER, wildcards.model, task=t)
            for t in TASKS
        }
    if not wildcards.run.startswith("lr"):
        files["selection"] = layout.under(
            layout.STUDY_SELECT, wildcards.model, arm=wildcards.arm
        )
    return files


def study_select_inputs(wildcards):
    """The arm's grid runs."""
    # waits for study_format with `auto` (study_items_inputs)
    study_choice(wildcards.model)
    return {
        "runs": expand(
            layout.under(layout.STUDY_RUN),
            model=wildcards.model,
            arm=wildcards.arm,
            run=study.grid_runs(wildcards.arm, STUDY),
        )
    }


def study_evaluate_inputs(wildcards):
    """The run to score: none for base; the chosen grid run (all grid runs plus the choice) for `chosen`."""
    # waits for study_format with `auto` (study_items_inputs)
    study_choice(wildcards.model)
    if wildcards.arm == "base":
        return {}
    model, arm = wildcards.model, wildcards.arm
    if wildcards.run == "chosen":
        return {
            "selection": layout.under(layout.STUDY_SELECT, model, arm=arm),
            "grid": [
                layout.under(layout.STUDY_RUN, model, arm=arm, run=r)
                for r in study.grid_runs(arm, STUDY)
            ],
        }
    return {"run": layout.under(layout.STUDY_RUN, model, arm=arm, run=wildcards.run)}


def study_data_files():
    off = STUDY["off_target"]["files"]
    return {name: workflow_path(path) for name, path in off.items()}


def study_final_models():
    """(arm, run) of every scored model: base, and per arm the chosen run, more seeds and draws."""
    return [("base", "base")] + [
        (arm, run) for arm in STUDY_ARMS for run in study.final_runs(arm, STUDY)
    ]


def study_summary_keyed(model):
    """study_summary's inputs per (arm, run): {kind: {input name: (arm, run, path)}} for kind eval (every scored
    model), grid (every lr grid run) and run (every further seed or draw)."""
    keyed = {
        "eval": {
            f"eval_{arm}_{run}": (
                arm,
                run,
                layout.under(layout.STUDY_EVAL, model, arm=arm, run=run),
            )
            for arm, run in study_final_models()
        },
        "grid": {},
        "run": {},
    }
    for arm in STUDY_ARMS:
        for r in study.grid_runs(arm, STUDY):
            keyed["grid"][f"grid_{arm}_{r}"] = (
                arm,
                r,
                layout.under(layout.STUDY_RUN, model, arm=arm, run=r),
            )
        for r in study.final_runs(arm, STUDY):
            if r != "chosen":
                keyed["run"][f"run_{arm}_{r}"] = (
                    arm,
                    r,
                    layout.under(layout.STUDY_RUN, model, arm=arm, run=r),
                )
    return keyed


def study_summary_inputs(wildcards):
    """The format table; when the study runs, its items, every scored model, lr choice and training run."""
    model = wildcards.model
    table = study_format_table(model)
    files = {"formats": table, "choice": str(study.choice_path(table))}
    if not study_runs(wildcards.model):
        return files
    files["study_items"] = layout.under(layout.STUDY_ITEMS, model)
    keyed = study_summary_keyed(model)
    files |= {name: path for name, (_, _, path) in keyed["eval"].items()}
    files |= {
        f"select_{arm}": layout.under(layout.STUDY_SELECT, model, arm=arm)
        for arm in STUDY_ARMS
    }
    for arm in STUDY_ARMS:  # each arm's grid runs, then its further runs
        for kind in ("grid", "run"):
            files |= {n: path for n, (a, _, path) in keyed[kind].items() if a == arm}
    return files


def study_summary_runs(wildcards):
    """The (arm, run) of each keyed input of study_summary_inputs, {kind: {input name: [arm, run]}}: the script
    reads them from here, never by splitting input names (arm and run names may hold underscores).
    """
    if not study_runs(wildcards.model):
        return {"eval": {}, "grid": {}, "run": {}}
    return {
        kind: {name: [arm, run] for name, (arm, run, _) in named.items()}
        for kind, named in study_summary_keyed(wildcards.model).items()
    }


# The findings page


def findings_inputs(wildcards):
    """The claims scorecard, the tables the page repeats, and the figures it embeds: the first task's
    heatmap, knockout curve, pruning path and discovered circuit, and the study's figure
    when the study runs.
    """
    model, first = wildcards.model, TASKS[0]
    figures = [
        layout.EFFECTS_FIGURE,
        layout.KNOCKOUT_FIGURE,
        layout.DISCOVER_PATH_FIGURE,
        layout.DISCOVER_CIRCUIT_FIGURE,
    ] + ([layout.STUDY_FIGURE] if STUDY_ARMS else [])
    inputs = {
        "claims": layout.under(layout.CLAIMS, model),
        "figures": [layout.under(f, model, task=first) for f in figures],
        "discover": layout.under(layout.DISCOVER_SUMMARY, model),
    }
    for name, pattern in (("key", layout.KEY), ("knockout", layout.KNOCKOUT)):
        inputs |= {f"{name}_{t}": layout.under(pattern, model, task=t) for t in TASKS}
    if STUDY_ARMS:
        inputs["study"] = layout.under(layout.STUDY, model)
        inputs["comparisons"] = layout.under(layout.COMPARISONS, model)
    return inputs


# The claims scorecard


def claims_inputs(wildcards):
    """Every table the scorecard reads: per operator its key components, effects, knockout items, attention of
    every head by role, MLP probes, the key heads' cut paths and the discover rule's items (the key circuit on the
    teacher-forced protocol); the transfer items; the discovered circuits' summary; the study's tables
    when the study runs.
    """
    model = wildcards.model
    inputs = {
        "transfer": layout.under(layout.TRANSFER_ITEMS, model),
        "discover": layout.under(layout.DISCOVER_SUMMARY, model),
    }
    per_task = {
        "key": layout.KEY,
        "effects": layout.EFFECTS,
        "knockout": layout.KNOCKOUT_ITEMS,
        "roles": layout.ROLES_ALL,
        "probes": layout.PROBES,
        "edge_paths": layout.EDGE_PATHS,
        "discover_items": layout.DISCOVER_ITEMS,
    }
    for t in TASKS:
        inputs |= {
            f"{name}_{t}": layout.under(pattern, model, task=t)
            for name, pattern in per_task.items()
        }
    if STUDY_ARMS:
        inputs["study"] = layout.under(layout.STUDY, model)
        inputs["comparisons"] = layout.under(layout.COMPARISONS, model)
    return inputs

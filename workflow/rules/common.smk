import json
import re

MODELS = config["run"]["models"]
TASKS = config["run"]["tasks"]


wildcard_constraints:
    model="|".join(map(re.escape, MODELS)),
    task="|".join(TASKS),
    layer=r"\d+",


def model_resource(key):
    """Cluster resource of a GPU job from `models.<model>.resources`; memory and runtime grow with each
    retry (attempt 1, 2, ...), so a job killed for memory or time is resubmitted with more.
    """

    def get(wildcards, attempt):
        value = config["models"][wildcards.model]["resources"].get(key, "")
        return value * attempt if key in ("mem_mb", "runtime") else value

    return get


# What every rule that runs the model asks a cluster for (local runs ignore gpu and gpu_model).
GPU_RESOURCES = {
    "gpu": model_resource("gpus"),
    "gpu_model": model_resource("gpu_model"),
    "mem_mb": model_resource("mem_mb"),
    "runtime": model_resource("runtime"),
}
CPU_RESOURCES = {
    "mem_mb": lambda wildcards, attempt: 4000 * attempt,
    "runtime": lambda wildcards, attempt: 20 * attempt,
}


def workflow_path(path):
    """A data file named in the config: relative paths are taken from the workflow's directory (where
    `resources/` is), so a run with `--directory` elsewhere still finds the vendored data.
    """
    path = Path(path).expanduser()
    return str(path if path.is_absolute() else Path(workflow.basedir) / path)


def n_layers(model):
    """Number of layers, read from the prepared model (prepare_model is a checkpoint)."""
    model_dir = checkpoints.prepare_model.get(model=model).output[0]
    record = json.loads(Path(model_dir, "source.json").read_text())
    return record["architecture"]["n_layers"]


def layer_outputs(wildcards):
    return expand(
        "results/{model}/patching/{task}/layer{layer}.parquet",
        model=wildcards.model,
        task=wildcards.task,
        layer=range(n_layers(wildcards.model)),
    )


def identify_targets():
    return expand(
        [
            "results/{model}/effects/{task}.png",
            "results/{model}/key_components/{task}.parquet",
            "results/{model}/key_components/shared.parquet",
            "results/{model}/key_components/shared.png",
            "results/{model}/knockout/{task}.png",
            "results/{model}/knockout/transfer.png",
            "results/{model}/analysis/{task}_roles.parquet",
            "results/{model}/analysis/{task}_probes.parquet",
            "results/{model}/analysis/{task}_roles.png",
            "results/{model}/analysis/{task}_example.png",
            "results/{model}/analysis/{task}_probes.png",
        ],
        model=MODELS,
        task=TASKS,
    )


# Stage 4: fine-tuning and evaluation

FINETUNE_METHODS = config["finetune"]["methods"]
EVAL_METHODS = ["base", *FINETUNE_METHODS]


def finetune_effects(wildcards):
    """Head methods rank heads by patching effect; full and LoRA do not depend on the identify stage."""
    if wildcards.method in ("precise", "random_heads"):
        return {
            f"effects_{t}": f"results/{wildcards.model}/effects/{t}.parquet"
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
    if method in ("precise", "random_heads"):
        used |= {key: cfg[key] for key in ("heads", "mlps", "train_kv", "grad_scale")}
    if method == "lora":
        used["lora"] = cfg["lora"]
    return used


def evaluation_files():
    files = {d: workflow_path(config["evaluation"][d]["file"]) for d in EVAL_DATASETS}
    return files | {"gsm8k_train": workflow_path(config["finetune"]["data"]["file"])}

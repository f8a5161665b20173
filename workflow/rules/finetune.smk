# Stage 4 of the paper: precise SFT of the key heads against full fine-tuning, random heads and LoRA, and
# the evaluation on GSM8K, SVAMP and non-math sets (Table 1).

FINETUNE_METHODS = config["finetune"]["methods"]
EVAL_METHODS = ["base", *FINETUNE_METHODS]
EVAL_DATASETS = [
    "gsm8k",
    "svamp",
    "social_iqa",
    "strategyqa",
    "qa_wikidata",
    "wikitext",
]


def finetune_effects(wildcards):
    """Head methods rank heads by patching effect; full and LoRA do not depend on the identify stage."""
    if wildcards.method in ("precise", "random_heads"):
        return {t: f"results/{wildcards.model}/effects/{t}.parquet" for t in TASKS}
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


rule finetune:
    input:
        unpack(lambda wc: {"effects_" + k: v for k, v in finetune_effects(wc).items()}),
        model="results/{model}/model",
        data=workflow_path(config["finetune"]["data"]["file"]),
    output:
        directory("results/{model}/finetune/{method}"),
    log:
        "results/{model}/logs/finetune/{method}.log",
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **GPU_RESOURCES,
    params:
        finetune=finetune_params,
        compute=config["compute"],
        seed=config["seed"],
        tasks=TASKS,
        checkpoints=lambda wc: f"results/{wc.model}/finetune/.checkpoints",
    script:
        "../scripts/finetune.py"


def evaluation_files():
    files = {d: workflow_path(config["evaluation"][d]["file"]) for d in EVAL_DATASETS}
    return files | {"gsm8k_train": workflow_path(config["finetune"]["data"]["file"])}


rule evaluate:
    input:
        unpack(
            lambda wc: (
                {}
                if wc.method == "base"
                else {"trained": f"results/{wc.model}/finetune/{wc.method}"}
            )
        ),
        **evaluation_files(),
        model="results/{model}/model",
    output:
        **{d: f"results/{{model}}/eval/{{method}}/{d}.parquet" for d in EVAL_DATASETS},
    log:
        "results/{model}/logs/evaluate/{method}.log",
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **GPU_RESOURCES,
    params:
        evaluation=config["evaluation"],
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/evaluate.py"


rule summarize_eval:
    input:
        evals=expand(
            "results/{{model}}/eval/{method}/{dataset}.parquet",
            method=EVAL_METHODS,
            dataset=EVAL_DATASETS,
        ),
        trained=expand("results/{{model}}/finetune/{method}", method=FINETUNE_METHODS),
    output:
        table="results/{model}/eval/summary.parquet",
        markdown="results/{model}/eval/summary.md",
        html=report(
            "results/{model}/eval/summary.html",
            caption="../report/eval_table.rst",
            category="4. Precise SFT",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "Table 1"},
        ),
        figure=report(
            "results/{model}/eval/summary.png",
            caption="../report/eval_figure.rst",
            category="4. Precise SFT",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "accuracy by method"},
        ),
    log:
        "results/{model}/logs/summarize_eval.log",
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        methods=EVAL_METHODS,
        datasets=EVAL_DATASETS,
        confidence=config["evaluation"]["confidence"],
    script:
        "../scripts/summarize_eval.py"

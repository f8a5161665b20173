# Stage 4 of the paper: precise SFT of the key heads against full fine-tuning, random heads and LoRA, and
# the evaluation on GSM8K, SVAMP and non-math sets (Table 1).


rule finetune:
    input:
        unpack(finetune_effects),
        model=layout.under(layout.MODEL),
        data=workflow_path(config["finetune"]["data"]["file"]),
    output:
        directory(layout.under(layout.FINETUNED)),
    log:
        "results/{model}/logs/finetune/{method}.log",
    benchmark:
        "results/{model}/benchmarks/finetune/{method}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("finetune"),
    params:
        code=library_code("finetune"),
        finetune=finetune_params,
        compute=config["compute"],
        seed=config["seed"],
        checkpoints=lambda wc: layout.under(layout.FINETUNE_CHECKPOINTS, wc.model),
    script:
        "../scripts/finetune.py"


# An evaluation set given as `hub:` is downloaded once, shared by every model, on the machine that runs
# Snakemake (cluster nodes are often offline); jobs read the local Parquet file.
rule fetch_dataset:
    output:
        layout.shared(layout.DATASET),
    log:
        "results/logs/fetch_dataset/{dataset}.log",
    benchmark:
        "results/benchmarks/fetch_dataset/{dataset}.tsv"
    localrule: True
    conda:
        "../../envs/arithmech.yaml"
    params:
        code=library_code("fetch_dataset"),
        hub=lambda w: config["evaluation"][w.dataset]["hub"],
    script:
        "../scripts/fetch_dataset.py"


# One job per model and data set: changing one set's size re-runs only that set.
rule evaluate:
    input:
        unpack(evaluate_inputs),
        model=layout.under(layout.MODEL),
    output:
        layout.under(layout.EVAL),
    log:
        "results/{model}/logs/evaluate/{method}/{dataset}.log",
    benchmark:
        "results/{model}/benchmarks/evaluate/{method}/{dataset}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("evaluate"),
    params:
        code=library_code("evaluate"),
        evaluation=evaluate_params,
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/evaluate.py"


rule summarize_eval:
    input:
        evals=expand(
            layout.under(layout.EVAL),
            method=EVAL_METHODS,
            dataset=EVAL_DATASETS,
            allow_missing=True,
        ),
        trained=expand(
            layout.under(layout.FINETUNED),
            method=FINETUNE_METHODS,
            allow_missing=True,
        ),
    output:
        table=layout.under(layout.EVAL_SUMMARY),
        markdown=layout.under(layout.EVAL_SUMMARY_MD),
        html=report(
            layout.under(layout.EVAL_SUMMARY_HTML),
            caption="../report/eval_table.rst",
            category="4. Precise SFT",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "Table 1"},
        ),
        figure=report(
            layout.under(layout.EVAL_SUMMARY_FIGURE),
            caption="../report/eval_figure.rst",
            category="4. Precise SFT",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "accuracy by method"},
        ),
    log:
        "results/{model}/logs/summarize_eval.log",
    benchmark:
        "results/{model}/benchmarks/summarize_eval.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("summarize_eval"),
        methods=EVAL_METHODS,
        datasets=EVAL_DATASETS,
        confidence=config["evaluation"]["confidence"],
    script:
        "../scripts/summarize_eval.py"

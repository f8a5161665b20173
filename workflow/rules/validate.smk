# Stage 2 of the paper: validate the key components by mean-ablation knockout.


rule knockout:
    input:
        model="results/{model}/model",
        pairs="results/{model}/pairs/{task}.parquet",
        cache="results/{model}/activations/{task}.safetensors",
        effects="results/{model}/effects/{task}.parquet",
        key="results/{model}/key_components/{task}.parquet",
    output:
        table="results/{model}/knockout/{task}.parquet",
        per_item="results/{model}/knockout/{task}_items.parquet",
    log:
        "results/{model}/logs/knockout/{task}.log",
    benchmark:
        "results/{model}/benchmarks/knockout/{task}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("knockout"),
    params:
        code=library_code("knockout"),
        ablation=config["ablation"],
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/knockout.py"


rule transfer:
    input:
        model="results/{model}/model",
        pairs=expand("results/{{model}}/pairs/{task}.parquet", task=TASKS),
        caches=expand("results/{{model}}/activations/{task}.safetensors", task=TASKS),
        key_tables=expand("results/{{model}}/key_components/{task}.parquet", task=TASKS),
        svamp=workflow_path(config["transfer"]["svamp"]["file"]),
        non_math=workflow_path(config["transfer"]["non_math"]["file"]),
    output:
        table="results/{model}/knockout/transfer.parquet",
        per_item="results/{model}/knockout/transfer_items.parquet",
    log:
        "results/{model}/logs/transfer.log",
    benchmark:
        "results/{model}/benchmarks/transfer.tsv"
    # the longest single job: started as soon as its inputs exist, so it does not run alone at the end
    priority: 1
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("transfer"),
    params:
        code=library_code("transfer"),
        tasks=TASKS,
        transfer=config["transfer"],
        prompts=config["prompts"],
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/transfer.py"


rule plot_knockout:
    input:
        table="results/{model}/knockout/{task}.parquet",
        key="results/{model}/key_components/{task}.parquet",
    output:
        report(
            "results/{model}/knockout/{task}.png",
            caption="../report/knockout.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "{task}", "figure": "knockout curve"},
        ),
    log:
        "results/{model}/logs/plot_knockout/{task}.log",
    benchmark:
        "results/{model}/benchmarks/plot_knockout/{task}.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("plot_knockout"),
    script:
        "../scripts/plot_knockout.py"


rule plot_transfer:
    input:
        "results/{model}/knockout/transfer.parquet",
    output:
        html=report(
            "results/{model}/knockout/transfer.html",
            caption="../report/transfer.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "all", "figure": "transfer table"},
        ),
        heatmap=report(
            "results/{model}/knockout/transfer.png",
            caption="../report/transfer.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "all", "figure": "transfer matrix"},
        ),
    log:
        "results/{model}/logs/plot_transfer.log",
    benchmark:
        "results/{model}/benchmarks/plot_transfer.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("plot_transfer"),
    script:
        "../scripts/plot_transfer.py"

# Stage 2 of the paper: validate the key components by mean-ablation knockout.


rule knockout:
    input:
        model=layout.under(layout.MODEL),
        pairs=layout.under(layout.PAIRS),
        cache=layout.under(layout.ACTIVATIONS),
        effects=layout.under(layout.EFFECTS),
        key=layout.under(layout.KEY),
    output:
        table=layout.under(layout.KNOCKOUT),
        per_item=layout.under(layout.KNOCKOUT_ITEMS),
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
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
        caches=each_task(layout.ACTIVATIONS),
        key_tables=each_task(layout.KEY),
        svamp=workflow_path(config["transfer"]["svamp"]["file"]),
        non_math=workflow_path(config["transfer"]["non_math"]["file"]),
    output:
        table=layout.under(layout.TRANSFER),
        per_item=layout.under(layout.TRANSFER_ITEMS),
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
        table=layout.under(layout.KNOCKOUT),
        key=layout.under(layout.KEY),
    output:
        report(
            layout.under(layout.KNOCKOUT_FIGURE),
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
        layout.under(layout.TRANSFER),
    output:
        html=report(
            layout.under(layout.TRANSFER_HTML),
            caption="../report/transfer.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "all", "figure": "transfer table"},
        ),
        heatmap=report(
            layout.under(layout.TRANSFER_FIGURE),
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

# Stage 1 of the paper: identify the key heads and MLPs by path patching at the END position.


checkpoint prepare_model:
    output:
        directory(layout.under(layout.MODEL)),
    log:
        "results/{model}/logs/prepare_model.log",
    benchmark:
        "results/{model}/benchmarks/prepare_model.tsv"
    localrule: True  # downloads: cluster nodes are often offline
    conda:
        "../../envs/arithmech.yaml"
    params:
        code=library_code("prepare_model"),
        source=lambda w: config["models"][w.model]["source"],
    script:
        "../scripts/prepare_model.py"


rule build_pairs:
    input:
        model=layout.under(layout.MODEL),
    output:
        pairs=layout.under(layout.PAIRS),
        dropped=layout.under(layout.PAIRS_DROPPED),
    log:
        "results/{model}/logs/build_pairs/{task}.log",
    benchmark:
        "results/{model}/benchmarks/build_pairs/{task}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("build_pairs"),
    params:
        code=library_code("build_pairs"),
        prompts=config["prompts"],
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/build_pairs.py"


rule cache_activations:
    input:
        model=layout.under(layout.MODEL),
        pairs=layout.under(layout.PAIRS),
    output:
        layout.under(layout.ACTIVATIONS),
    log:
        "results/{model}/logs/cache_activations/{task}.log",
    benchmark:
        "results/{model}/benchmarks/cache_activations/{task}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("cache_activations"),
    params:
        code=library_code("cache_activations"),
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/cache_activations.py"


# Direct mode: one job for every layer and task. The closed form takes milliseconds, and a job's start-up
# (importing torch and transformers, loading the model) about 5 s, so one job instead of one per layer.
rule patch_all_layers:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
        cache=each_task(layout.ACTIVATIONS),
    output:
        each_task(layout.PATCHING_ALL_LAYERS),
    log:
        "results/{model}/logs/patch_all_layers.log",
    benchmark:
        "results/{model}/benchmarks/patch_all_layers.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 1
    resources:
        **gpu_resources("patch_all_layers"),
    params:
        code=library_code("patch_all_layers"),
        patching=patching_params(),
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/patch_all_layers.py"


# Total mode: one job per layer, for all tasks: the model loads once per layer, and a cluster runs layers in
# parallel.
rule patch_layer:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
        cache=each_task(layout.ACTIVATIONS),
    output:
        each_task(layout.PATCHING_LAYER),
    log:
        "results/{model}/logs/patch_layer/layer{layer}.log",
    benchmark:
        "results/{model}/benchmarks/patch_layer/{layer}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 1
    resources:
        **gpu_resources("patch_layer"),
    params:
        code=library_code("patch_layer"),
        patching=patching_params(),
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/patch_layer.py"


rule aggregate_effects:
    input:
        layers=layer_outputs,
        pairs=layout.under(layout.PAIRS),  # operand pairs: the bootstrap's clusters
    output:
        effects=layout.under(layout.EFFECTS),
        key=layout.under(layout.KEY),
        key_html=report(
            layout.under(layout.KEY_HTML),
            caption="../report/key_components.rst",
            category="1. Identify",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "{task}",
                "figure": "key components table",
            },
        ),
    log:
        "results/{model}/logs/aggregate_effects/{task}.log",
    benchmark:
        "results/{model}/benchmarks/aggregate_effects/{task}.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("aggregate_effects"),
        metric=config["patching"]["metric"],
        key_rules=config["key_components"],
        seed=config["seed"],
    script:
        "../scripts/aggregate_effects.py"


# Figures are rules of their own: a change to a figure re-draws it and re-runs nothing that reads the table.
rule plot_effects:
    input:
        effects=layout.under(layout.EFFECTS),
        key=layout.under(layout.KEY),
    output:
        report(
            layout.under(layout.EFFECTS_FIGURE),
            caption="../report/effects_heatmap.rst",
            category="1. Identify",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "{task}",
                "figure": "patching heatmap",
            },
        ),
    log:
        "results/{model}/logs/plot_effects/{task}.log",
    benchmark:
        "results/{model}/benchmarks/plot_effects/{task}.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("plot_effects"),
        metric=config["patching"]["metric"],
    script:
        "../scripts/plot_effects.py"


rule summarize_key_components:
    input:
        effects=each_task(layout.EFFECTS),
        key=each_task(layout.KEY),
    output:
        table=layout.under(layout.SHARED),
        table_html=report(
            layout.under(layout.SHARED_HTML),
            caption="../report/shared_table.rst",
            category="1. Identify",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "all",
                "figure": "shared key components table",
            },
        ),
        heatmap=report(
            layout.under(layout.SHARED_FIGURE),
            caption="../report/shared.rst",
            category="1. Identify",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "all",
                "figure": "shared key components",
            },
        ),
    log:
        "results/{model}/logs/summarize_key_components.log",
    benchmark:
        "results/{model}/benchmarks/summarize_key_components.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("summarize_key_components"),
        tasks=TASKS,
    script:
        "../scripts/summarize_key_components.py"

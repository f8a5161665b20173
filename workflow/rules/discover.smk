# Circuit discovery (docs/circuit.md): the smallest set of heads and MLPs that keeps a target share of a measure on
# the identification pairs (greedy node pruning, every other node mean-ablated at END as in rule circuit), scored on
# the validation pairs against the key circuit, random circuits of its size and the top heads by effect.


# What the discover rules read: the circuit.discover block, with the circuit stage's intervals.
DISCOVER_PARAMS = {
    **config["circuit"]["discover"],
    "bootstrap": config["circuit"]["bootstrap"],
    "confidence": config["circuit"]["confidence"],
}


rule discover:
    input:
        model="results/{model}/model",
        pairs="results/{model}/pairs/{task}.parquet",
        cache="results/{model}/activations/{task}.safetensors",
        effects="results/{model}/effects/{task}.parquet",
        key="results/{model}/key_components/{task}.parquet",
    output:
        table="results/{model}/discover/{task}.parquet",
        path="results/{model}/discover/{task}_path.parquet",
        validation="results/{model}/discover/{task}_validation.parquet",
        per_item="results/{model}/discover/{task}_items.parquet",
        added="results/{model}/discover/{task}_added.parquet",
    log:
        "results/{model}/logs/discover/{task}.log",
    benchmark:
        "results/{model}/benchmarks/discover/{task}.tsv"
    # discover -> discover_union is the longest chain of jobs: started first, so the union does not run alone at
    # the end (above transfer's 1)
    priority: 2
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("discover"),
    params:
        code=library_code("discover"),
        discover=DISCOVER_PARAMS,
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/discover.py"


# One job for every operator: the union of their chosen circuits on each operator's validation pairs, and the
# summary table of every operator's circuits.
rule discover_union:
    input:
        model="results/{model}/model",
        pairs=expand("results/{{model}}/pairs/{task}.parquet", task=TASKS),
        caches=expand("results/{{model}}/activations/{task}.safetensors", task=TASKS),
        key_tables=expand("results/{{model}}/key_components/{task}.parquet", task=TASKS),
        tables=expand("results/{{model}}/discover/{task}.parquet", task=TASKS),
        validation=expand(
            "results/{{model}}/discover/{task}_validation.parquet", task=TASKS
        ),
        per_item=expand("results/{{model}}/discover/{task}_items.parquet", task=TASKS),
    output:
        validation="results/{model}/discover/union_validation.parquet",
        summary="results/{model}/discover/summary.parquet",
    log:
        "results/{model}/logs/discover_union.log",
    benchmark:
        "results/{model}/benchmarks/discover_union.tsv"
    priority: 2
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("discover_union"),
    params:
        code=library_code("discover_union"),
        tasks=TASKS,
        discover=DISCOVER_PARAMS,
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/discover_union.py"


rule plot_discover:
    input:
        path="results/{model}/discover/{task}_path.parquet",
        validation="results/{model}/discover/{task}_validation.parquet",
        key="results/{model}/key_components/{task}.parquet",
    output:
        path=report(
            "results/{model}/discover/{task}_path.png",
            caption="../report/discover_path.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "{task}", "figure": "pruning path"},
        ),
        grid=report(
            "results/{model}/discover/{task}_circuit.png",
            caption="../report/discover_circuit.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "{task}",
                "figure": "discovered circuit",
            },
        ),
    log:
        "results/{model}/logs/plot_discover/{task}.log",
    benchmark:
        "results/{model}/benchmarks/plot_discover/{task}.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("plot_discover"),
    script:
        "../scripts/plot_discover.py"

# Circuit discovery (docs/circuit.md): the smallest set of heads and MLPs that keeps a target share of a measure on
# the identification pairs (greedy node pruning, teacher-forced: every other node ablated at END and every answer
# position), scored on the validation pairs against the key circuit, random circuits of its size and the top heads by
# effect.


# What the discover rules read: the circuit.discover block, with the circuit stage's intervals.
DISCOVER_PARAMS = {
    **config["circuit"]["discover"],
    "bootstrap": config["circuit"]["bootstrap"],
    "confidence": config["circuit"]["confidence"],
}


rule discover:
    input:
        model=layout.under(layout.MODEL),
        pairs=layout.under(layout.PAIRS),
        effects=layout.under(layout.EFFECTS),
        key=layout.under(layout.KEY),
    output:
        table=layout.under(layout.DISCOVER),
        path=layout.under(layout.DISCOVER_PATH),
        validation=layout.under(layout.DISCOVER_VALIDATION),
        per_item=layout.under(layout.DISCOVER_ITEMS),
        added=layout.under(layout.DISCOVER_ADDED),
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


# The shared circuit (docs/circuit.md): one circuit pruned on every operator's identification pairs together, its own
# job beside the per-operator ones (it reads their pairs, not their tables), scored as each operator's circuit is.
rule discover_shared:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
    output:
        table=layout.under(layout.SHARED_CIRCUITS),
        validation=layout.under(layout.SHARED_VALIDATION),
        per_item=layout.under(layout.SHARED_ITEMS),
        summary=layout.under(layout.SHARED_SUMMARY),
    log:
        "results/{model}/logs/discover_shared.log",
    benchmark:
        "results/{model}/benchmarks/discover_shared.tsv"
    # discover_shared -> discover_union: as the per-operator discover jobs
    priority: 2
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("discover_shared"),
    params:
        code=library_code("discover_shared"),
        tasks=TASKS,
        discover=DISCOVER_PARAMS,
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/discover_shared.py"


# One job for every operator: the union of their chosen circuits on each operator's validation pairs, and the
# summary table of every operator's circuits, the union and the shared circuit.
rule discover_union:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
        key_tables=each_task(layout.KEY),
        tables=each_task(layout.DISCOVER),
        validation=each_task(layout.DISCOVER_VALIDATION),
        per_item=each_task(layout.DISCOVER_ITEMS),
        shared=layout.under(layout.SHARED_SUMMARY),
    output:
        validation=layout.under(layout.UNION_VALIDATION),
        summary=layout.under(layout.DISCOVER_SUMMARY),
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
        path=layout.under(layout.DISCOVER_PATH),
        validation=layout.under(layout.DISCOVER_VALIDATION),
        key=layout.under(layout.KEY),
    output:
        path=report(
            layout.under(layout.DISCOVER_PATH_FIGURE),
            caption="../report/discover_path.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "{task}", "figure": "pruning path"},
        ),
        grid=report(
            layout.under(layout.DISCOVER_CIRCUIT_FIGURE),
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

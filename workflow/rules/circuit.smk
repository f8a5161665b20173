# From key components to a circuit: are they sufficient (circuit), and do the key heads act through the MLPs
# (edges)? Both on the validation pairs (docs/circuit.md).


rule circuit:
    input:
        model=layout.under(layout.MODEL),
        pairs=layout.under(layout.PAIRS),
        cache=layout.under(layout.ACTIVATIONS),
        effects=layout.under(layout.EFFECTS),
        key=layout.under(layout.KEY),
    output:
        table=layout.under(layout.CIRCUIT),
        per_item=layout.under(layout.CIRCUIT_ITEMS),
    log:
        "results/{model}/logs/circuit/{task}.log",
    benchmark:
        "results/{model}/benchmarks/circuit/{task}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("circuit"),
    params:
        code=library_code("circuit"),
        circuit={
            k: v
            for k, v in config["circuit"].items()
            if k not in ("edges", "discover")
        },
        prompts=config["prompts"],
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/circuit.py"


# One job for every operator, as patch_all_layers: the model loads once, and the closed form costs seconds.
rule edges:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
        effects=each_task(layout.EFFECTS),
        key_tables=each_task(layout.KEY),
    output:
        tables=each_task(layout.EDGES),
        samples=each_task(layout.EDGE_SAMPLES),
        paths=each_task(layout.EDGE_PATHS),
    log:
        "results/{model}/logs/edges.log",
    benchmark:
        "results/{model}/benchmarks/edges.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("edges"),
    params:
        code=library_code("edges"),
        tasks=TASKS,
        edges={
            **{k: v for k, v in config["circuit"]["edges"].items() if k != "curve"},
            "bootstrap": config["circuit"]["bootstrap"],
            "confidence": config["circuit"]["confidence"],
        },
        metric=config["patching"]["metric"],
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/edges.py"


# circuit.edges.curve: the EAP-IG edge circuit against the node circuit at equal size (docs/circuit.md); one job for
# every operator, requested by `all` only when the setting is on.
rule edge_curve:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
        effects=each_task(layout.EFFECTS),
        key_tables=each_task(layout.KEY),
    output:
        tables=each_task(layout.EDGE_CURVE),
    log:
        "results/{model}/logs/edge_curve.log",
    benchmark:
        "results/{model}/benchmarks/edge_curve.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("edge_curve"),
    params:
        code=library_code("edge_curve"),
        tasks=TASKS,
        edges={k: v for k, v in config["circuit"]["edges"].items() if k != "curve"},
        discover={
            k: config["circuit"]["discover"][k]
            for k in ("tf_ablation", "tf_measure", "ig_steps")
        },
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/edge_curve.py"


rule plot_edge_curve:
    input:
        tables=each_task(layout.EDGE_CURVE),
    output:
        figure=report(
            layout.under(layout.EDGE_CURVE_FIGURE),
            caption="../report/edge_curve.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "edge circuit vs node circuit"},
        ),
    log:
        "results/{model}/logs/plot_edge_curve.log",
    benchmark:
        "results/{model}/benchmarks/plot_edge_curve.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("plot_edge_curve"),
    script:
        "../scripts/plot_edge_curve.py"


rule plot_circuit:
    input:
        table=layout.under(layout.CIRCUIT),
        edges=layout.under(layout.EDGES),
    output:
        curve=report(
            layout.under(layout.FAITHFULNESS_FIGURE),
            caption="../report/circuit_faithfulness.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "{task}",
                "figure": "circuit faithfulness",
            },
        ),
        graph=report(
            layout.under(layout.GRAPH_FIGURE),
            caption="../report/circuit_graph.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "{task}", "figure": "circuit graph"},
        ),
        heatmap=report(
            layout.under(layout.EDGES_FIGURE),
            caption="../report/circuit_edges.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "{task}", "figure": "head-MLP edges"},
        ),
    log:
        "results/{model}/logs/plot_circuit/{task}.log",
    benchmark:
        "results/{model}/benchmarks/plot_circuit/{task}.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("plot_circuit"),
        levels=[0.8, 0.9],
    script:
        "../scripts/plot_circuit.py"

# From key components to a circuit: are they sufficient (circuit), and do the key heads act through the MLPs
# (edges)? Both on the validation pairs (docs/circuit.md).


rule circuit:
    input:
        model="results/{model}/model",
        pairs="results/{model}/pairs/{task}.parquet",
        cache="results/{model}/activations/{task}.safetensors",
        effects="results/{model}/effects/{task}.parquet",
        key="results/{model}/key_components/{task}.parquet",
    output:
        table="results/{model}/circuit/{task}.parquet",
        per_item="results/{model}/circuit/{task}_items.parquet",
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
        model="results/{model}/model",
        pairs=expand("results/{{model}}/pairs/{task}.parquet", task=TASKS),
        effects=expand("results/{{model}}/effects/{task}.parquet", task=TASKS),
        key_tables=expand("results/{{model}}/key_components/{task}.parquet", task=TASKS),
    output:
        tables=expand("results/{{model}}/circuit/{task}_edges.parquet", task=TASKS),
        samples=expand(
            "results/{{model}}/circuit/{task}_edge_samples.parquet", task=TASKS
        ),
        paths=expand("results/{{model}}/circuit/{task}_edge_paths.parquet", task=TASKS),
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
        model="results/{model}/model",
        pairs=expand("results/{{model}}/pairs/{task}.parquet", task=TASKS),
        effects=expand("results/{{model}}/effects/{task}.parquet", task=TASKS),
        key_tables=expand("results/{{model}}/key_components/{task}.parquet", task=TASKS),
    output:
        tables=expand("results/{{model}}/circuit/{task}_edge_curve.parquet", task=TASKS),
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
        tables=expand("results/{{model}}/circuit/{task}_edge_curve.parquet", task=TASKS),
    output:
        figure=report(
            "results/{model}/circuit/edge_curve.png",
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
        table="results/{model}/circuit/{task}.parquet",
        edges="results/{model}/circuit/{task}_edges.parquet",
    output:
        curve=report(
            "results/{model}/circuit/{task}_faithfulness.png",
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
            "results/{model}/circuit/{task}_graph.png",
            caption="../report/circuit_graph.rst",
            category="2. Validate",
            subcategory="{model}",
            labels={"model": "{model}", "task": "{task}", "figure": "circuit graph"},
        ),
        heatmap=report(
            "results/{model}/circuit/{task}_edges.png",
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

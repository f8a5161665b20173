# From key components to a circuit on the teacher-forced protocol: do the key heads act through the MLPs (edges),
# and the EAP-IG edge circuit against the node circuit (edge_curve, off by default); on the validation pairs
# (docs/circuit.md). The key circuit's sufficiency is scored by the discover rule.


# One job for every operator, as patch_all_layers: the model loads once.
rule edges:
    input:
        model=layout.under(layout.MODEL),
        pairs=each_task(layout.PAIRS),
        key_tables=each_task(layout.KEY),
    output:
        paths=each_task(layout.EDGE_PATHS),
    log:
        "results/{model}/logs/edges.log",
    benchmark:
        "results/{model}/benchmarks/edges.tsv"
    # a long single job (as transfer): started as soon as its inputs exist, not last beside the study's evaluations
    priority: 1
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("edges"),
    params:
        code=library_code("edges"),
        tasks=TASKS,
        edges={"max_samples": config["circuit"]["edges"]["max_samples"]},
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

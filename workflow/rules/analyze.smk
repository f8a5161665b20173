# Stage 3 of the paper: explain the key heads (where they look from END) and the MLPs (what they write).


rule analyze:
    input:
        model=layout.under(layout.MODEL),
        pairs=layout.under(layout.PAIRS),
        key=layout.under(layout.KEY),
        effects=layout.under(layout.EFFECTS),
    output:
        roles=layout.under(layout.ROLES),
        roles_all=layout.under(layout.ROLES_ALL),
        example=layout.under(layout.EXAMPLE),
        probes=layout.under(layout.PROBES),
    log:
        "results/{model}/logs/analyze/{task}.log",
    benchmark:
        "results/{model}/benchmarks/analyze/{task}.tsv"
    conda:
        "../../envs/arithmech.yaml"
    threads: 2
    resources:
        **gpu_resources("analyze"),
    params:
        code=library_code("analyze"),
        analysis=config["analysis"],
        compute=config["compute"],
        seed=config["seed"],
    script:
        "../scripts/analyze.py"


# The analyze figures from its tables: torch-free, so a figure change re-draws without re-running the model.
rule plot_analysis:
    input:
        roles=layout.under(layout.ROLES),
        example=layout.under(layout.EXAMPLE),
        probes=layout.under(layout.PROBES),
    output:
        roles_png=report(
            layout.under(layout.ROLES_FIGURE),
            caption="../report/analysis_roles.rst",
            category="3. Analyze",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "{task}",
                "figure": "attention by token role",
            },
        ),
        example_png=report(
            layout.under(layout.EXAMPLE_FIGURE),
            caption="../report/analysis_example.rst",
            category="3. Analyze",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "task": "{task}",
                "figure": "attention on an example prompt",
            },
        ),
        probes_png=report(
            layout.under(layout.PROBES_FIGURE),
            caption="../report/analysis_probes.rst",
            category="3. Analyze",
            subcategory="{model}",
            labels={"model": "{model}", "task": "{task}", "figure": "MLP probes"},
        ),
    log:
        "results/{model}/logs/plot_analysis/{task}.log",
    benchmark:
        "results/{model}/benchmarks/plot_analysis/{task}.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("plot_analysis"),
    script:
        "../scripts/plot_analysis.py"

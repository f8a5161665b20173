# Stage 3 of the paper: explain the key heads (where they look from END) and the MLPs (what they write).


rule analyze:
    input:
        model="results/{model}/model",
        pairs="results/{model}/pairs/{task}.parquet",
        key="results/{model}/key_components/{task}.parquet",
        effects="results/{model}/effects/{task}.parquet",
    output:
        roles="results/{model}/analysis/{task}_roles.parquet",
        roles_all="results/{model}/analysis/{task}_roles_all.parquet",
        example="results/{model}/analysis/{task}_example.parquet",
        probes="results/{model}/analysis/{task}_probes.parquet",
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
        roles="results/{model}/analysis/{task}_roles.parquet",
        example="results/{model}/analysis/{task}_example.parquet",
        probes="results/{model}/analysis/{task}_probes.parquet",
    output:
        roles_png=report(
            "results/{model}/analysis/{task}_roles.png",
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
            "results/{model}/analysis/{task}_example.png",
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
            "results/{model}/analysis/{task}_probes.png",
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

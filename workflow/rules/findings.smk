# The headline findings of each model on one page: the first thing the report shows.


rule findings:
    input:
        unpack(findings_inputs),
    output:
        html=report(
            layout.under(layout.FINDINGS),
            caption="../report/findings.rst",
            category="0. Findings",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "findings"},
        ),
    log:
        "results/{model}/logs/findings.log",
    benchmark:
        "results/{model}/benchmarks/findings.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("findings"),
        tasks=TASKS,
    script:
        "../scripts/findings.py"

# The scorecard: which of the paper's claims hold on each model, read from the stages' tables.


rule claims:
    input:
        unpack(claims_inputs),
    output:
        table=layout.under(layout.CLAIMS),
        markdown=layout.under(layout.CLAIMS_MD),
        html=report(
            layout.under(layout.CLAIMS_HTML),
            caption="../report/claims.rst",
            category="0. Findings",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "claims scorecard"},
        ),
    log:
        "results/{model}/logs/claims.log",
    benchmark:
        "results/{model}/benchmarks/claims.tsv"
    localrule: CPU_JOBS_LOCAL
    conda:
        "../../envs/arithmech.yaml"
    resources:
        **CPU_RESOURCES,
    params:
        code=library_code("claims"),
        tasks=TASKS,
        claims=config["claims"],
        seed=config["seed"],
    script:
        "../scripts/claims.py"

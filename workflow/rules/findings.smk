# The headline findings of each model on one page: the first thing the report shows.


def findings_inputs(wildcards):
    inputs = {
        **{
            f"key_{t}": f"results/{wildcards.model}/key_components/{t}.parquet"
            for t in TASKS
        },
        **{
            f"knockout_{t}": f"results/{wildcards.model}/knockout/{t}.parquet"
            for t in TASKS
        },
    }
    if STUDY_ARMS:
        inputs["study"] = f"results/{wildcards.model}/finetune/study.parquet"
        inputs["comparisons"] = (
            f"results/{wildcards.model}/finetune/comparisons.parquet"
        )
    return inputs


rule findings:
    input:
        unpack(findings_inputs),
    output:
        html=report(
            "results/{model}/findings.html",
            caption="../report/findings.rst",
            category="0. Findings",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "findings"},
        ),
    log:
        "results/{model}/logs/findings.log",
    conda:
        "../../envs/arithmech.yaml"
    params:
        tasks=TASKS,
    script:
        "../scripts/findings.py"

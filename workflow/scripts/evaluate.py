from arithmech.stages import EVAL_DATASETS, job, run_evaluate

with job(snakemake):
    run_evaluate(
        snakemake.wildcards.model,
        snakemake.input.model,
        snakemake.wildcards.method,
        snakemake.input.get("trained"),
        {d: snakemake.input[d] for d in (*EVAL_DATASETS, "gsm8k_train")},
        snakemake.params.evaluation,
        snakemake.params.compute,
        snakemake.params.seed,
        {d: snakemake.output[d] for d in EVAL_DATASETS},
    )

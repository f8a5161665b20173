from arithmech.stages import job, run_finetune

with job(snakemake):
    run_finetune(
        snakemake.wildcards.model,
        snakemake.input.model,
        snakemake.wildcards.method,
        {t: snakemake.input[f"effects_{t}"] for t in snakemake.params.tasks if f"effects_{t}" in snakemake.input.keys()},
        snakemake.input.data,
        snakemake.params.finetune,
        snakemake.params.compute,
        snakemake.params.seed,
        snakemake.output[0],
        snakemake.params.checkpoints,
    )

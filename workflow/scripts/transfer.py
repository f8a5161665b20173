from arithmech.stages import job, run_transfer

with job(snakemake):
    run_transfer(
        snakemake.wildcards.model,
        snakemake.input.model,
        snakemake.params.tasks,
        snakemake.input.pairs,
        snakemake.input.caches,
        snakemake.input.key_tables,
        snakemake.input.svamp,
        snakemake.input.non_math,
        snakemake.params.transfer,
        snakemake.params.prompts,
        snakemake.params.compute,
        snakemake.params.seed,
        snakemake.output.table,
        snakemake.output.html,
        snakemake.output.heatmap,
    )

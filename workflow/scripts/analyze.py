from arithmech.stages import job, run_analyze

with job(snakemake):
    run_analyze(
        snakemake.wildcards.model,
        snakemake.wildcards.task,
        snakemake.input.model,
        snakemake.input.pairs,
        snakemake.input.key,
        snakemake.input.effects,
        snakemake.params.analysis,
        snakemake.params.compute,
        snakemake.params.seed,
        snakemake.output.roles,
        snakemake.output.probes,
        snakemake.output.roles_png,
        snakemake.output.example_png,
        snakemake.output.probes_png,
    )

from arithmech.jobs import job
from arithmech.stages.identify import run_build_pairs

with job(snakemake):
    run_build_pairs(
        model_dir=snakemake.input.model,
        task=snakemake.wildcards.task,
        prompts=snakemake.params.prompts,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_pairs=snakemake.output.pairs,
        out_dropped=snakemake.output.dropped,
    )

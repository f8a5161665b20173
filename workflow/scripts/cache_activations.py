from arithmech.jobs import job
from arithmech.stages.identify import run_cache_activations

with job(snakemake):
    run_cache_activations(
        model_dir=snakemake.input.model,
        pairs_path=snakemake.input.pairs,
        compute=snakemake.params.compute,
        out_path=snakemake.output[0],
    )

from arithmech.jobs import job
from arithmech.stages.identify import run_patch_layers

with job(snakemake):
    run_patch_layers(
        model_dir=snakemake.input.model,
        layers=[int(snakemake.wildcards.layer)],
        patching=snakemake.params.patching,
        compute=snakemake.params.compute,
        pairs_paths=list(snakemake.input.pairs),
        cache_paths=list(snakemake.input.cache),
        out_paths=list(snakemake.output),
    )

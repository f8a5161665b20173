from arithmech.jobs import job
from arithmech.stages.circuit import run_edges

with job(snakemake):
    run_edges(
        model=snakemake.wildcards.model,
        model_dir=snakemake.input.model,
        tasks=snakemake.params.tasks,
        pairs_paths=list(snakemake.input.pairs),
        key_paths=list(snakemake.input.key_tables),
        edges=snakemake.params.edges,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_paths=list(snakemake.output.paths),
    )

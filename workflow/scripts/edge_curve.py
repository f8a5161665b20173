from arithmech.jobs import job
from arithmech.stages.circuit import run_edge_curve

with job(snakemake):
    run_edge_curve(
        model=snakemake.wildcards.model,
        model_dir=snakemake.input.model,
        tasks=snakemake.params.tasks,
        pairs_paths=list(snakemake.input.pairs),
        effects_paths=list(snakemake.input.effects),
        key_paths=list(snakemake.input.key_tables),
        edges=snakemake.params.edges,
        discover=snakemake.params.discover,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_tables=list(snakemake.output.tables),
    )

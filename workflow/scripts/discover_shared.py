from arithmech.jobs import job
from arithmech.stages.discover import run_discover_shared

with job(snakemake):
    run_discover_shared(
        model=snakemake.wildcards.model,
        model_dir=snakemake.input.model,
        tasks=snakemake.params.tasks,
        pairs_paths=snakemake.input.pairs,
        discover=snakemake.params.discover,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_table=snakemake.output.table,
        out_validation=snakemake.output.validation,
        out_items=snakemake.output.per_item,
        out_summary=snakemake.output.summary,
    )

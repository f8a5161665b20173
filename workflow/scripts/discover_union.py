from arithmech.jobs import job
from arithmech.stages.discover import run_discover_union

with job(snakemake):
    run_discover_union(
        model=snakemake.wildcards.model,
        model_dir=snakemake.input.model,
        tasks=snakemake.params.tasks,
        pairs_paths=snakemake.input.pairs,
        key_paths=snakemake.input.key_tables,
        table_paths=snakemake.input.tables,
        validation_paths=snakemake.input.validation,
        items_paths=snakemake.input.per_item,
        shared_path=snakemake.input.shared,
        discover=snakemake.params.discover,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_validation=snakemake.output.validation,
        out_summary=snakemake.output.summary,
    )

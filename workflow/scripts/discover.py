from arithmech.jobs import job
from arithmech.stages.discover import run_discover

with job(snakemake):
    run_discover(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        model_dir=snakemake.input.model,
        pairs_path=snakemake.input.pairs,
        effects_path=snakemake.input.effects,
        key_path=snakemake.input.key,
        discover=snakemake.params.discover,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_table=snakemake.output.table,
        out_path=snakemake.output.path,
        out_validation=snakemake.output.validation,
        out_items=snakemake.output.per_item,
        out_added=snakemake.output.added,
    )

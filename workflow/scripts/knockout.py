from arithmech.jobs import job
from arithmech.stages.validate import run_knockout

with job(snakemake):
    run_knockout(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        model_dir=snakemake.input.model,
        pairs_path=snakemake.input.pairs,
        cache_path=snakemake.input.cache,
        effects_path=snakemake.input.effects,
        key_path=snakemake.input.key,
        ablation=snakemake.params.ablation,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_table=snakemake.output.table,
        out_items=snakemake.output.per_item,
    )

from arithmech.jobs import job
from arithmech.stages.validate import run_transfer

with job(snakemake):
    run_transfer(
        model=snakemake.wildcards.model,
        model_dir=snakemake.input.model,
        tasks=snakemake.params.tasks,
        pairs_paths=snakemake.input.pairs,
        cache_paths=snakemake.input.caches,
        key_paths=snakemake.input.key_tables,
        svamp_path=snakemake.input.svamp,
        non_math_path=snakemake.input.non_math,
        transfer=snakemake.params.transfer,
        prompts_cfg=snakemake.params.prompts,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_table=snakemake.output.table,
        out_items=snakemake.output.per_item,
    )

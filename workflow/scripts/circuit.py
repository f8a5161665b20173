from arithmech.jobs import job
from arithmech.stages.circuit import run_circuit

with job(snakemake):
    run_circuit(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        model_dir=snakemake.input.model,
        pairs_path=snakemake.input.pairs,
        cache_path=snakemake.input.cache,
        effects_path=snakemake.input.effects,
        key_path=snakemake.input.key,
        circuit=snakemake.params.circuit,
        prompts=snakemake.params.prompts,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_table=snakemake.output.table,
        out_items=snakemake.output.per_item,
    )

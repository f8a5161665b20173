from arithmech.jobs import job
from arithmech.stages.identify import run_aggregate_effects

with job(snakemake):
    run_aggregate_effects(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        layer_paths=list(snakemake.input.layers),
        pairs_path=snakemake.input.pairs,
        metric=snakemake.params.metric,
        key_rules=snakemake.params.key_rules,
        seed=snakemake.params.seed,
        out_effects=snakemake.output.effects,
        out_key=snakemake.output.key,
        out_key_html=snakemake.output.key_html,
    )

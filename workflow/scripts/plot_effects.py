from arithmech.jobs import job
from arithmech.stages.identify import run_plot_effects

with job(snakemake):
    run_plot_effects(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        metric=snakemake.params.metric,
        effects_path=snakemake.input.effects,
        key_path=snakemake.input.key,
        out_png=snakemake.output[0],
    )

from arithmech.jobs import job
from arithmech.stages.validate import run_plot_knockout

with job(snakemake):
    run_plot_knockout(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        knockout_path=snakemake.input.table,
        key_path=snakemake.input.key,
        out_png=snakemake.output[0],
    )

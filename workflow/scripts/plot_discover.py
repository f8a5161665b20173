from arithmech.jobs import job
from arithmech.stages.discover import run_plot_discover

with job(snakemake):
    run_plot_discover(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        path_path=snakemake.input.path,
        validation_path=snakemake.input.validation,
        key_path=snakemake.input.key,
        out_path_png=snakemake.output.path,
        out_grid_png=snakemake.output.grid,
    )

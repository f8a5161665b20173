from arithmech.jobs import job
from arithmech.stages.circuit import run_plot_edge_curve

with job(snakemake):
    run_plot_edge_curve(
        model=snakemake.wildcards.model,
        table_paths=list(snakemake.input.tables),
        out_png=snakemake.output.figure,
    )

from arithmech.jobs import job
from arithmech.stages.validate import run_plot_transfer

with job(snakemake):
    run_plot_transfer(
        model=snakemake.wildcards.model,
        transfer_path=snakemake.input[0],
        out_html=snakemake.output.html,
        out_png=snakemake.output.heatmap,
    )

from arithmech.jobs import job
from arithmech.stages.circuit import run_plot_circuit

with job(snakemake):
    run_plot_circuit(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        table_path=snakemake.input.table,
        edges_path=snakemake.input.edges,
        levels=snakemake.params.levels,
        out_curve=snakemake.output.curve,
        out_graph=snakemake.output.graph,
        out_heatmap=snakemake.output.heatmap,
    )

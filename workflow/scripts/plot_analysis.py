from arithmech.jobs import job
from arithmech.stages.analyze import run_plot_analysis

with job(snakemake):
    run_plot_analysis(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        roles_path=snakemake.input.roles,
        example_path=snakemake.input.example,
        probes_path=snakemake.input.probes,
        out_roles_png=snakemake.output.roles_png,
        out_example_png=snakemake.output.example_png,
        out_probes_png=snakemake.output.probes_png,
    )

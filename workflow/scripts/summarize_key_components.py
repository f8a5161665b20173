from arithmech.jobs import job
from arithmech.stages.identify import run_summarize_key_components

with job(snakemake):
    run_summarize_key_components(
        model=snakemake.wildcards.model,
        tasks=list(snakemake.params.tasks),
        effects_paths=list(snakemake.input.effects),
        key_paths=list(snakemake.input.key),
        out_table=snakemake.output.table,
        out_html=snakemake.output.table_html,
        out_png=snakemake.output.heatmap,
    )

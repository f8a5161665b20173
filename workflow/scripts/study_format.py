from arithmech.jobs import job
from arithmech.stages.study import run_study_format

with job(snakemake):
    run_study_format(
        model_dir=snakemake.input.model,
        pairs_paths=dict(zip(snakemake.params.tasks, snakemake.input.pairs)),
        study=snakemake.params.study,
        prompts=snakemake.params.prompts,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_table=snakemake.output.table,
    )

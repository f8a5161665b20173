from arithmech.jobs import job
from arithmech.stages.study import run_study_items

with job(snakemake):
    run_study_items(
        model_dir=snakemake.input.model,
        pairs_paths=dict(zip(snakemake.params.tasks, snakemake.input.pairs)),
        study=snakemake.params.study,
        prompts=snakemake.params.prompts,
        seed=snakemake.params.seed,
        out_items=snakemake.output[0],
    )

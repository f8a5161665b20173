from arithmech.jobs import job
from arithmech.stages.study import run_study_select

with job(snakemake):
    run_study_select(
        arm=snakemake.wildcards.arm,
        study={"lr_grid": {snakemake.wildcards.arm: snakemake.params.lr_grid}, "collapse": snakemake.params.collapse},
        run_dirs=dict(zip(snakemake.params.runs, snakemake.input.runs)),
        out_path=snakemake.output[0],
    )
